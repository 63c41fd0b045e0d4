"""`gate exactness`: test recorded samples from any engine (a served endpoint's outputs, say)
against the target's declared law, with the same statistics and reports as `gate check`.

Input: JSONL, one generated sequence a line (schema: schemas/samples.schema.json):

    {"prompt_ids": [1, 2, 3], "output_ids": [7, 8], "law": {"temperature": 0.7, "top_k": 50}}

Optional keys: "id", "source" (which engine or draft produced it; default "samples") and
"response_format" (the structured output the engine enforced: the grammar masks the
target's law, as in gate check). The law's penalties count each line's own prompt and output.
Lines with the same source, prompt_ids, law and response_format (at least MIN_NEXT_TOKEN_GROUP of them) also
feed the next-token test at their first output position (a claim test: what a pass rests
on) and, where many of them share an output prefix, next-token tests after it (evidence).
Samples of a served engine (`gate exactness --served SOURCE`) are tested as gate check tests
a served run: the first output position is the prefill's, claims rest on later positions,
and SOURCE's lines (speculation off) are the reference.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from gate.commands.check import CheckResult, Options, finish
from gate.constraints import grammar_engine
from gate.constraints.interface import parse_response_format
from gate.core.errors import InputError, PolicyValueError, Problem
from gate.core.law import Law, law_logits, law_probs
from gate.exactness.collect import contexts, greedy_divergences, randomized_pit, sparse_counts
from gate.loop.session import open_target
from gate.measure.environment import environment
from gate.plan.matrix import law_of
from gate.policy.model import FieldError, LawSpec
from gate.policy.reader import load_policy
from gate.records import RECORDED_SAMPLES, DraftInfo, ExactnessRecord, Failure, FailureStage, Measurements

MIN_NEXT_TOKEN_GROUP = 20


class SampleLine(BaseModel):
    """One generated sequence: prompt and output token ids and the law it was sampled under."""

    model_config = ConfigDict(extra="forbid")

    prompt_ids: list[StrictInt] = Field(
        ..., min_length=1, description="Token ids the engine was given (chat template applied)."
    )
    output_ids: list[StrictInt] = Field(..., min_length=1, description="Token ids it generated, in order.")
    law: LawSpec = Field(..., description="The declared law the output was sampled under (temperature 0: greedy).")
    response_format: dict[str, Any] | None = Field(
        None,
        description="The structured output the engine enforced, as OpenAI and vLLM take it: {type: json_schema, "
        "schema} (or OpenAI's {type: json_schema, json_schema: {name, schema}}), {type: regex, pattern} or {type: "
        "choice, "
        "choices}; the grammar masks the target's law as the verifier's (gate.core.law).",
    )
    id: str | None = None
    source: str = Field(
        "samples", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", description="The engine or draft that produced it."
    )


def samples_schema() -> dict[str, Any]:
    """JSON Schema of one line of a samples file."""
    schema = SampleLine.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gate samples line"
    return schema


def read_samples(path: Path, vocab_size: int) -> list[SampleLine]:
    """Parse and check a samples file. Raises InputError naming the file and line for
    malformed JSON, wrong keys or types, a law the target cannot express, token ids outside
    the target's vocabulary, or an empty file."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError([Problem(name, "", None, "samples file not found")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError([Problem(name, "", None, f"cannot read samples file: {e}")]) from None
    out: list[SampleLine] = []
    problems: list[Problem] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = SampleLine.model_validate(json.loads(raw))
        except json.JSONDecodeError as e:
            problems.append(Problem(name, "(line)", n, f"not valid JSON: {e.msg}"))
            continue
        except ValidationError as e:
            for err in e.errors()[:3]:
                where = ".".join(str(x) for x in err["loc"])
                cause = (err.get("ctx") or {}).get("error")
                if isinstance(cause, FieldError):  # a check about one field of the mapping: name that field
                    where = f"{where}.{cause.field}" if where else cause.field
                msg = err["msg"].removeprefix("Value error, ")
                if err["type"] == "string_pattern_mismatch":
                    msg = "use letters, digits, '_', '.' and '-', starting with a letter or digit"
                problems.append(Problem(name, where or "(line)", n, msg))
            continue
        if line.response_format is not None:
            try:
                parse_response_format(line.response_format)
            except ValueError as e:
                problems.append(Problem(name, "response_format", n, str(e)))
                continue
        biased = [t for t in line.law.logit_bias if not 0 <= t < vocab_size]
        if biased:
            problems.append(
                Problem(
                    name,
                    f"law.logit_bias.{biased[0]}",
                    n,
                    f"token id {biased[0]} is outside the target's "
                    f"vocabulary (0..{vocab_size - 1}): a bias on it is no law the target can express",
                )
            )
            continue
        bad = [t for t in line.prompt_ids + line.output_ids if not 0 <= t < vocab_size]
        if bad:
            problems.append(
                Problem(
                    name,
                    "output_ids" if bad[0] in line.output_ids else "prompt_ids",
                    n,
                    f"token id {bad[0]} is outside the target's vocabulary (0..{vocab_size - 1}); "
                    "were these samples made with another tokenizer?",
                )
            )
            continue
        out.append(line)
    if problems:
        raise InputError(problems[:20])
    if not out:
        raise InputError([Problem(name, "", None, "the samples file holds no sample")])
    return out


def _grammar_engine(loaded: Any, target: Any, formats: list[Any], samples_path: str) -> Any:
    """The grammar engine over the target's tokenizer when a line has a response format (the
    tokenizer is loaded for it only), else None. Raises InputError naming the first line of
    each format the engine cannot compile."""
    if not any(formats):
        return None
    from gate.models import loading as models

    source = models.resolve_source(
        loaded.policy.target.model, loaded.policy.target.gguf_file, loaded.path.parent, "target.model"
    )
    tokenizer = models.load_tokenizer(source)
    eos = set(target.eos_token_ids) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    engine = grammar_engine(tokenizer, target.oracle.vocab_size, eos)
    problems, seen = [], set()
    for n, fmt in enumerate(formats, start=1):
        if fmt is None or fmt in seen:
            continue
        seen.add(fmt)
        error = engine.check(fmt)
        if error:
            problems.append(
                Problem(
                    samples_path, "response_format", n, f"the grammar engine cannot compile this {fmt.kind}: {error}"
                )
            )
    if problems:
        raise InputError(problems[:20])
    return engine


@torch.inference_mode()
def check_samples(
    policy_path: str | Path, samples_path: str | Path, seed: int = 0, served_reference: str | None = None
) -> CheckResult:
    """Evaluate the policy's exactness rules (or a default one) on recorded samples.

    Greedy samples: every output token must be the target's argmax given the prefix; a
    divergence within the rule's tie tolerance is a near-tie. Sampling: PIT over every token
    and next-token tests over repeated prompts, Holm-corrected, with stated power. With
    `served_reference` (a source name) the sampled lines come from a served engine whose
    first output token is the prefill's: they are tested as gate check tests a served run
    (gate.exactness.sampled.runner_record), the reference source's lines being the fallback
    runner's. Raises InputError when that source has no sampled line."""
    loaded = load_policy(
        policy_path
    )  # only the target and the exactness rules are used: no draft, workload or tokenizer
    try:
        target = open_target(loaded, tokenizer=False)
    except PolicyValueError as e:
        raise loaded.error(e) from None
    lines = read_samples(Path(samples_path), target.oracle.vocab_size)
    formats = [None if line.response_format is None else parse_response_format(line.response_format) for line in lines]
    engine = _grammar_engine(loaded, target, formats, str(samples_path))
    target.oracle.grammars = engine  # every law below is bound through the oracle (TargetOracle.bind)
    if served_reference is not None:
        return _served_samples(loaded, target, lines, formats, served_reference, str(samples_path), seed)
    m = Measurements(environment=environment(target.device, seed))
    m.environment.models = [target.info]
    laws: dict[str, Law] = {}
    records: dict[tuple[str, str], ExactnessRecord] = {}
    groups: dict[tuple[str, str, tuple[Any, ...]], list[int]] = defaultdict(
        list
    )  # line indices sampled alike (prompt, format)
    for i, line in enumerate(lines):
        law = law_of(line.law)
        if laws.get(law.name, law) != law:
            raise InputError(
                [
                    Problem(
                        str(samples_path),
                        "law.name",
                        i + 1,
                        f"law name {law.name!r} was used on an earlier line "
                        "with other settings; give each law a distinct name",
                    )
                ]
            )
        laws[law.name] = law
        records.setdefault((line.source, law.name), ExactnessRecord(line.source, law.name, law.greedy))
        if not law.greedy:
            groups[(line.source, law.name, (tuple(line.prompt_ids), formats[i]))].append(i)
    # The contexts worth a next-token test in every group (first position, shared prefixes),
    # their target laws filled from the teacher-forced forward of the first line through them.
    tested = {
        key: contexts([lines[i].output_ids for i in idx], min_first=MIN_NEXT_TOKEN_GROUP) for key, idx in groups.items()
    }
    # (source, law, (prompt ids, format), output prefix) -> the target's law after that prefix
    context_laws: dict[tuple[str, str, tuple[Any, ...], tuple[int, ...]], torch.Tensor] = {}
    wanted = {(key, prefix) for key, found in tested.items() for prefix, _ in found}
    pit_generator = torch.Generator().manual_seed(seed)
    for i, line in enumerate(lines):
        law = laws[line.law.label]
        rec = records[(line.source, law.name)]
        ident = line.id or f"line-{i + 1}"
        try:
            ids = line.prompt_ids + line.output_ids
            logits = target.oracle.target_logits(ids, len(line.prompt_ids)).float()
            # penalties count the line's own prompt and output; its grammar masks every position
            bound = target.oracle.bind(law, len(line.prompt_ids), formats[i])
            if law.greedy:
                rec.compared += 1
                rec.divergences += greedy_divergences(
                    law_logits(logits, bound, ids, len(line.prompt_ids)), line.output_ids, ident
                )
                continue
            probs = law_probs(logits, bound, ids, len(line.prompt_ids)).cpu()
            u = randomized_pit(probs, torch.tensor(line.output_ids), pit_generator)
            rec.pit += [None if v != v else float(v) for v in u.tolist()]
            key = (line.source, law.name, (tuple(line.prompt_ids), formats[i]))
            for j in range(len(line.output_ids)):
                prefix = tuple(line.output_ids[:j])
                at = (key[0], key[1], key[2], prefix)
                if (key, prefix) in wanted and at not in context_laws:
                    context_laws[at] = probs[j]
        except Exception as e:  # noqa: BLE001 - recorded; its rules become errors
            m.failures.append(Failure(FailureStage.EXACTNESS, line.source, law.name, ident, f"{type(e).__name__}: {e}"))
    prompt_names: dict[tuple[str, str], int] = defaultdict(int)
    for key, found in tested.items():
        source, law_name, _ = key
        rec = records[(source, law_name)]
        prompt_names[(source, law_name)] += 1
        name = f"prompt-{prompt_names[(source, law_name)]}"
        for prefix, tokens in found:
            at = (key[0], key[1], key[2], prefix)
            if at in context_laws:  # else the lines through it failed (recorded above)
                rec.next_token.append(sparse_counts(name, tokens, context_laws[at], prefix=prefix))
    m.exactness = list(records.values())
    m.laws = list(laws)
    m.drafts = {src: DraftInfo(RECORDED_SAMPLES) for src, _ in records}
    return _finish_samples(loaded, m)


@torch.inference_mode()
def _served_samples(
    loaded: Any,
    target: Any,
    lines: list[SampleLine],
    formats: list[Any],
    reference: str,
    samples_path: str,
    seed: int,
) -> CheckResult:
    """check_samples for samples of a served engine: every sampled line grouped by source, law
    and prompt (ids and format), the `reference` source standing for the fallback runner."""
    from gate.exactness.sampled import runner_record
    from gate.records import FALLBACK

    sampled = [i for i, line in enumerate(lines) if not law_of(line.law).greedy]
    if not any(lines[i].source == reference for i in sampled):
        raise InputError(
            [
                Problem(
                    samples_path,
                    "source",
                    None,
                    f"no sampled line has source {reference!r}, the reference "
                    f"named by --served (sources: {', '.join(sorted({x.source for x in lines}))})",
                )
            ]
        )
    m = Measurements(environment=environment(target.device, seed))
    m.environment.models = [target.info]
    laws = {law_of(lines[i].law).name: law_of(lines[i].law) for i in sampled}
    prompts: dict[tuple[Any, ...], str] = {}
    outputs: dict[tuple[str, str], dict[str, list[list[int]]]] = defaultdict(lambda: defaultdict(list))
    for i in sampled:
        line = lines[i]
        key = (tuple(line.prompt_ids), formats[i])
        pid = prompts.setdefault(key, f"prompt-{len(prompts) + 1}")
        outputs[(line.source, law_of(line.law).name)][pid].append(line.output_ids)
    by_id = {pid: key for key, pid in prompts.items()}
    for (source, law_name), outs in sorted(outputs.items()):
        law = laws[law_name]

        def target_law(pid: str, prefix: tuple[int, ...], law: Law = law) -> torch.Tensor:
            ids, fmt = list(by_id[pid][0]), by_id[pid][1]
            probs: torch.Tensor = target.oracle.next_token_law(ids, prefix, law, fmt)
            return probs.cpu()

        ref = dict(outputs.get((reference, law_name), {}))
        name = FALLBACK if source == reference else source
        m.exactness.append(runner_record(name, law_name, dict(outs), None if source == reference else ref, target_law))
    m.laws = list(laws)
    m.drafts = {src: DraftInfo(RECORDED_SAMPLES) for src, _ in outputs if src != reference}
    return _finish_samples(loaded, m)


def _finish_samples(loaded, m: Measurements) -> CheckResult:  # type: ignore[no-untyped-def]
    from gate.policy.model import RuleSpec
    from gate.rules.kinds import exactness
    from gate.rules.kinds import registry as rule_kinds

    rules = [r for r in loaded.policy.rules if rule_kinds.needs_exactness(r)] or [
        RuleSpec(id="exactness", kind=exactness.KIND.name)
    ]
    # The samples name their own sources: scope by law only.
    rules = [r.model_copy(update={"scope": r.scope.model_copy(update={"drafts": None})}) for r in rules]
    return finish(loaded, m, Options(), [], rules=rules)
