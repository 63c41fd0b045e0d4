"""Policy -> plan: the matrix of (runner x law x load point x max_new_tokens x prompt x
repetition) to run, and its run order as blocks (plan_blocks).

gate's own loop interleaves requests by default (measurement.interleave): for every
(repetition, law, max_new_tokens, prompt) the fallback runs first, then every draft in
policy order, so slow drift of the machine hits all alike and each draft request has a
paired fallback request run moments before it. The fallback runs first because its
continuation is the one overlap is measured along. Without interleaving each runner's
requests form one block. Runners at load points run one runner's window at a time, per law,
load point and repetition, in rotated order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gate.constraints.interface import ResponseFormat
from gate.core.errors import PolicyValueError
from gate.core.law import Law
from gate.core.requests import PlannedPrompt, Request, request_seed
from gate.load.interface import LoadStrategy
from gate.records import FALLBACK, WorkloadInfo
from gate.workloads.context import ContextBuilder, ContextError, Encode, check_fits
from gate.workloads.interface import Prompt, WorkloadSource, choose


def plan_requests(
    drafts: list[str],
    laws: list[Law],
    prompts: list[PlannedPrompt],
    max_new_tokens: list[int],
    repetitions: range | int,
    seed: int,
    interleave: bool = True,
) -> list[Request]:
    """Every request in run order (see the module docstring for the interleaving).
    `repetitions`: a count, or the range of repetition indices to run (extra repetitions)."""
    reps = range(repetitions) if isinstance(repetitions, int) else repetitions
    out: list[Request] = []
    for rep in reps:
        for law in laws:
            for mnt in max_new_tokens:
                for prompt in prompts:
                    s = request_seed(seed, prompt.id, law.name, mnt, rep)
                    for runner in [FALLBACK, *drafts]:
                        out.append(Request(runner, law, prompt, mnt, rep, s))
    if not interleave:
        order = {name: i for i, name in enumerate([FALLBACK, *drafts])}
        out.sort(key=lambda r: order[r.draft])  # stable: each runner's block keeps the cell order
    return out


@dataclass
class Block:
    """A stretch of a run measured as one (gate.loop.run.Loop): `runners` (one runner, or the
    fallback and every draft interleaved cell by cell), its load point, its `units` (the
    requests run back to back and rerun together when contended: a cell, a request, or a
    whole window) and `repetition`, the repetition its windows are (None: a runner's window
    spans every repetition, as for gate's in-process loop)."""

    runners: list[str]
    load: LoadStrategy
    units: list[list[Request]]
    repetition: int | None = None

    @property
    def requests(self) -> list[Request]:
        return [r for unit in self.units for r in unit]


def window_requests(
    name: str, law: Law, prompts: list[PlannedPrompt], max_new_tokens: list[int], rep: int, seed: int
) -> list[Request]:
    """One runner's window under `law` in repetition `rep`: every length x prompt once, each
    with its cell's seed (gate.core.requests.request_seed)."""
    return [
        Request(name, law, p, mnt, rep, request_seed(seed, p.id, law.name, mnt, rep))
        for mnt in max_new_tokens
        for p in prompts
    ]


def plan_blocks(
    drafts: list[str],
    laws: list[Law],
    prompts: list[PlannedPrompt],
    max_new_tokens: list[int],
    repetitions: range,
    seed: int,
    points: list[LoadStrategy] | None,
    interleave: bool,
    slow_switch: bool = False,
) -> list[Block]:
    """The run order of the requests, as blocks.

    At load points (`points`, a runner with load points): for each law, load point and
    repetition, each runner's window in turn, the order rotated by (load point index +
    repetition) so slow drift of the machine does not always favour the same runner; a
    window is rerun whole. With `slow_switch` (a runner whose server takes long to start):
    for each law and repetition, each runner in turn (rotated by the repetition) runs its
    windows at every load point (their order rotated by the repetition too), so a server
    starts once per runner and repetition. Without (`points` None, gate's own loop: one request at a time):
    plan_requests' order; `interleave` gives one block of cells (the fallback and every
    draft on one prompt and length, back to back), else one block per runner, its requests
    one by one."""
    names = [FALLBACK, *drafts]

    def window(name: str, law: Law, rep: int) -> list[Request]:
        return window_requests(name, law, prompts, max_new_tokens, rep, seed)

    if points is not None and slow_switch:
        out: list[Block] = []
        for law in laws:
            for rep in repetitions:
                shift, at = rep % len(names), rep % len(points)
                for name in names[shift:] + names[:shift]:
                    out.extend(Block([name], load, [window(name, law, rep)], rep) for load in points[at:] + points[:at])
        return out
    if points is not None:
        out = []
        for law in laws:
            for li, load in enumerate(points):
                for rep in repetitions:
                    shift = (li + rep) % len(names)
                    for name in names[shift:] + names[:shift]:
                        out.append(Block([name], load, [window(name, law, rep)], rep))
        return out
    from gate.load.sequential import SEQUENTIAL

    requests = plan_requests(drafts, laws, prompts, max_new_tokens, repetitions, seed, interleave)
    if interleave:
        return [Block(names, SEQUENTIAL, cells(requests))]
    return [Block([name], SEQUENTIAL, [[r] for r in requests if r.draft == name]) for name in names]


def cells(requests: list[Request]) -> list[list[Request]]:
    """Consecutive requests of one cell (law, length, prompt, repetition): with interleaving
    the fallback and every draft, run back to back; without it, one request each."""

    def key(r: Request) -> tuple[Any, ...]:
        return r.law.name, r.max_new_tokens, r.prompt.id, r.prompt.context_length, r.repetition

    out: list[list[Request]] = []
    for req in requests:
        if out and key(out[-1][-1]) == key(req):
            out[-1].append(req)
        else:
            out.append([req])
    return out


# The most next-token samples per prompt and runner gate chooses (next_token_samples auto) unless
# measurement.budget.samples says otherwise.
AUTO_SAMPLE_BUDGET = 4096


@dataclass
class ExactnessPlan:
    """Which (draft, law) pairs exactness rules need, and the samples per prompt of the
    next-token tests (speculative first steps in process, sample requests when served): a
    number, 0 (no next-token test: PIT or greedy equality only) or auto (gate chooses, sized
    from the target's law for the rule's detect_tv at its power): an Asked per pair, the rules
    on it merged (samples_asked)."""

    pairs: set[tuple[str, str]] = field(default_factory=set)
    next_token_samples: dict[tuple[str, str], Asked] = field(default_factory=dict)
    next_token_prompts: int = 1
    # (draft, law) -> (detect_tv, power, significance) of the most demanding rule: what a
    # sampling plan chosen by gate (next_token_samples auto) is sized for
    demands: dict[tuple[str, str], tuple[float, float, float]] = field(default_factory=dict)
    # the most next-token samples per prompt and runner gate may choose (measurement.budget.samples)
    most_samples: int = AUTO_SAMPLE_BUDGET

    def has_greedy(self, laws: Iterable[Law]) -> bool:
        """Whether a pair names a greedy law of `laws` (greedy exactness is measured)."""
        names = {law for _, law in self.pairs}
        return any(law.greedy for law in laws if law.name in names)


@dataclass(frozen=True)
class Asked:
    """What exactness rules ask of the next-token samples per prompt: at least `fixed` (the
    largest number a rule names; 0: none), and with `auto`, as many as the claim test needs
    (gate chooses: the samples drawn are the larger of the two)."""

    fixed: int = 0
    auto: bool = False

    @property
    def none(self) -> bool:
        """No next-token test is asked."""
        return self.fixed == 0 and not self.auto

    def draw(self, planned: Callable[[], int]) -> int:
        """The samples to draw: `fixed`, or with auto the larger of it and `planned()`."""
        return max(self.fixed, planned()) if self.auto else self.fixed

    @classmethod
    def of(cls, value: int | str) -> Asked:
        """A rule's next_token_samples ("auto" or a number) as an Asked."""
        return cls(0, True) if value == "auto" else cls(int(value), False)


def samples_asked(asked: Iterable[Asked]) -> Asked:
    """What several rules (or the drafts of one law) ask, merged: the largest number any asks,
    and auto where any asks gate to choose, so that every rule gets at least what it asked (an
    auto rule its power, a fixed one its number)."""
    values = list(asked)
    return Asked(max((a.fixed for a in values), default=0), any(a.auto for a in values))


def plan_exactness(
    rules: Iterable[Any], drafts: list[str], laws: list[str], most_samples: int | str = "auto"
) -> ExactnessPlan:
    """The exactness measurements every rule decided on exactness raw material (level not off)
    needs; `most_samples`: measurement.budget.samples (auto: AUTO_SAMPLE_BUDGET)."""
    from gate.rules.kinds import registry as rule_kinds

    plan = ExactnessPlan(most_samples=AUTO_SAMPLE_BUDGET if most_samples == "auto" else int(most_samples))
    for rule in rules:
        if not rule_kinds.needs_exactness(rule) or rule.level == "off":
            continue
        for d in rule.scope.drafts or drafts:
            for law in rule.scope.laws or laws:
                plan.pairs.add((d, law))
                before = plan.next_token_samples.get((d, law), Asked())
                plan.next_token_samples[(d, law)] = samples_asked([before, Asked.of(rule.next_token_samples)])
                tv, power, alpha = plan.demands.get((d, law), (1.0, 0.0, 1.0))
                plan.demands[(d, law)] = (
                    min(tv, rule.detect_tv),
                    max(power, rule.power),
                    min(alpha, rule.significance),
                )
        plan.next_token_prompts = max(plan.next_token_prompts, rule.next_token_prompts)
    return plan


@dataclass
class Workload:
    """The workload as planned, built once (gate validate builds it, gate check runs it).

    `prompts`: every prompt to run, tokenized (chat template applied) and, for a context
    sweep, built to each length; `info`: how they were chosen (for the report);
    `questions`: the source prompts selected (before context building); `categories`: every
    category the source offers (for the did-you-mean of scopes). Each prompt runs under each
    workload.constraints entry (under_constraints)."""

    prompts: list[PlannedPrompt]
    info: WorkloadInfo
    questions: list[Prompt]
    categories: list[str]
    source: WorkloadSource | None = None  # where the prompts came from (its origin() names a prompt's file and line)


def law_of(spec: Any) -> Law:
    """One declared law (gate.policy.model.LawSpec: a policy's or a samples line's) as the
    plain record gate.core.law applies, named by its label."""
    return Law(
        spec.label,
        spec.temperature,
        spec.top_k,
        spec.top_p,
        min_p=spec.min_p,
        repetition_penalty=spec.repetition_penalty,
        presence_penalty=spec.presence_penalty,
        frequency_penalty=spec.frequency_penalty,
        logit_bias=spec.logit_bias_pairs,
        convention=spec.convention,
    )


def laws_of(policy: Any) -> list[Law]:
    """The policy's declared laws as plain records (gate.core.law.Law), in policy order."""
    return [law_of(s) for s in policy.laws]


PROMPT_FORMAT = object()  # a workload.constraints entry 'prompt': each prompt's own response_format


@dataclass(frozen=True)
class ConstraintEntry:
    """One workload.constraints entry, resolved: its `label`, and the ResponseFormat every
    prompt runs under (None for 'none'; PROMPT_FORMAT for 'prompt'). `where`: its YAML path."""

    label: str
    format: Any
    where: str


def constraint_entries(loaded: Any) -> list[ConstraintEntry]:
    """workload.constraints resolved to response formats; a schema_file is read (relative to
    the policy file). [] when the policy has none. Raises PolicyValueError at
    workload.constraints[i].schema_file for a missing file or one that is not a JSON object."""
    import json

    out = []
    for i, entry in enumerate(loaded.policy.workload.constraints or []):
        where = f"workload.constraints[{i}]"
        if entry == "none":
            out.append(ConstraintEntry("none", None, where))
        elif entry == "prompt":
            out.append(ConstraintEntry("prompt", PROMPT_FORMAT, where))
        elif entry.type == "regex":
            out.append(ConstraintEntry(entry.name, ResponseFormat("regex", entry.pattern), where))
        elif entry.type == "choice":
            out.append(ConstraintEntry(entry.name, ResponseFormat.of_choices(entry.choices), where))
        else:
            schema = entry.schema_
            if schema is None:
                path = loaded.resolve(entry.schema_file)
                try:
                    schema = json.loads(path.read_text(encoding="utf-8"))
                except FileNotFoundError:
                    raise PolicyValueError(f"{where}.schema_file", f"schema file not found: {path}") from None
                except (OSError, UnicodeDecodeError) as e:
                    raise PolicyValueError(f"{where}.schema_file", f"cannot read schema file {path}: {e}") from None
                except json.JSONDecodeError as e:
                    raise PolicyValueError(
                        f"{where}.schema_file", f"{path}:{e.lineno}: not valid JSON: {e.msg}"
                    ) from None
                if not isinstance(schema, dict):
                    raise PolicyValueError(
                        f"{where}.schema_file", f"{path} holds a JSON {type(schema).__name__}, not a JSON schema object"
                    )
            out.append(ConstraintEntry(entry.name, ResponseFormat.of_schema(json.loads(json.dumps(schema))), where))
    return out


def under_constraints(
    prompts: list[PlannedPrompt], questions: dict[str, Prompt], entries: list[ConstraintEntry]
) -> list[PlannedPrompt]:
    """Every prompt under each constraint entry, the entries of one prompt next to each other
    (so the variants of one prompt run close in time); without entries, each prompt under its
    own response_format. `questions`: source prompt id -> Prompt (whose response_format
    'prompt' takes); a context-sweep prompt '<id>@<length>' takes its question's."""

    def own(p: PlannedPrompt) -> ResponseFormat | None:
        q = questions.get(p.id if p.context_length is None else p.id.rsplit("@", 1)[0])
        return q.response_format if q is not None else None

    if not entries:
        return [replace(p, response_format=own(p)) for p in prompts]
    return [
        replace(
            p,
            id=f"{p.id}#{e.label}",
            constraint=e.label,
            response_format=own(p) if e.format is PROMPT_FORMAT else e.format,
        )
        for p in prompts
        for e in entries
    ]


def encoder(tokenizer: Any, chat_template: bool) -> Encode:
    """messages -> the token ids the target is fed: the tokenizer's chat template with the
    generation prompt, or (chat_template false) the contents joined by blank lines."""

    def encode(messages: list[dict[str, str]]) -> list[int]:
        if chat_template:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if not isinstance(ids, list) else ids
        else:
            ids = tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"]
        return [int(i) for i in ids]

    return encode


def build_workload(
    loaded: Any,
    source: WorkloadSource,
    tokenizer: Any,
    config: Any = None,
    check_categories: Callable[[list[str]], None] | None = None,
) -> Workload:
    """The workload's prompts, selected (seeded, ShareGPT's length filter applied), built to
    every context length and tokenized, with what the report records about how they were chosen.

    `loaded`: the LoadedPolicy; `source`: its prompt source (gate.workloads.registry);
    `config`: the target's model config; with it, every context length is checked against
    the target's positions (gate.workloads.context.check_fits); `check_categories`: called
    with every category the source offers before selecting (gate validate's did-you-mean).
    Raises PolicyValueError for a missing package or file, a malformed line (its number is
    named), a selection that leaves no prompt, chat_template on a tokenizer without one, and a
    context length that does not fit the target or that no prompt or no text can reach."""
    policy = loaded.policy
    w = policy.workload
    everything = source.load()
    categories = sorted({p.category for p in everything})
    if check_categories is not None:
        check_categories(categories)
    if w.context_lengths and config is not None:
        gamma = max((d.num_draft_tokens for d in policy.drafts.values()), default=0)
        check_fits(w.context_lengths, max(w.max_new_tokens_list), gamma, config)
    accept = source.acceptor(tokenizer, w.length_filter.model_dump()) if source.length_filtered else None
    chosen = choose(everything, w.seed, w.per_category, w.num_prompts, w.categories, accept)
    if not chosen.prompts:
        raise PolicyValueError("workload.categories" if w.categories else "workload", "the workload selects no prompt")
    if w.chat_template and not getattr(tokenizer, "chat_template", None):
        raise PolicyValueError(
            "workload.chat_template", "the target tokenizer has no chat template; set chat_template: false"
        )
    info = WorkloadInfo(
        source=w.source,
        seed=w.seed,
        available=sum(1 for p in everything if w.categories is None or p.category in w.categories),
        prompt_ids=[p.id for p in chosen.prompts],
        path=str(loaded.resolve(w.path)) if w.path else None,
        skipped=source.skipped(),
        examined=chosen.examined,
        pruned=chosen.pruned,
        length_filter=w.length_filter.model_dump() if accept is not None else None,
        context_lengths=list(w.context_lengths or []),
        stop=list(w.stop),
        notes=source.notes(),
        constraints=w.constraint_labels,
    )
    encode = encoder(tokenizer, w.chat_template)
    if not w.context_lengths:
        prompts = [PlannedPrompt(p.id, p.category, tuple(encode(p.messages))) for p in chosen.prompts]
    else:
        builder = ContextBuilder(everything, tokenizer, encode, w.seed)
        prompts = [
            c for i, length in enumerate(w.context_lengths) for c in _contexts(builder, chosen.prompts, length, i, info)
        ]
    prompts = under_constraints(prompts, {p.id: p for p in chosen.prompts}, constraint_entries(loaded))
    return Workload(prompts, info, chosen.prompts, categories, source)


def _contexts(
    builder: ContextBuilder, questions: list[Prompt], length: int, index: int, info: WorkloadInfo
) -> list[PlannedPrompt]:
    """Every question built to `length` tokens (those longer alone are recorded in info)."""
    where = f"workload.context_lengths[{index}]"
    out = []
    for q in questions:
        try:
            built = builder.build(q, length)
        except ContextError as e:
            raise PolicyValueError(where, f"cannot build a {length}-token context from real text: {e}") from None
        if built is None:
            info.context_skipped.append(f"{q.id}@{length}")
        else:
            out.append(PlannedPrompt(built.prompt.id, built.prompt.category, tuple(built.token_ids), length))
    if not out:
        raise PolicyValueError(
            where,
            f"every selected prompt is longer than {length} tokens by itself "
            "(chat template included); ask for a longer context",
        )
    return out


@dataclass
class Plan:
    """A validated policy and everything decided before a weight is loaded: what `gate
    validate` returns and `gate check` runs (the workload is built once, here).

    `loaded`: the LoadedPolicy (file, YAML lines, warnings); `target`: the resolved target
    source (gate.models.loading.ModelSource); `workload`: the prompts to run; `laws`: the
    declared laws; `exactness`: what the exactness rules need measured; `baseline`: the
    saved report relative_to: baseline rules compare with (gate.policy.baseline.Baseline), or None;
    `tokenizer`: the target's tokenizer, loaded once."""

    loaded: Any
    target: Any
    workload: Workload
    laws: list[Law]
    exactness: ExactnessPlan
    baseline: Any = None
    tokenizer: Any = None  # the target's tokenizer validation loaded (gate check reuses it)
    release: Any = None  # the pinned released target (gate.loop.identity.Release), or None

    @property
    def policy(self) -> Any:
        """The validated Policy (gate.policy.model.Policy)."""
        return self.loaded.policy

    @property
    def warnings(self) -> list[Any]:
        """Problems that do not stop a run (e.g. an under-powered rule), for gate validate to print."""
        warnings: list[Any] = self.loaded.warnings
        return warnings

    @property
    def path(self) -> Any:
        """The policy file."""
        return self.loaded.path

    def resolve(self, relative: str | None) -> Any:
        """A path in the policy, relative to the policy file."""
        return self.loaded.resolve(relative)

    def error(self, e: Exception) -> Exception:
        """`e` (a PolicyValueError) as an InputError naming the file, YAML path and line."""
        error: Exception = self.loaded.error(e)
        return error

    def requests(self, drafts: list[str], repetitions: range | int, laws: list[str] | None = None) -> list[Request]:
        """The requests of `drafts` (and their fallback) under `laws` (default: all), in run
        order (gate.plan.matrix.plan_requests)."""
        policy = self.policy
        chosen = [law for law in self.laws if laws is None or law.name in laws]
        return plan_requests(
            drafts,
            chosen,
            self.workload.prompts,
            policy.workload.max_new_tokens_list,
            repetitions,
            policy.workload.seed,
            policy.measurement.interleave,
        )


def workload_source(loaded: Any) -> WorkloadSource:
    """The policy's prompt source, built from its entry in gate.workloads.registry (one
    module per source under gate/workloads); a source that takes a path gets workload.path
    resolved against the policy file (`loaded`: the LoadedPolicy). Loading it (load())
    raises PolicyValueError."""
    from gate.workloads import registry

    w = loaded.policy.workload
    kind = registry.get(w.source)
    return kind.build(loaded.resolve(w.path or "") if kind.needs_path else None)


def plan_workload(loaded: Any, tokenizer: Any, config: Any = None) -> tuple[list[PlannedPrompt], WorkloadInfo]:
    """The workload's prompts and how they were chosen (build_workload on the policy's own
    source); same errors."""
    w = build_workload(loaded, workload_source(loaded), tokenizer, config)
    return w.prompts, w.info
