"""What a run was: its models, environment, workload, drafts and the measurements that failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

RECORDED_SAMPLES = (
    "recorded samples"  # Measurements.drafts kind of a source in `gate exactness` (gate.commands.exactness)
)


class FailureStage(str, Enum):
    """Where a measurement that could not be made failed (Failure.stage). str-valued: a
    stage compares equal to its string and serialises as it ("request", ...)."""

    REQUEST = "request"  # one timed request (its draft and law)
    WARM_UP = "warm-up"  # an untimed warm-up request of one runner
    OVERLAP = "overlap"  # teacher-forced overlap along a fallback continuation
    EXACTNESS = "exactness"  # exactness raw material (teacher-forced checks, first steps, recorded samples)
    BILL = "bill"  # the resident memory bill
    RUN = "run"  # the whole run: loading models, measuring, or interrupted
    IDENTITY = "target identity"  # the target's identity against the pinned release (probe, release model)
    DRIFT = "target drift"  # the updated target's law against the release's along the workload
    VERIFICATION = "verification"  # a draft's server verifies with a method that does not keep the target's law
    DEVICE_MEMORY = "device memory"  # the accelerator's memory could not be read (gate.measure.device_memory)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass
class ModelInfo:
    """What was loaded, for the report's environment section."""

    role: str  # "target" or the draft name
    source: str
    kind: str
    dtype: str
    fingerprint: str  # sha256 over parameter bytes (first 16 hex), see gate.models.loading.fingerprint
    parameters: int
    weight_bytes: int


@dataclass
class Environment:
    """Versions, device and seed, written into every report."""

    python: str
    torch: str
    transformers: str
    gate: str
    platform: str
    device: str
    device_name: str
    seed: int
    models: list[ModelInfo] = field(default_factory=list)
    # The machine's load over the timed requests (gate.measure.contention).
    cpu_count: int | None = None  # CPUs this process may run on
    threads: int | None = None  # compute threads (torch.get_num_threads())
    # the compute threads the process was given, where the runner fits its threads to a busy machine
    # (measurement.threads auto): a request on fewer (RequestRecord.threads) ran slower than the machine allows
    threads_given: int | None = None
    cpu_pressure_source: str | None = None  # "/proc/pressure/cpu", "load average", or None: not measured
    cpu_stall_share: float | None = None  # share of the timed requests' wall time some runnable task waited for a CPU
    load_avg_1m_max: float | None = None  # highest 1-minute load average seen at a request's end


@dataclass
class Failure:
    """A measurement that could not be made: which cell and why. Rules needing it are errors."""

    stage: FailureStage  # see FailureStage; a plain string is converted (ValueError for an unknown stage)
    draft: str  # a draft name, "fallback", or "*" for all
    law: str  # a law name or "*"
    what: str
    message: str
    concurrency: int | None = None  # served: the closed-loop load point it failed at (None: every load point)
    request_rate: float | None = None  # served: the open-loop load point it failed at

    def __post_init__(self) -> None:
        self.stage = FailureStage(self.stage)


def at_load_point(concurrency: int | None, request_rate: float | None) -> str:
    """How a record names its load point in a message: " at concurrency 2", " at request rate
    1.5/s", or "" (in-process: no load point)."""
    if concurrency is not None:
        return f" at concurrency {concurrency}"
    return f" at request rate {request_rate:g}/s" if request_rate is not None else ""


def describe_failures(failed: list[Failure], most: int = 3) -> str:
    """The failures behind a missing measurement, for a rule's message: one entry per runner
    (at most `most`), its failures counted with the load points they struck and the first
    one's message, said once (a server that is down fails every request of every load point
    with the same cause, and the breaker's "not sent" repeats it): 'fallback: 10 requests
    failed at concurrency 1, 2 (first: <message>)'. The report's failures list has each."""
    by_runner: dict[str, list[Failure]] = {}
    for f in failed:
        by_runner.setdefault(f.draft, []).append(f)
    parts = []
    for runner, fs in list(by_runner.items())[:most]:
        if len(fs) == 1:
            parts.append(f"{runner}: {fs[0].what}: {fs[0].message}")
            continue
        conc = sorted({f.concurrency for f in fs if f.concurrency is not None})
        rates = sorted({f.request_rate for f in fs if f.request_rate is not None})
        points = ([f"concurrency {', '.join(map(str, conc))}"] if conc else []) + (
            [f"request rate {', '.join(f'{r:g}' for r in rates)}/s"] if rates else []
        )
        at = f" at {' and '.join(points)}" if points else ""
        others = len({f.message for f in fs}) - 1
        more = f"; {others} other message(s) in the report's failures" if others else ""
        parts.append(f"{runner}: {len(fs)} measurements failed{at} (first: {fs[0].what}: {fs[0].message}{more})")
    rest = len(by_runner) - most
    return "; ".join(parts) + (f"; and {rest} other runner(s)" if rest > 0 else "")


@dataclass
class WorkloadInfo:
    """Where the prompts came from and how they were chosen, to reproduce and explain a run.

    `available`: prompts the source offered (after `categories`); `skipped`: records of the
    source's data left out at load, by reason (ShareGPT: fewer than 2 turns, ...);
    `examined` candidates the length filter ran on (in seeded order) and `pruned` of them by
    reason, under `length_filter` (ShareGPT, in target tokens); `prompt_ids`: the selected
    prompts in run order. Context sweeps: `context_lengths` requested (tokens) and
    `context_skipped`, the '<prompt id>@<length>' a prompt alone is too long for.
    `constraints`: the workload.constraints labels every prompt ran under ('<prompt id>#<label>'),
    [] without them."""

    source: str
    seed: int
    available: int
    prompt_ids: list[str]
    path: str | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    examined: int = 0
    pruned: dict[str, int] = field(default_factory=dict)
    length_filter: dict[str, int] | None = None
    context_lengths: list[int] = field(default_factory=list)
    context_skipped: list[str] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)


@dataclass
class DraftInfo:
    """What a measured draft is, for rules and reports: its `kind` (a registered draft kind,
    or RECORDED_SAMPLES for a source of `gate exactness`), `num_draft_tokens` (gamma) and
    `probability_info` ("distribution" or "point_mass"); None where not known (nothing was
    loaded, or recorded samples)."""

    kind: str
    num_draft_tokens: int | None = None
    probability_info: str | None = None
    modifies_target: bool = False  # its kind ships a changed target (gate.drafts.interface.DraftKind.modifies_target)
    sweep_of: str | None = None  # a num_draft_tokens_sweep's runner: the declared draft it varies (None: declared)
    swept: bool = False  # a declared draft with a num_draft_tokens_sweep (its K is compared with the sweep's and K=0)
    # what a draft of its kind accepting almost nothing most likely means (DraftKind.low_acceptance_cause)
    low_acceptance_cause: str | None = None


@dataclass
class LooksRecord:
    """A sequential run's design and how far each cell went (gate.plan.rounds; gate.rules.sequential
    decides each verdict at its cell's look). `unit`: what the schedule counts per runner and law
    ("prompt": one request per max_new_tokens of a prompt, in gate's own loop; "window": a
    repetition of the workload at every load point); `schedule`: units at each look, the last the
    budget; `fixed_plan`: units of the fixed plan (measurement.repetitions); `taken`:
    "<runner>/<law>" -> the looks its cell was measured to (1: the first round only);
    `requests_per_unit`: timed requests one unit holds per runner, law and load point."""

    unit: str
    schedule: list[int]
    fixed_plan: int
    requests_per_unit: int
    taken: dict[str, int] = field(default_factory=dict)


@dataclass
class SampleLooksRecord:
    """How far a sequential run's served exactness samples went (gate.rules.sequential.
    SAMPLE_LOOKS; gate.exactness.verdict decides at the look taken). `fractions`: each look's
    share of the plan; `taken`: the looks drawn (a verdict is decided at the last); `planned`:
    "<runner>/<law>" -> the plan's samples (all prompts), what a fixed plan draws; `drawn`:
    "<runner>/<law>" -> the samples drawn."""

    fractions: list[float]
    taken: int = 0
    planned: dict[str, int] = field(default_factory=dict)
    drawn: dict[str, int] = field(default_factory=dict)
