"""Typed measurement records with units. Counters are stored; rates are derived.

Records are plain dataclasses that serialise to the JSON report as they are, so any rule
can aggregate the raw values later. They know nothing about rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

FALLBACK = "fallback"
UNKNOWN_ID = -1  # output id of a token a runner counted but whose id it did not see (a stream of text only)
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

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass
class SpecDecodeCounters:
    """vLLM's spec-decode counters (vllm/v1/spec_decode/metrics.py) plus the tokens the
    steps committed. They add up across requests and runs; rates are derived from pooled
    counters, never averaged.

    num_drafts: verification steps that carried at least one proposal.
    num_draft_tokens: proposals made. num_accepted_tokens: proposals committed (gate stops at
    an EOS or stop string inside an accepted block: proposals after it are not counted; vLLM
    counts every proposal its rejection rule accepted).
    num_committed_tokens: tokens the steps with a proposal committed (accepted proposals plus
    the correction or bonus token, fewer when the output ends inside the block).
    num_accepted_tokens_per_pos[i]: steps whose proposal at position i was committed.
    accepted_length_histogram[k]: steps with a proposal that committed k proposals.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    accepted_length_histogram: list[int] = field(default_factory=list)
    num_committed_tokens: int = 0

    def __add__(self, other: SpecDecodeCounters) -> SpecDecodeCounters:
        return SpecDecodeCounters(
            self.num_drafts + other.num_drafts,
            self.num_draft_tokens + other.num_draft_tokens,
            self.num_accepted_tokens + other.num_accepted_tokens,
            _add_lists(self.num_accepted_tokens_per_pos, other.num_accepted_tokens_per_pos),
            _add_lists(self.accepted_length_histogram, other.accepted_length_histogram),
            self.num_committed_tokens + other.num_committed_tokens,
        )

    @property
    def acceptance_rate(self) -> float:
        """num_accepted_tokens / num_draft_tokens (NaN without proposals)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """num_committed_tokens / num_drafts: committed tokens per step with a proposal, what a
        client receives per verification (NaN without proposals). Equals vLLM's figure except
        where an output ends inside an accepted block (EOS, stop string), which commits no
        correction or bonus token."""
        return self.num_committed_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def vllm_mean_acceptance_length(self) -> float:
        """1 + num_accepted_tokens / num_drafts: vLLM's formula, which adds a correction or
        bonus token to every step, also one cut short by an EOS (vLLM issue #56101)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        """num_accepted_tokens_per_pos[i] / num_drafts. Their sum + 1 is vLLM's mean acceptance length."""
        return [a / self.num_drafts if self.num_drafts else float("nan") for a in self.num_accepted_tokens_per_pos]

    @classmethod
    def from_steps(
        cls, proposed: list[int], accepted: list[int], committed: list[int] | None = None
    ) -> SpecDecodeCounters:
        """Counters from per-step proposal, accepted and committed counts (steps without
        proposals ignored). Without `committed`, every step commits its accepted proposals
        plus one token."""
        width = max(proposed, default=0)
        per_pos = [0] * width
        hist = [0] * (width + 1)
        drafts = done = 0
        for s, (n, a) in enumerate(zip(proposed, accepted, strict=False)):
            if n == 0:
                continue
            drafts += 1
            done += committed[s] if committed is not None else a + 1
            hist[a] += 1
            for i in range(a):
                per_pos[i] += 1
        return cls(drafts, sum(proposed), sum(accepted), per_pos, hist, done)


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    out = [0] * max(len(a), len(b))
    for i, v in enumerate(a):
        out[i] += v
    for i, v in enumerate(b):
        out[i] += v
    return out


@dataclass
class RequestRecord:
    """One generation request, fallback or speculative, as the client sees it.

    Times are milliseconds from the request's start. token_times_ms[i] is when output
    token i was committed; tokens committed by one step share one time (so token-by-token
    ITL has zeros inside a step; itl_chunk_ms has one gap per step). Stop handling is
    applied before counting: an EOS inside an accepted block ends the output there, and so
    does the token that completes a stop string (it is the last output token; the text a
    client gets stops before the stop string, as vLLM returns it by default).
    """

    draft: str  # draft name, or "fallback"
    law: str
    prompt_id: str
    category: str
    max_new_tokens: int
    repetition: int
    prompt_tokens: int
    output_ids: list[int]
    token_times_ms: list[float]
    # Per-step counts: None where the runner cannot see steps (a served engine's stream).
    step_committed: list[int] | None  # committed tokens per step; the first step is the prefill
    step_proposed: list[int] | None  # proposals verified per step (0 for the prefill and fallback)
    step_accepted: list[int] | None  # proposals committed per step
    stop_reason: str  # "eos", "stop" (a stop string) or "length"
    e2el_ms: float
    num_draft_tokens: int  # the configured gamma (0 for the fallback)
    # Measured in-process only (None where the runner cannot see the caches):
    kv_cache_tokens: int | None  # tokens held in the target cache at the end of the request (<= prompt + output)
    kv_cache_bytes: int | None  # measured bytes of the target's cache tensors at the end (cropped to prompt + output)
    draft_kv_cache_bytes: int | None  # measured bytes of the draft's cache tensors at the end (with its last proposals)
    context_length: int | None = None  # the requested length of a context-sweep prompt (tokens), else None
    stop_string: str | None = None  # the stop string that ended the output (stop_reason "stop")
    constraint: str | None = None  # the workload.constraints label it ran under ('none', 'prompt', a name), else None
    # Contention (gate.measure.contention), over the request's wall time; None where not
    # measured (a runner without the cpu_accounting capability).
    cpu_time_ms: float | None = None  # this process's CPU time, user + system, all threads
    cpu_stall_ms: float | None = (
        None  # time some runnable task waited for a CPU (/proc/pressure/cpu "some"), None without it
    )
    load_avg_1m: float | None = None  # the machine's 1-minute load average at the request's end
    threads: int | None = None  # compute threads the runner used (torch.get_num_threads())
    contention_reruns: int = 0  # times this request's cell was rerun because a request of it was contended
    # Served runners (gate.runners.openai): the load point the request ran at, and what only a server says.
    concurrency: int | None = None  # the closed-loop load point (load.concurrency), None in-process / open loop
    request_rate: float | None = None  # the open-loop load point (load.request_rate, requests/s)
    queue_ms: float | None = None  # client queue time: scheduled arrival -> send (open loop with a cap)
    server_draft_tokens: int | None = None  # proposals the server made for it (llama.cpp timings.draft_n)
    server_accepted_tokens: int | None = None  # of them accepted (llama.cpp timings.draft_n_accepted)
    # The served client's own timing of the request (gate.runners.result.ClientTiming; None in-process).
    # token_times_ms and e2el_ms run from when the request left (its one write handed to the transport); these say what
    # came before.
    schedule_lag_ms: float | None = None  # how late the client began it against when it was due
    send_ms: float | None = None  # began -> left (connection set-up included)
    connect_ms: float | None = None  # TCP/TLS set-up when it opened its connection (None: kept-alive, or in-process)
    loop_lag_ms: float | None = None  # the client worker's largest event-loop lag while it was in flight
    client_worker: int | None = None  # the client worker process that sent it (0-based)
    server_output_tokens: int | None = None  # output tokens the server counted (usage / tokens_predicted)
    server_prefill_ms: float | None = None  # the server's own prefill time (llama.cpp timings.prompt_ms)
    server_tpot_ms: float | None = None  # the server's own time per output token (llama.cpp predicted_per_token_ms)
    server_cached_tokens: int | None = None  # prompt tokens the server took from its prefix cache (llama.cpp cache_n)
    started_s: float | None = None  # served: wall clock (s since the epoch) when the request left the client
    # Cross-tokenizer drafts (gate.drafts.cross_tokenizer), per step like step_proposed (0 / None elsewhere):
    step_mapping_ms: list[float] | None = (
        None  # time spent translating between the tokenizers in the step's proposal (ms)
    )
    step_draft_tokens: list[int] | None = None  # tokens the draft proposed in its own vocabulary before translation

    @property
    def mapping_ms(self) -> float:
        """Total translation time of the request (ms); 0 without per-step mapping times."""
        return float(sum(self.step_mapping_ms)) if self.step_mapping_ms else 0.0

    @property
    def draft_tokens(self) -> int | None:
        """Tokens the draft proposed in its own vocabulary over the request (None: not recorded)."""
        return sum(self.step_draft_tokens) if self.step_draft_tokens is not None else None

    @property
    def output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def ttft_ms(self) -> float:
        return self.token_times_ms[0] if self.token_times_ms else float("nan")

    @property
    def itl_ms(self) -> list[float]:
        """Token-by-token inter-token latencies: len = output_tokens - 1; mean = TPOT."""
        t = self.token_times_ms
        return [t[i] - t[i - 1] for i in range(1, len(t))]

    @property
    def itl_chunk_ms(self) -> list[float]:
        """One gap per step after the first (vLLM bench's per-chunk convention). Without
        per-step counts (step_committed None) a chunk is the tokens that arrived at one
        time: one gap per change of token_times_ms."""
        ends: list[float] = []
        if self.step_committed is None:
            for t in self.token_times_ms:
                if not ends or t != ends[-1]:
                    ends.append(t)
        else:
            i = 0
            for k in self.step_committed:
                if k:
                    i += k
                    ends.append(self.token_times_ms[i - 1])
        return [ends[j] - ends[j - 1] for j in range(1, len(ends))]

    @property
    def tpot_ms(self) -> float:
        n = self.output_tokens
        return (self.e2el_ms - self.ttft_ms) / (n - 1) if n > 1 else float("nan")

    @property
    def committed_tokens_per_s(self) -> float:
        return self.output_tokens / (self.e2el_ms / 1e3) if self.e2el_ms > 0 else float("nan")

    @property
    def counters(self) -> SpecDecodeCounters | None:
        """The request's spec-decode counters from its per-step counts; None without them."""
        if self.step_proposed is None or self.step_accepted is None:
            return None
        return SpecDecodeCounters.from_steps(self.step_proposed, self.step_accepted, self.step_committed)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["derived"] = {
            "output_tokens": self.output_tokens,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "committed_tokens_per_s": self.committed_tokens_per_s,
            "counters": asdict(counters) if (counters := self.counters) is not None else None,
        }
        return out


@dataclass
class OverlapRecord:
    """Per-position overlap along one continuation the target generated under the law.

    overlap[i] = sum_x min(p_i(x), q_i(x)) at output position i, both processed by the law;
    None where the draft made no proposal (prompt lookup without an n-gram match).
    top1[i] = argmax q_i == argmax p_i (diagnostic only).
    """

    draft: str
    law: str
    prompt_id: str
    category: str
    probability_info: str  # "distribution" or "point_mass"
    overlap: list[float | None]
    top1: list[bool | None]
    context_length: int | None = None  # the requested length of a context-sweep prompt (tokens), else None
    constraint: str | None = None  # the workload.constraints label of the prompt variant, else None


@dataclass
class Divergence:
    """A position where a greedy speculative output is not the target's argmax.

    Teacher-forced on the output's own prefix; gap_logits = the target's top logit minus
    the logit of the token the speculative run committed (the top-1 minus top-2 gap when
    that token is the runner-up). A gap within the rule's tie tolerance is a numerical
    near-tie (e.g. bfloat16 or batch-shape rounding), not a fault."""

    prompt_id: str
    position: int  # output position
    target_token: int  # the target's argmax there
    draft_token: int  # the token the speculative run committed
    gap_logits: float
    repetition: int | None = None  # the request's repetition (None: recorded samples)
    concurrency: int | None = None  # served: the closed-loop load point it ran at
    request_rate: float | None = None  # served: the open-loop load point it ran at

    @property
    def where(self) -> str:
        """'mt_bench-137 repetition 1 at concurrency 2, output position 27'."""
        rep = f" repetition {self.repetition}" if self.repetition is not None else ""
        point = (
            f" at concurrency {self.concurrency}"
            if self.concurrency is not None
            else f" at request rate {self.request_rate:g}/s"
            if self.request_rate is not None
            else ""
        )
        return f"{self.prompt_id}{rep}{point}, output position {self.position}"


@dataclass
class NextTokenCounts:
    """Next tokens sampled many times at one context, and the target's law there.

    The context is a prompt plus `prefix`, output tokens shared by every counted sample
    (empty: the first output position). The law is stored sparsely: `support_ids`/
    `support_probs` hold the most likely tokens covering all but `rest_prob` of the mass;
    `counts` counts samples per support id and `rest_count` the samples outside it (tokens
    with probability 0 count in `zero_count`)."""

    prompt_id: str
    support_ids: list[int]
    support_probs: list[float]
    rest_prob: float
    counts: list[int]
    rest_count: int
    zero_count: int
    prefix: list[int] = field(default_factory=list)


@dataclass
class TwoSampleCounts:
    """Next-token counts of a draft runner and of the fallback runner (the reference) at one
    context: the same prompt and output prefix, under one law. `token_ids` are the tokens
    either runner drew there; `counts[i]` and `reference_counts[i]` how often each drew
    token_ids[i]."""

    prompt_id: str
    prefix: list[int]
    token_ids: list[int]
    counts: list[int]
    reference_counts: list[int]


@dataclass
class SampleRecord:
    """One short request of the served exactness plan (gate.exactness.sampled.plan_samples):
    runner `runner` under law `law` on prompt `prompt_id` with its own `seed` (distinct per
    sample, so a verdict can be replayed), at load point (`concurrency`, `request_rate`);
    `output_ids` the token ids it returned, in order."""

    runner: str
    law: str
    prompt_id: str
    seed: int
    output_ids: list[int]
    concurrency: int | None = None
    request_rate: float | None = None


@dataclass
class ExactnessRecord:
    """Raw material of the exactness tests for one draft under one law.

    Greedy laws: `compared` speculative requests, every token checked against the target's
    argmax on the output's own prefix, and their `divergences`. Sampling laws: `pit` values of every generated token
    (None for a token the law gives probability 0) and optional next-token counts."""

    draft: str
    law: str
    greedy: bool
    compared: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    pit: list[float | None] = field(default_factory=list)
    next_token: list[NextTokenCounts] = field(default_factory=list)
    # Served greedy runs: the fallback runner as the control for the server's numerics: the largest gap (logits)
    # below the local target's top logit of any token the fallback runner emitted (None: not measured, in-process)
    numerical_tolerance: float | None = None
    note: str | None = None  # why fewer requests were compared than ran (e.g. no token ids came back)
    # Output positions before this one come from the target's prefill, not from speculation (served engines: 1),
    # so a next-token test there tests the server's law, not the speculative sampler's
    speculative_from: int = 0
    # Served sampling laws: the draft runner's next-token counts against the fallback runner's (two-sample)
    two_sample: list[TwoSampleCounts] = field(default_factory=list)
    # Served sampling laws: the cost of this runner's samples (SampleRecord): requests, output tokens, wall seconds
    sample_requests: int = 0
    sample_tokens: int = 0
    sample_wall_s: float = 0.0


@dataclass
class BillLine:
    """One allocation of the resident resource bill."""

    name: str
    formula: str  # the formula with the numbers filled in
    bytes: int
    coexists_at_peak: bool = True
    # Measured against predicted where gate can measure the line (the target KV cache: the
    # bytes of the real cache tensors at the end of the longest request, one sequence, and the
    # formula for one sequence at that length). Not filled when resources.kv_dtype overrides
    # the dtype the model really caches in.
    measured_bytes: int | None = None
    measured_at_tokens: int | None = None
    predicted_at_measured_bytes: int | None = None


@dataclass
class Budget:
    """The capacity-planning answer: what is left on the device and what it buys.

    headroom_bytes = capacity - bill total (negative: the bill does not fit);
    extra_sequences: more sequences of the same context that fit in the headroom;
    extra_context_tokens: more tokens per sequence (for every sequence) that fit."""

    capacity_bytes: int
    headroom_bytes: int
    bytes_per_extra_sequence: int
    extra_sequences: int
    bytes_per_extra_context_token: int
    extra_context_tokens: int


@dataclass
class BillRecord:
    """Predicted resident bytes for one draft (or the fallback) at `sequences` sequences of
    `context_tokens` tokens, with the budget statement when a capacity is declared."""

    draft: str
    sequences: int
    context_tokens: int
    lines: list[BillLine]
    budget: Budget | None = None

    @property
    def total_bytes(self) -> int:
        return sum(line.bytes for line in self.lines if line.coexists_at_peak)


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
class OfferedLoad:
    """The load a window was measured under (gate.load): `kind` ("sequential", ...), most
    requests in flight (`concurrency`, None: unbounded) and mean arrivals per second
    (`request_rate`, None: each request as soon as a slot is free)."""

    kind: str
    concurrency: int | None = 1
    request_rate: float | None = None
    burstiness: float | None = None  # gamma shape of inter-arrival times (1: Poisson); None without a rate


def busy_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by the union of (start_s, end_s) intervals: the time at least one
    of them was in flight. Intervals that do not overlap (sequential requests) add up."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


@dataclass
class ClientWorkerRecord:
    """What one served-client worker process measured of itself over one window
    (gate.runners.client.worker): `wall_s` and `cpu_s` (its process's user + system time;
    cpu_s / wall_s near 1: it was saturated), the requests it began, and its event-loop lag
    in ms (a timer due every 2 ms, how late it ran: median, 99th percentile, max over
    `ticks` timers)."""

    worker: int
    wall_s: float
    cpu_s: float
    requests: int
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    ticks: int

    @property
    def cpu_share(self) -> float | None:
        """CPU time over wall time (1.0: one CPU busy throughout); None for an empty window."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else None


@dataclass
class RunRecord:
    """One measured window: the timed requests of one runner (a draft name or "fallback")
    under one law, sent by one run of the plan under one offered load.

    `start_s`/`end_s`: wall clock (s since the epoch) when its first request started and
    its last one ended; with interleaving other runners' requests run in between, so the
    window's `busy_s` (the union of its requests' [start, start + e2el] intervals) is its
    time, not end - start. `committed_tokens`: output tokens of its requests; `counters`:
    spec-decode counters pooled over the window (counter deltas; None where the runner
    gives no per-step counts); `server`: the served engine's identity (None in-process).
    Requests that failed are not in the window; contention reruns keep the attempt kept."""

    runner: str
    law: str
    start_s: float
    end_s: float
    load: OfferedLoad
    requests: int
    busy_s: float
    committed_tokens: int
    counters: SpecDecodeCounters | None = None
    server: str | None = None
    repetition: int | None = None  # served load points: the repetition this window is (paired across runners by it)
    good_requests: int | None = None  # requests meeting every load.goodput SLO (None: no SLO declared)
    slo_ms: dict[str, float] = field(default_factory=dict)  # the SLOs good_requests was counted against
    cpu_stall_share: float | None = None  # served: share of the window's wall time some task waited for a CPU (PSI)
    client_workers: list[ClientWorkerRecord] = field(default_factory=list)  # served: the client's worker processes
    server_ttft_mean_ms: float | None = (
        None  # the server's own mean TTFT over the window (vLLM's histogram), where kept
    )
    server_itl_mean_ms: float | None = None  # the server's own mean inter-token latency over the window, where kept
    server_cached_tokens: int | None = (
        None  # prompt tokens the server took from its prefix cache over the window (vLLM's counter)
    )

    @property
    def duration_s(self) -> float:
        """Wall time of the window, first send to last byte (s): a served window's denominator
        of output and request throughput (vLLM bench serve's benchmark duration)."""
        return self.end_s - self.start_s

    def committed_tokens_per_s(self) -> float:
        """Committed tokens per second of the window: committed_tokens / busy_s (NaN when
        nothing was busy). Under sequential load the requests never overlap, so busy_s is
        the sum of their E2E latencies and this equals today's pooled committed_tokens_per_s
        (sum of output tokens / sum of E2E time) over the same requests; at a concurrency
        above 1 the sum of latencies overcounts time and only this figure is throughput."""
        return self.committed_tokens / self.busy_s if self.busy_s > 0 else float("nan")

    @classmethod
    def of(
        cls,
        runner: str,
        law: str,
        load: OfferedLoad,
        spans: list[tuple[float, RequestRecord]],
        server: str | None = None,
    ) -> RunRecord:
        """The window of `spans`: (wall-clock start in s, record) of every request in it
        (non-empty). Counters are None when any record lacks per-step counts."""
        if not spans:
            raise ValueError("a run record needs at least one request")
        intervals = [(start, start + r.e2el_ms / 1e3) for start, r in spans]
        counts = [r.counters for _, r in spans]
        known = [c for c in counts if c is not None]
        pooled = sum(known, SpecDecodeCounters()) if len(known) == len(counts) else None
        return cls(
            runner,
            law,
            min(s for s, _ in intervals),
            max(e for _, e in intervals),
            load,
            len(spans),
            busy_seconds(intervals),
            sum(r.output_tokens for _, r in spans),
            pooled,
            server,
        )


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


class SpeculationStatus(str, Enum):
    """Whether a draft runner speculated in one cell (gate.measure.speculation)."""

    SPECULATED = "speculated"  # it proposed about as often as its outputs imply
    OFF = "off"  # no proposal at all where its outputs imply some: speculation did not run
    FEW = "few"  # far fewer proposals than its outputs imply: speculation barely ran
    SOME_OFF = "some_off"  # requests that imply proposals made none: speculation off for some requests
    NOTHING_TO_PROPOSE = "nothing_to_propose"  # no proposal, and its outputs imply none (lookup: nothing to copy)
    NOT_COUNTED = "not_counted"  # neither per-request counts nor server counters: cannot be told

    def __str__(self) -> str:
        return self.value


# The statuses under which a runner's verdicts at that cell say nothing about its draft.
DID_NOT_SPECULATE = (SpeculationStatus.OFF, SpeculationStatus.FEW, SpeculationStatus.SOME_OFF)


@dataclass
class SpeculationRecord:
    """Whether draft runner `runner` speculated under `law` at one load point (`concurrency`
    / `request_rate`; both None in-process): over its `requests` timed requests and their
    `output_tokens`, it proposed `draft_tokens` (from `source`: "per-request counts" or
    "server counters"; None: not counted), where its outputs imply at least `floor_steps`
    verification steps with a proposal by `rule` (gate.measure.speculation; None: the output's
    token ids did not come back, so it cannot be told). With per-request counts,
    `silent_requests` of the `eligible_requests` whose own floor is 2 steps or more made no
    proposal."""

    runner: str
    law: str
    status: SpeculationStatus
    requests: int
    output_tokens: int
    draft_tokens: int | None
    floor_steps: int | None
    rule: str
    source: str
    silent_requests: int | None = None
    eligible_requests: int | None = None
    concurrency: int | None = None
    request_rate: float | None = None

    def __post_init__(self) -> None:
        self.status = SpeculationStatus(self.status)

    @property
    def where(self) -> str:
        """'under greedy at concurrency 2' (in-process: 'under greedy')."""
        point = (
            f" at concurrency {self.concurrency}"
            if self.concurrency is not None
            else f" at request rate {self.request_rate:g}/s"
            if self.request_rate is not None
            else ""
        )
        return f"under {self.law}{point}"

    def describe(self) -> str:
        """What was seen and why it is (or is not) speculation, in one sentence."""
        made = (
            f"{self.draft_tokens} draft tokens ({self.source})"
            if self.draft_tokens is not None
            else "an uncounted number of draft tokens"
        )
        seen = (
            f"draft {self.runner} made {made} over {self.requests} requests ({self.output_tokens} output tokens) "
            f"{self.where}"
        )
        implied = f"its outputs imply at least {self.floor_steps} proposing steps ({self.rule})"
        if self.status == SpeculationStatus.OFF:
            return f"speculation did not run: {seen}, where {implied}"
        if self.status == SpeculationStatus.FEW:
            return f"speculation barely ran: {seen}, where {implied}"
        if self.status == SpeculationStatus.SOME_OFF:
            return (
                f"speculation was off for some requests: {self.silent_requests} of the {self.eligible_requests} "
                f"requests whose outputs imply 2 or more proposing steps made no proposal ({seen}; {self.rule})"
            )
        if self.status == SpeculationStatus.NOTHING_TO_PROPOSE:
            return (
                f"nothing to propose: {seen}, and its outputs imply {self.floor_steps} proposing steps ({self.rule}): "
                "the draft found nothing to propose on these prompts; its verdicts stand as measured"
            )
        if self.status == SpeculationStatus.NOT_COUNTED and self.draft_tokens is None:
            return (
                f"speculation not verified: draft {self.runner} {self.where}: neither per-request draft counts nor "
                "server spec-decode counters were recorded (give the endpoint a metrics_url)"
            )
        if self.status == SpeculationStatus.NOT_COUNTED:
            return (
                f"speculation not verified: {seen}, and its output token ids did not come back, so what they imply "
                "cannot be told (an api that returns token ids, such as llama_cpp, lets gate tell)"
            )
        return f"speculated: {seen} ({implied})"


@dataclass
class ServerRecord:
    """A served engine as gate saw it, one per runner: `kind` (the runner kind), `endpoint`
    (base URL; for a managed llama-server, the last one it listened on), `command` (the
    command line of a server gate started, else None), `version` (what the server said of
    itself), `peak_rss_bytes` (a managed server's peak resident set, VmHWM summed over its
    process tree, max over the times it was started; None where gate did not start it),
    `verification` (how the server verifies proposals, where gate knows it: vLLM's
    rejection_sample_method, e.g. "standard"; None: unknown or no speculation) and `lossless`
    (whether that method keeps the target's law; None: unknown). A draft whose server says
    lossless False gets a Failure at stage "verification": no exactness or speedup rule on it
    passes. `kv_pool_tokens` / `kv_pool_bytes`: the KV cache the server preallocated, in
    tokens (blocks x block size) and in bytes as the server counts them; `served_dtype`: the
    weights' dtype it serves at ("bfloat16"); None where the server does not say."""

    runner: str
    kind: str
    endpoint: str | None = None
    command: list[str] | None = None
    version: str | None = None
    peak_rss_bytes: int | None = None
    verification: str | None = None
    lossless: bool | None = None
    kv_pool_tokens: int | None = None
    kv_pool_bytes: int | None = None
    served_dtype: str | None = None
    slots: int | None = None  # requests the server admits at once (llama.cpp slots, vLLM max-num-seqs), where known


@dataclass
class ProbeSequence:
    """The target's logits on one fixed probe prompt (gate.loop.identity.PROBE_PROMPTS),
    stored compactly: at every position i of `token_ids` (the logits predicting token i + 1,
    the last one included), the `top_ids[i]` most likely token ids, their raw logits
    `top_logits[i]` (float32, descending) and `logsumexp[i]` over the whole vocabulary, so
    the probability of a stored token is exp(logit - logsumexp) and the mass outside them is
    1 - the stored probabilities' sum (gate.loop.identity.sparse_tv bounds TV with it)."""

    prompt: str
    token_ids: list[int]
    top_ids: list[list[int]]
    top_logits: list[list[float]]
    logsumexp: list[float]


@dataclass
class ReleaseComparison:
    """The loaded target against the pinned release (policy `target.release`).

    classification: "unchanged target" (identical weights and config, or a probe within
    `tolerance_logits`: the drafts are verified proposals and exactness against the
    release's law is the criterion) or "updated target" (its exactness is judged against
    its own law, its quality against the release by drift). `reason`: one sentence with the
    figures; `differences`: what differs (fingerprint, config fields, probe tokens, probe
    logits). Probe figures (None: not compared, e.g. a release given by fingerprint only):
    `probe_max_abs_logit_diff` max |logit_loaded - logit_release| over the positions compared
    and over the release's stored top tokens (a report) or the whole vocabulary (a release
    model); `probe_tv_max`/`probe_tv_mean` TV of the raw law (temperature 1) per position,
    exact for a release model; from a report their guaranteed lower bounds, with
    `probe_tv_error` the widest interval high - low (gate.loop.identity.sparse_tv)."""

    release: str  # how the release was given: "fingerprint", "report <path>" or "model <source>"
    fingerprint: str | None  # the release's weights fingerprint (gate.models.loading.fingerprint)
    config_digest: str | None  # the release's architecture digest (None: not known, fingerprint only)
    classification: str
    reason: str
    differences: list[str] = field(default_factory=list)
    tolerance_logits: float = 0.0
    probe_positions: int = 0
    probe_max_abs_logit_diff: float | None = None
    probe_tv_max: float | None = None
    probe_tv_mean: float | None = None
    probe_tv_error: float | None = None  # widest TV interval from a stored probe; 0 when exact (release model)
    modifying_drafts: list[str] = field(default_factory=list)  # drafts whose kind ships a changed target

    @property
    def updated(self) -> bool:
        return self.classification == "updated target"


@dataclass
class TargetIdentity:
    """The loaded target's identity, written in every in-process report so that a saved
    report can pin a release later: `fingerprint` (gate.models.loading.fingerprint of the loaded
    weights, at `dtype`), `config` (its architecture fields, gate.loop.identity.ARCH_KEYS)
    and `config_digest` (first 16 hex digits of sha256 over them), and the logit `probe` on
    the fixed prompts (top `probe_top_k` per position). `probe_error`: why the probe could not
    be taken (then `probe` is empty); `release`: the comparison with the pinned release."""

    fingerprint: str
    dtype: str
    config: dict[str, Any]
    config_digest: str
    probe_top_k: int
    probe: list[ProbeSequence] = field(default_factory=list)
    probe_error: str | None = None
    release: ReleaseComparison | None = None


@dataclass
class DriftRecord:
    """The loaded (updated) target's law p against the release's law r under one declared
    law, per position of one fallback continuation (the ones overlap is measured along),
    both teacher-forced on the same tokens and processed by the same law.

    tv[i] = 1/2 sum_x |p_i(x) - r_i(x)| (in [0, 1]); kl[i] = KL(p_i || r_i) = sum_x p_i(x)
    log(p_i(x) / r_i(x)) in nats, terms with p_i(x) = 0 counting 0; None where it is
    infinite (p_i puts mass on a token r_i excludes: a greedy argmax that moved, or a top-k /
    top-p set that changed); top1[i] = argmax p_i == argmax r_i."""

    law: str
    prompt_id: str
    category: str
    tv: list[float]
    kl: list[float | None]
    top1: list[bool]
    context_length: int | None = None
    draft: str = "target"  # what drifted: the run's target (rules on drift apply to every draft's scope)
    constraint: str | None = None  # the workload.constraints label of the prompt variant, else None


@dataclass
class TokenizerComparison:
    """The target's tokenizer against a draft's (gate.measure.tokenizers.compare_tokenizers),
    as llama.cpp's draft checks compare them: vocabulary sizes, the first id whose token
    differs and both tokens there (None: no id differs), the special ids (BOS, EOS, PAD, UNK),
    the ids each adds before plain text (`*_adds_prefix`: [BOS] for a tokenizer that adds
    one, [] for none: an add-BOS difference), and `shared_tokens`, the tokens of the draft
    whose decoded text is also one target token's (special tokens left out): the support a
    shared-vocabulary mapping can propose on. `identical`: same vocabulary and special ids."""

    draft: str
    target_class: str
    draft_class: str
    target_vocab_size: int
    draft_vocab_size: int
    identical: bool
    first_differing_id: int | None
    first_differing_target: str | None
    first_differing_draft: str | None
    target_bos_token_id: int | None
    draft_bos_token_id: int | None
    target_eos_token_id: int | None
    draft_eos_token_id: int | None
    target_pad_token_id: int | None
    draft_pad_token_id: int | None
    target_unk_token_id: int | None
    draft_unk_token_id: int | None
    target_adds_prefix: list[int]
    draft_adds_prefix: list[int]
    shared_tokens: int


@dataclass
class ProbeRecord:
    """One probe of an envelope search (gate.load.search): the workload at `load` (concurrency,
    or requests/s), `repetitions` windows. Per repetition: `throughputs` (committed output
    tokens/s over the window), `good_shares` (share of its requests meeting every load.goodput
    SLO), `itl_p99_ms` (p99 of its inter-token gaps; None: no gaps), `tpot_mean_ms` (mean
    TPOT of its clean requests: 1000 / it is the per-user speed). `requests` measured and
    `failed`, `excluded` (contended or client delayed: timing left them out), the search's
    `verdict` ("held", "slo", "saturation", "inconclusive", "failed") and `why`."""

    load: float
    requests: int
    failed: int
    excluded: int
    throughputs: list[float]
    good_shares: list[float]
    itl_p99_ms: list[float | None]
    verdict: str
    why: str
    saturated: bool = False
    tpot_mean_ms: list[float | None] = field(default_factory=list)  # per repetition: mean TPOT of its clean requests


@dataclass
class EnvelopeRecord:
    """The envelope search of one runner and law: every SLO held at `lower` (None: not even at
    the first probe), something failed at `upper` (None: nothing up to the maximum); the load
    searched (`over`: "concurrency" or "request_rate"), why it stopped (`stop`: "slo",
    "saturation", "max", "budget", "inconclusive", "failed", "interrupted"), the SLOs (`slo_ms`, ms; `itl_p99_ms`;
    `min_good_share`), the probes in run order and the wall time it took (s)."""

    runner: str
    law: str
    over: str
    lower: float | None
    upper: float | None
    stop: str
    probes: list[ProbeRecord]
    wall_s: float
    slo_ms: dict[str, float] = field(default_factory=dict)
    itl_p99_ms: float | None = None
    min_good_share: float = 0.9

    @property
    def integer(self) -> bool:
        """Whether the load is a whole number (concurrency)."""
        return self.over == "concurrency"

    def bounds(self) -> tuple[float, float]:
        """(least, greatest) SLO load the search allows: `lower` (0 when None) and the greatest
        load below `upper` (concurrency: upper - 1; a rate: upper itself, a supremum; inf when
        None)."""
        least = self.lower if self.lower is not None else 0.0
        if self.upper is None:
            return least, float("inf")
        return least, (self.upper - 1 if self.integer else self.upper)

    def shown(self) -> str:
        """The interval as reports show it: "concurrency [4, 5)", "request rate [2.1, 2.4)/s";
        "[16, max)" when every SLO held up to the maximum, "[2, ?)" when the search stopped
        before anything failed (budget, an inconclusive or failed probe)."""

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:g}" if self.integer else f"{v:.3g}"

        hi = ("max" if self.stop == "max" else "?") if self.upper is None else f(self.upper)
        unit = "/s" if not self.integer else ""
        return f"{self.over.replace('_', ' ')} [{f(self.lower)}, {hi}){unit}"


@dataclass
class Measurements:
    """Everything measured in one run; the input of rule evaluation and the JSON report."""

    environment: Environment
    requests: list[RequestRecord] = field(default_factory=list)
    overlaps: list[OverlapRecord] = field(default_factory=list)
    exactness: list[ExactnessRecord] = field(default_factory=list)
    samples: list[SampleRecord] = field(default_factory=list)  # served exactness: the short sampled requests
    sample_wall_s: dict[str, float] = field(default_factory=dict)  # "<runner>/<law>" -> wall seconds its samples took
    bills: list[BillRecord] = field(default_factory=list)
    process_peak_rss_bytes: int | None = None
    cuda_max_memory_allocated_bytes: int | None = None
    cuda_max_memory_reserved_bytes: int | None = None
    failures: list[Failure] = field(default_factory=list)
    drafts: dict[str, DraftInfo] = field(default_factory=dict)  # name -> what the draft is
    workload: WorkloadInfo | None = None
    laws: list[str] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)  # the measured windows (timed requests per runner and law)
    servers: list[ServerRecord] = field(default_factory=list)  # served runners' engines (empty in-process)
    tokenizers: list[TokenizerComparison] = field(
        default_factory=list
    )  # cross-tokenizer drafts' tokenizers against the target's
    target_identity: TargetIdentity | None = None  # the loaded target's identity and its release comparison
    drift: list[DriftRecord] = field(default_factory=list)  # the target's law against the release's (release.model)
    notes: list[str] = field(
        default_factory=list
    )  # what the measuring said about itself (contention reruns stopped); reported
    envelopes: list[EnvelopeRecord] = field(default_factory=list)  # load.search: one per runner and law
    probe_requests: list[RequestRecord] = field(default_factory=list)  # load.search: its probes' requests, raw
    speculation: list[SpeculationRecord] = field(
        default_factory=list
    )  # did each draft runner speculate (per law, load point)
