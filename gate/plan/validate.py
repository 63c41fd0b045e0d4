"""`gate validate` as a function: policy file -> typed Plan, without loading model weights.

Everything that can be told from the policy, the model configs, the tokenizers and the
prompt source is checked here, once; `gate check` consumes the Plan (the workload is built
here and nowhere else). Every problem is bad input: an InputError naming the file, the YAML
path and the line (exit code 2).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from gate.core.errors import PolicyValueError
from gate.drafts import registry as draft_kinds
from gate.models.loading import (
    ModelSource,
    check_tokenizers,
    load_tokenizer,
    read_config,
    resolve_device,
    resolve_source,
)
from gate.plan.matrix import Plan, build_workload, laws_of, plan_exactness, workload_source
from gate.policy.baseline import load_baseline, load_release
from gate.policy.reader import LoadedPolicy, load_policy
from gate.rules.kinds import registry as rule_kinds
from gate.rules.power import underpowered
from gate.rules.scope import declared_load_points, inapplicable_points, not_applicable_reason
from gate.runners.registry import runner_class


def validate(path: str | Path) -> Plan:
    """Validate a policy without loading model weights: schema, units, names, that every
    model source and the prompt source can be found, that a separate draft model's tokenizer
    matches the target's, that the workload fits the target (positions, sliding window,
    early-exit depth), and read the baseline report when the policy names one. Returns the
    Plan gate check runs. Raises InputError (file, YAML path, line)."""
    loaded = load_policy(path)
    policy = loaded.policy
    try:
        if not policy.drafts:
            raise PolicyValueError(
                "drafts",
                "the policy names no draft; gate check needs at least one (a policy for "
                "gate exactness on recorded samples needs only a target and exactness rules)",
            )
        resolve_device(policy.target.device, "target.device")
        target = resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
        separate = {
            ref.yaml_path: resolve_source(ref.model, ref.gguf_file, loaded.path.parent, ref.yaml_path)
            for name, draft in policy.drafts.items()
            for ref in draft_kinds.tokenizer_sources(name, draft)
        }
        tokenizer = _tokenizer(target, "target.model")
        for at, source in separate.items():
            check_tokenizers(tokenizer, _tokenizer(source, at), at)
        if policy.target.release is not None and policy.target.release.model is not None:
            at = "target.release.model"  # the probe and drift compare the two laws id by id
            release_source = resolve_source(
                policy.target.release.model, policy.target.release.gguf_file, loaded.path.parent, at
            )
            check_tokenizers(
                tokenizer,
                _tokenizer(release_source, at),
                at,
                "release",
                "; the probe and drift compare the release's law with the target's id by id, so a release "
                "must share the target's tokenizer",
            )
        for name, draft in policy.drafts.items():  # drafts with their own tokenizer (cross_tokenizer): it must load
            draft_kinds.check_tokenizer(name, draft, tokenizer, loaded.path.parent)
        config = read_config(target, "target.model")
        _check_config(loaded, config)
        workload = build_workload(
            loaded,
            workload_source(loaded),
            tokenizer,
            config,
            check_categories=lambda known: _check_categories(policy, known),
        )
        weak = underpowered(policy, [p.category for p in workload.questions], _budget_scale(policy, workload.prompts))
        loaded.warnings.extend(loaded.source.problem(w.path, w.message) for w in weak)
        loaded.warnings.extend(loaded.source.problem(at, message) for at, message in load_gaps(policy))
        loaded.warnings.extend(
            loaded.source.problem(at, message) for at, message in policy.runner.policy_warnings(policy)
        )
        loaded.warnings.extend(loaded.source.problem(at, message) for at, message in _threads_warnings(policy))
        loaded.warnings.extend(
            loaded.source.problem(at, message) for at, message in _budget_warnings(policy, workload.prompts)
        )
        _check_positions(policy, config, max(len(p.token_ids) for p in workload.prompts))
        vocab_size = int(getattr(config, "vocab_size", None) or len(tokenizer))
        _check_logit_bias(policy, vocab_size)
        _check_constraints(policy, workload, tokenizer, vocab_size)
        release = load_release(loaded)  # a missing report, or one without a probe, is bad input
    except PolicyValueError as e:
        raise loaded.error(e) from None
    exactness = plan_exactness(
        policy.rules, policy.declared_drafts, [law.label for law in policy.laws], policy.measurement.budget.samples
    )
    baseline = load_baseline(loaded)  # a missing or unreadable baseline report is bad input too
    plan = Plan(loaded, target, workload, laws_of(policy), exactness, baseline, tokenizer, release)
    try:  # what the runner needs that can be told without starting it (gate.runners: each kind says)
        runner_class(policy.runner.kind).check_plan(plan)
    except PolicyValueError as e:
        raise loaded.error(e) from None
    return plan


def load_gaps(policy: Any) -> list[tuple[str, str]]:
    """(YAML path, warning) for every metric rule whose `per:` (concurrency or request_rate)
    cannot apply to some declared load points in its scope: per: concurrency at request
    rates (an open loop has no fixed concurrency), per: request_rate at concurrencies (a
    closed loop offers no rate). Those points get a skipped outcome saying so, never a
    verdict; the warning says it before anything runs."""
    declared = declared_load_points(policy)
    out: list[tuple[str, str]] = []
    for i, rule in enumerate(policy.rules):
        if not rule_kinds.reads_metric(rule) or not declared:
            continue
        gap = inapplicable_points(rule.per, rule.scope.concurrency, rule.scope.request_rate, declared)
        if gap is None:
            continue
        axis, points = gap
        shown = ", ".join(f"{v:g}" for v in points)
        out.append(
            (
                f"rules[{i}].per",
                f"rule {rule.id!r}: per: {rule.per} gives no verdict at load.{axis} {shown}: "
                f"{not_applicable_reason(axis)}; those points are reported as not evaluated (add a rule "
                f"with per: {axis} to decide them, or list this rule's points in scope.{rule.per})",
            )
        )
    return out


def _check_categories(policy: Any, known: list[str]) -> None:
    """Every category a rule scope or the workload names must exist in the prompt source."""
    named = [("workload.categories", j, c) for j, c in enumerate(policy.workload.categories or [])]
    named += [
        (f"rules[{i}].scope.categories", j, c)
        for i, r in enumerate(policy.rules)
        for j, c in enumerate(r.scope.categories or [])
    ]
    for path, j, c in named:
        if c not in known:
            close = difflib.get_close_matches(c, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PolicyValueError(
                f"{path}[{j}]", f"the prompt source has no category {c!r}{hint}; its categories: {', '.join(known)}"
            )


def _check_logit_bias(policy: Any, vocab_size: int) -> None:
    """Every biased token id must be a row of the target's logits (ids 0..vocab_size - 1).
    Raises PolicyValueError at law[i].logit_bias.<id>."""
    at = "law" if not isinstance(policy.law, list) else "law[{}]"
    for i, law in enumerate(policy.laws):
        for token in law.logit_bias:
            if token >= vocab_size:
                raise PolicyValueError(
                    f"{at.format(i)}.logit_bias.{token}",
                    f"token id {token} is outside the target's "
                    f"vocabulary (ids 0 to {vocab_size - 1}, config vocab_size)",
                )


def _check_constraints(policy: Any, workload: Any, tokenizer: Any, vocab_size: int) -> None:
    """Every distinct response format the plan runs (workload.constraints entries and the
    prompts' own response_format) must compile with the grammar engine against the target's
    tokenizer. Raises PolicyValueError at workload.constraints[i], or at workload.path naming
    the prompt file and line, with the engine's message. A 'prompt' entry where no selected
    prompt has a response_format of its own is refused too: its label would call
    unconstrained requests constrained."""
    for i, entry in enumerate(policy.workload.constraints or []):
        if entry == "prompt" and not any(
            p.response_format is not None for p in workload.prompts if p.constraint == "prompt"
        ):
            raise PolicyValueError(
                f"workload.constraints[{i}]",
                "'prompt' runs each prompt under its own response_format, "
                "but no selected prompt has one (a JSONL line's response_format): these requests would "
                "run unconstrained under the label 'prompt'; give the lines a response_format, or list "
                "a format here ({name, type, schema | pattern | choices})",
            )
    formats = {p.response_format for p in workload.prompts if p.response_format is not None}
    if not formats:
        return
    from gate.constraints import grammar_engine
    from gate.constraints.interface import ResponseFormat

    try:
        engine = grammar_engine(tokenizer, vocab_size)
        engine.check(
            ResponseFormat("regex", "a")
        )  # the engine reads the tokenizer on first use: fail here, not per format
    except Exception as e:  # noqa: BLE001 - a tokenizer the engine cannot use is bad input for constraints
        raise PolicyValueError(
            "workload.constraints" if policy.workload.constraints else "workload.path",
            f"the grammar engine cannot use the target's tokenizer: {type(e).__name__}: {e}",
        ) from None
    entries: dict[str, str] = {}  # format -> the YAML path of the first workload.constraints entry that declares it
    for i, entry in enumerate(policy.workload.constraints or []):
        if not isinstance(entry, str):
            entries.setdefault(_entry_format(entry, workload), f"workload.constraints[{i}]")
    checked: set[Any] = set()
    for p in workload.prompts:
        fmt = p.response_format
        if fmt is None or fmt in checked:
            continue
        checked.add(fmt)
        try:
            error = engine.check(fmt)
        except Exception as e:  # noqa: BLE001 - the engine's own failure on a format is its verdict on it
            error = f"{type(e).__name__}: {e}"
        if not error:
            continue
        if fmt in entries:
            raise PolicyValueError(
                entries[fmt], f"the grammar engine ({engine.name}) cannot compile this {fmt.kind} constraint: {error}"
            )
        question = next((q for q in workload.questions if q.response_format == fmt), None)
        origin = workload.source.origin(question.id) if question is not None and workload.source is not None else None
        where = origin or (f"prompt {question.id!r}" if question is not None else "a prompt")
        raise PolicyValueError(
            "workload.path",
            f"{where}: response_format: the grammar engine ({engine.name}) cannot compile this {fmt.kind}: {error}",
        )


def _entry_format(entry: Any, workload: Any) -> Any:
    """The ResponseFormat the prompts planned for a workload.constraints mapping carry."""
    return next((p.response_format for p in workload.prompts if p.constraint == entry.name), None)


def _check_config(loaded: LoadedPolicy, config: Any) -> None:
    """What the target's config decides before any prompt is built: early-exit depth and
    whether the bill's context fits its positions."""
    policy = loaded.policy
    limit = getattr(config, "max_position_embeddings", None) or 10**12
    for name, d in policy.drafts.items():
        refused = draft_kinds.get(d.kind).not_in_process(name, d) if policy.runner.runs_models_here else None
        if refused is not None:
            raise PolicyValueError(*refused)
        draft_kinds.check_target_config(name, d, config)
        draft_kinds.check_files(name, d, loaded.path.parent, config)
    if policy.resources.context_tokens and policy.resources.context_tokens > limit:
        raise PolicyValueError(
            "resources.context_tokens",
            f"{policy.resources.context_tokens} tokens exceed the target's {limit} positions (max_position_embeddings)",
        )


def _check_positions(policy: Any, config: Any, longest: int) -> None:
    """The longest prompt plus max_new_tokens must fit the target's positions. (A sliding
    window bounds nothing: gate's loop rolls sliding-window layers back past their window,
    gate.models.cache.record_past.)"""
    limit = getattr(config, "max_position_embeddings", None) or 10**12
    need = longest + max(policy.workload.max_new_tokens_list)
    if need > limit:
        raise PolicyValueError(
            "workload.max_new_tokens",
            f"the longest prompt ({longest} tokens) plus max_new_tokens needs "
            f"{need} positions; the target has {limit} (max_position_embeddings)",
        )


def _tokenizer(source: ModelSource, yaml_path: str) -> Any:
    from gate.models.loading import MissingTokenizer

    try:
        return load_tokenizer(source)
    except MissingTokenizer as e:
        raise PolicyValueError(yaml_path, str(e)) from None
    except Exception as e:  # noqa: BLE001 - a tokenizer that cannot be read is bad input
        raise PolicyValueError(yaml_path, f"cannot load the tokenizer of {source}: {type(e).__name__}: {e}") from None


def _looks(policy: Any, prompts: list[Any]) -> Any:
    """The looks a sequential run of `policy` takes over `prompts` (gate.records.LooksRecord,
    from gate.plan.rounds.plan_rounds), as the loop will plan them."""
    from gate.plan.rounds import plan_rounds

    ms = policy.measurement
    windows = not policy.runner.runs_models_here
    lengths = len(policy.workload.max_new_tokens_list)
    return plan_rounds(prompts, lengths, ms.repetitions, ms.budget.requests, windows, policy.workload.seed).looks


def _budget_scale(policy: Any, prompts: list[Any]) -> float | None:
    """A sequential run's most units per runner and law over its fixed plan's (the budget's
    last look); None for a fixed plan (sequential: false)."""
    if not policy.measurement.sequential:
        return None
    looks = _looks(policy, prompts)
    return float(looks.schedule[-1] / looks.fixed_plan)


def _budget_warnings(policy: Any, prompts: list[Any]) -> list[tuple[str, str]]:
    """(YAML path, warning) for a sequential run's measurement.budget.requests below its fixed
    plan (verdicts are decided on at most the budget; an exactness rule's cells stop there too)
    or below its first look (which is measured whole: the budget is exceeded), and for one
    given to a fixed plan (sequential: false), where it sets nothing."""
    ms = policy.measurement
    budget = ms.budget.requests
    if not ms.sequential and "requests" in ms.budget.model_fields_set:
        return [
            (
                "measurement.budget.requests",
                "sequential: false measures the fixed plan (measurement.repetitions): the budget sets nothing",
            )
        ]
    if not ms.sequential or not isinstance(budget, int):
        return []
    looks = _looks(policy, prompts)
    per = looks.requests_per_unit
    first, fixed = looks.schedule[0] * per, looks.fixed_plan * per
    if budget < first:
        return [
            (
                "measurement.budget.requests",
                f"{budget} is below the first look's {first} timed requests per runner, law and load point: the "
                f"first look is measured whole, so the budget is exceeded (the fixed plan is {fixed})",
            )
        ]
    if budget < fixed:
        return [
            (
                "measurement.budget.requests",
                f"{budget} is below the fixed plan's {fixed} timed requests per runner, law and load point: "
                "verdicts are decided on at most the budget, and an exactness rule's cells, held to the plan "
                "otherwise, stop there too",
            )
        ]
    return []


def _threads_warnings(policy: Any) -> list[tuple[str, str]]:
    """(YAML path, warning) for a fixed measurement.threads that sets nothing (a served runner
    computes in its servers) or oversubscribes the CPUs this process may use."""
    from gate.measure.environment import cpu_count

    threads, cpus = policy.measurement.threads, cpu_count()
    if not isinstance(threads, int):
        return []
    if not policy.runner.runs_models_here:
        return [
            ("measurement.threads", f"runner.kind {policy.runner.kind} computes in its servers: threads sets nothing")
        ]
    if cpus and threads > cpus:
        return [
            (
                "measurement.threads",
                f"{threads} compute threads on {cpus} CPUs oversubscribe them (beside one busy neighbour 2 threads "
                "on 2 CPUs ran at 0.29x of quiet, 1 at 0.64x: benchmarks/threads.py); auto fits them",
            )
        ]
    return []
