"""The catalogue of metrics a rule can bind to: name, dimension, aggregations, meaning, and
the flags every other layer reads (how it is sampled, whether clocks move it, whether more
repetitions can settle it, whether it is a ratio rather than a share).

A built-in metric is declared once, here; a new one is one module whose registration line
is ``gate.rules.samples.register_metric(Metric(...), extract)`` (the declaration with how its
samples are taken), made before gate.policy is imported (the policy's rules[].metric values
are METRICS' names then). TIMED, REPEATABLE, COMPUTED_ONCE, RATIO_NOT_SHARE, PER_REQUEST,
PER_TOKEN and RESAMPLED are derived from the declarations, read when asked (so they include
a metric registered later). How a metric's samples are taken from measurement records is in
``gate.rules.samples.SAMPLES`` (checked at import against METRICS); this module imports
nothing from the rules (rules never run models, and measurements never know about rules).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Set
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal

from gate.core.units import Dimension
from gate.records import FailureStage

SAMPLE_AGGREGATIONS = ("mean", "median", "p10", "p90", "p95", "p99", "min", "max")
POOLED = "pooled"
# How a metric is sampled: one value per position of a target continuation, per request,
# per token or step of a request (at most max_new_tokens per request), pooled counters or
# totals only, or computed / measured once per draft (bills, process peaks: no sampling distribution).
Sampling = Literal["position", "request", "token", "pooled", "once"]
# Which runners measure a metric: every runner, only gate's in-process loop (its step counters,
# the caches and drafts it holds: gate.runners.interface.Capabilities.in_process), or only a
# runner at load points (windows of requests in flight together: Capabilities.load_points).
MeasuredBy = Literal["any", "in_process", "load_points"]
# What else of the policy a metric needs to be measured at all (gate.policy.model checks it):
# the device memory the budget is for, the released target's weights, a goodput SLO, or a
# draft that translates between tokenizers.
Needs = Literal["resources.capacity", "target.release.model", "load.goodput", "translating_draft"]


@dataclass(frozen=True)
class Metric:
    """One metric: its unit's dimension, allowed aggregations, what one sample is, and its flags.

    sampling: see Sampling. timed: read from clocks, so a contended machine distorts it and
    its verdicts leave contended requests out (gate.measure.contention). repeatable: more
    timed repetitions can settle an inconclusive verdict (gate check's extra repetitions;
    overlap is measured once, on repetition 0). ratio_not_share: dimensionless but not a
    share, so a percentage threshold ('5%' would read as 0.05x) is refused. failure_stage: the
    stage (gate.records.Failure.stage) whose failures leave the metric unmeasured; failures of
    the whole run ("run") always do. better: the direction of an improvement ("higher" for
    rates, overlap and speedups; "lower" for times, bytes and losses), which `gate compare`
    reads. ratio_to_fallback: a draft's ratio to the fallback by its definition (paired
    requests), so its verdicts rest on the fallback's requests too. measured_by: see
    MeasuredBy. needs: see Needs (None: nothing beyond the runner). takes_line: a rule on it
    names one line of the bill (rules[].line). takes_position: a rule on it names one proposal
    position (rules[].position, 1-based). between_tokens: a time between a stream's
    tokens, which a client that stamps late can make look shorter. of_proposals: its
    denominator is the draft's proposals, so it is undefined where the draft made none.
    counts: what a dimensionless count counts ("sequences"; None: not a count). share: a
    share of something, in [0, 1] by its definition (its intervals keep to that range).
    on_accelerator: measured only on an accelerator (device memory); without one a rule on
    it is skipped, saying "not measured: no accelerator", and nothing fails for it.
    includes_server_headers: a served request's time that includes the server's time to
    answer its headers (server_headers_ms), which its verdicts state beside it."""

    name: str
    dimension: Dimension
    aggregations: tuple[str, ...]
    sample: str  # what one sample is, for messages and docs
    fallback_has_it: bool  # whether the non-speculative fallback produces it (relative_to)
    description: str
    _: KW_ONLY
    sampling: Sampling
    timed: bool
    repeatable: bool
    ratio_not_share: bool = False
    share: bool = False
    better: Literal["higher", "lower"]
    failure_stage: FailureStage = FailureStage.REQUEST  # failures of this stage leave the metric unmeasured
    ratio_to_fallback: bool = False
    measured_by: MeasuredBy = "any"
    needs: Needs | None = None
    takes_line: bool = False
    takes_position: bool = False
    between_tokens: bool = False
    of_proposals: bool = False
    counts: str | None = None
    on_accelerator: bool = False
    includes_server_headers: bool = False

    @property
    def computed_once(self) -> bool:
        """Computed or measured once per draft: decided on the value itself, no interval, no breakdown."""
        return self.sampling == "once"


OVERLAP = Metric(
    "overlap",
    Dimension.RATIO,
    SAMPLE_AGGREGATIONS,
    "one position of a target continuation",
    False,
    "sum_x min(p(x), q(x)) under the declared law (Leviathan et al. 2023, Sec. 3): the per-step acceptance probability",
    sampling="position",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.OVERLAP,
    better="higher",
    measured_by="in_process",
    share=True,
)

TOP1_AGREEMENT = Metric(
    "top1_agreement",
    Dimension.RATIO,
    SAMPLE_AGGREGATIONS,
    "one position of a target continuation",
    False,
    "1 when argmax q equals argmax p at a position (diagnostic only; not the acceptance probability under sampling)",
    sampling="position",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.OVERLAP,
    better="higher",
    measured_by="in_process",
    share=True,
)

ACCEPTANCE_RATE = Metric(
    "acceptance_rate",
    Dimension.RATIO,
    (POOLED,),
    "pooled counters",
    False,
    "num_accepted_tokens / num_draft_tokens, counters pooled across requests (vLLM)",
    sampling="pooled",
    timed=False,
    repeatable=True,
    better="higher",
    of_proposals=True,
    share=True,
)

POSITION_ACCEPTANCE_RATE = Metric(
    "position_acceptance_rate",
    Dimension.RATIO,
    (POOLED,),
    "pooled counters",
    False,
    "the share of verification steps whose proposal reached position k (rules[].position) that committed it: "
    "num_accepted_tokens_per_pos[k] over the steps proposing k or more tokens (vLLM's per-position rate divides by "
    "every step, which reads low where K varies per step; gate's counters know each step's K, a server's do not: "
    "there it is vLLM's num_drafts, and the verdict says so)",
    sampling="pooled",
    timed=False,
    repeatable=True,
    better="higher",
    of_proposals=True,
    share=True,
    takes_position=True,
)

CONDITIONAL_ACCEPTANCE_RATE = Metric(
    "conditional_acceptance_rate",
    Dimension.RATIO,
    (POOLED,),
    "pooled counters",
    False,
    "the share of verification steps that committed the proposal at position k (rules[].position) among those "
    "that committed position k - 1 and proposed k or more tokens: accepted at k given k - 1 accepted (position 1: "
    "position_acceptance_rate); a collapse at k shows here even when earlier positions already thin the steps",
    sampling="pooled",
    timed=False,
    repeatable=True,
    better="higher",
    of_proposals=True,
    share=True,
    takes_position=True,
)

MEAN_ACCEPTANCE_LENGTH = Metric(
    "mean_acceptance_length",
    Dimension.TOKENS,
    (POOLED,),
    "pooled counters",
    False,
    "num_committed_tokens / num_drafts: committed tokens per verification step with a proposal (vLLM's mean "
    "acceptance length, "
    "1 + num_accepted_tokens / num_drafts, except where an output ends inside an accepted block)",
    sampling="pooled",
    timed=False,
    repeatable=True,
    better="higher",
    of_proposals=True,
)

SPEEDUP = Metric(
    "speedup",
    Dimension.RATIO,
    (POOLED,),
    "paired requests",
    False,
    "the draft's pooled committed tokens/s over the fallback's on the same cells (paired, interleaved requests)",
    sampling="pooled",
    timed=True,
    repeatable=True,
    ratio_not_share=True,
    better="higher",
    ratio_to_fallback=True,
)

REQUEST_SPEEDUP = Metric(
    "request_speedup",
    Dimension.RATIO,
    SAMPLE_AGGREGATIONS,
    "one paired request",
    False,
    "a request's committed tokens/s over its paired fallback request's: p10 is the slowest decile, "
    "mean of (draft < fallback) the share slower than the fallback",
    sampling="request",
    timed=True,
    repeatable=False,
    ratio_not_share=True,
    better="higher",
    ratio_to_fallback=True,
)

REQUEST_ACCEPTANCE_RATE = Metric(
    "request_acceptance_rate",
    Dimension.RATIO,
    SAMPLE_AGGREGATIONS,
    "one speculative request with proposals",
    False,
    "one request's num_accepted_tokens / num_draft_tokens: its distribution shows the low-acceptance requests",
    sampling="request",
    timed=False,
    repeatable=False,
    better="higher",
    measured_by="in_process",
    of_proposals=True,
    share=True,
)

COMMITTED_TOKENS_PER_S = Metric(
    "committed_tokens_per_s",
    Dimension.RATE,
    SAMPLE_AGGREGATIONS + (POOLED,),
    "one request",
    True,
    "output tokens / E2E latency per request; pooled = all output tokens / all E2E time",
    sampling="request",
    timed=True,
    repeatable=True,
    better="higher",
)

TTFT_MS = Metric(
    "ttft_ms",
    Dimension.TIME_MS,
    SAMPLE_AGGREGATIONS,
    "one request",
    True,
    "time from request start to the first committed token (prefill and first sample)",
    sampling="request",
    timed=True,
    repeatable=True,
    better="lower",
    includes_server_headers=True,
)

ITL_MS = Metric(
    "itl_ms",
    Dimension.TIME_MS,
    SAMPLE_AGGREGATIONS,
    "one committed token after the first",
    True,
    "inter-token latency, token by token: a step committing k tokens yields its gap and k-1 gaps of 0",
    sampling="token",
    timed=True,
    repeatable=True,
    better="lower",
    between_tokens=True,
)

ITL_CHUNK_MS = Metric(
    "itl_chunk_ms",
    Dimension.TIME_MS,
    SAMPLE_AGGREGATIONS,
    "one verification step after the first token",
    True,
    "inter-token latency per streamed chunk (vLLM's bench convention): one gap per step, whatever it commits",
    sampling="token",
    timed=True,
    repeatable=True,
    better="lower",
    between_tokens=True,
)

TPOT_MS = Metric(
    "tpot_ms",
    Dimension.TIME_MS,
    SAMPLE_AGGREGATIONS,
    "one request with 2+ output tokens",
    True,
    "(E2E latency - TTFT) / (output tokens - 1)",
    sampling="request",
    timed=True,
    repeatable=True,
    better="lower",
    between_tokens=True,
)

E2EL_MS = Metric(
    "e2el_ms",
    Dimension.TIME_MS,
    SAMPLE_AGGREGATIONS,
    "one request",
    True,
    "end-to-end latency of a request",
    sampling="request",
    timed=True,
    repeatable=True,
    better="lower",
    includes_server_headers=True,
)

OUTPUT_THROUGHPUT = Metric(
    "output_throughput",
    Dimension.RATE,
    (POOLED,),
    "one measured window (a runner at a load point)",
    True,
    "output tokens / window duration (first send to last byte), pooled over windows: tokens/s at the offered "
    "load (vLLM bench serve's output token throughput)",
    sampling="pooled",
    timed=True,
    repeatable=True,
    better="higher",
    measured_by="load_points",
)

REQUEST_THROUGHPUT = Metric(
    "request_throughput",
    Dimension.REQUEST_RATE,
    (POOLED,),
    "one measured window (a runner at a load point)",
    True,
    "completed requests / window duration (requests/s)",
    sampling="pooled",
    timed=True,
    repeatable=True,
    better="higher",
    measured_by="load_points",
)

GOODPUT = Metric(
    "goodput",
    Dimension.REQUEST_RATE,
    (POOLED,),
    "one measured window (a runner at a load point)",
    True,
    "requests meeting every load.goodput SLO (TTFT, TPOT, E2EL) / window duration (vLLM's --goodput), requests/s",
    sampling="pooled",
    timed=True,
    repeatable=True,
    better="higher",
    measured_by="load_points",
    needs="load.goodput",
)

QUEUE_MS = Metric(
    "queue_ms",
    Dimension.TIME_MS,
    SAMPLE_AGGREGATIONS,
    "one served request",
    True,
    "client queue time: from the request's scheduled arrival to its send (open loop capped by max_concurrency)",
    sampling="request",
    timed=True,
    repeatable=True,
    better="lower",
    measured_by="load_points",
)

SERVER_HEADERS_MS = Metric(
    "server_headers_ms",
    Dimension.TIME_MS,
    SAMPLE_AGGREGATIONS,
    "one served request whose response headers came before its first token",
    True,
    "the server's time to answer a request's headers: from the request leaving the client to the response's "
    "headers, where they came before the first token (a server that sends them with its first token gives none); "
    "its accept queue, its threads, its request handling before it streams: a part of TTFT that is the server's",
    sampling="request",
    timed=True,
    repeatable=True,
    better="lower",
    measured_by="load_points",
)

MEMORY_BILL_BYTES = Metric(
    "memory_bill_bytes",
    Dimension.BYTES,
    ("max",),
    "one bill per draft and law",
    True,
    "predicted resident bytes at the peak: weights, KV caches, verification slots, logits (see gate bill)",
    sampling="once",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.BILL,
    better="lower",
)

MEMORY_LINE_BYTES = Metric(
    "memory_line_bytes",
    Dimension.BYTES,
    ("max",),
    "one bill line per draft (the rule's `line`)",
    True,
    "one line of the bill, e.g. 'draft KV cache' or 'target logits' (see gate bill)",
    sampling="once",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.BILL,
    better="lower",
    takes_line=True,
)

MEMORY_HEADROOM_BYTES = Metric(
    "memory_headroom_bytes",
    Dimension.BYTES,
    ("min",),
    "one budget per draft",
    True,
    "resources.capacity minus the bill total (needs resources.capacity)",
    sampling="once",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.BILL,
    better="higher",
    needs="resources.capacity",
)

EXTRA_SEQUENCES = Metric(
    "extra_sequences",
    Dimension.RATIO,
    ("min",),
    "one budget per draft",
    True,
    "more sequences of the same context that fit in the headroom (needs resources.capacity)",
    sampling="once",
    timed=False,
    repeatable=False,
    ratio_not_share=True,
    failure_stage=FailureStage.BILL,
    better="higher",
    needs="resources.capacity",
    counts="sequences",
)

KV_CACHE_BYTES = Metric(
    "kv_cache_bytes",
    Dimension.BYTES,
    SAMPLE_AGGREGATIONS,
    "one request",
    True,
    "measured bytes of the target and draft KV cache tensors at the end of a request",
    sampling="request",
    timed=False,
    repeatable=True,
    better="lower",
    measured_by="in_process",
)

PROCESS_PEAK_RSS_BYTES = Metric(
    "process_peak_rss_bytes",
    Dimension.BYTES,
    ("max",),
    "one run of gate check",
    True,
    "peak resident set size of the gate process (CPU) as reported by the OS",
    sampling="once",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.RUN,
    better="lower",
)

# The accelerator's measured peak (gate.measure.device_memory), beside the bill's prediction.
DEVICE_PEAK_ALLOCATED_BYTES = Metric(
    "device_peak_allocated_bytes",
    Dimension.BYTES,
    ("max",),
    "one peak per runner and law",
    True,
    "highest torch.cuda.max_memory_allocated over the runner's requests (reset before each), less the weights of "
    "drafts loaded beside it that it does not use: what the bill's total predicts (CUDA, in-process)",
    sampling="once",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.DEVICE_MEMORY,
    better="lower",
    measured_by="in_process",
    on_accelerator=True,
)

DEVICE_PEAK_RESERVED_BYTES = Metric(
    "device_peak_reserved_bytes",
    Dimension.BYTES,
    ("max",),
    "one peak per runner and law",
    True,
    "highest torch.cuda.max_memory_reserved over the runner's requests (the caching allocator's segments, "
    "including blocks cached by earlier requests), less the weights of drafts it does not use (CUDA, in-process)",
    sampling="once",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.DEVICE_MEMORY,
    better="lower",
    measured_by="in_process",
    on_accelerator=True,
)

UNACCOUNTED_DEVICE_BYTES = Metric(
    "unaccounted_device_bytes",
    Dimension.BYTES,
    ("max",),
    "one peak per runner and law",
    True,
    "device_peak_allocated_bytes minus the bill's total: what the bill did not predict (negative: it over-predicts)",
    sampling="once",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.DEVICE_MEMORY,
    better="lower",
    measured_by="in_process",
    on_accelerator=True,
)

SERVER_DEVICE_BYTES = Metric(
    "server_device_bytes",
    Dimension.BYTES,
    ("max",),
    "one server per runner",
    True,
    "device memory NVML says the process tree of a server gate started uses (highest sample: at ready, after "
    "each run, before each stop), beside the served bill",
    sampling="once",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.DEVICE_MEMORY,
    better="lower",
    measured_by="load_points",
    on_accelerator=True,
)

# Cross-tokenizer drafts (gate.drafts.cross_tokenizer): the mapping cost measured apart from the draft's
# forwards.
MAPPING_MS = Metric(
    "mapping_ms",
    Dimension.TIME_MS,
    SAMPLE_AGGREGATIONS,
    "one verification step with a draft call",
    False,
    "time a step's proposal spent translating between the draft's and the target's tokenizers (decoding, "
    "re-encoding, mapping q), ms; 0 for drafts that share the target's tokenizer",
    sampling="token",
    timed=True,
    repeatable=True,
    better="lower",
    measured_by="in_process",
    needs="translating_draft",
)

MAPPING_SHARE = Metric(
    "mapping_share",
    Dimension.RATIO,
    SAMPLE_AGGREGATIONS,
    "one speculative request",
    False,
    "a request's total translation time over its E2E latency: the share of latency the tokenizer mapping costs",
    sampling="request",
    timed=True,
    repeatable=True,
    better="lower",
    measured_by="in_process",
    needs="translating_draft",
    share=True,
)

TRANSLATION_LOSS = Metric(
    "translation_loss",
    Dimension.RATIO,
    (POOLED,),
    "pooled counters",
    False,
    "proposals lost in translation: 1 - target tokens verified / tokens the draft proposed in its own "
    "vocabulary, pooled over requests (negative where the target's tokenizer splits the text finer)",
    sampling="pooled",
    timed=False,
    repeatable=True,
    better="lower",
    measured_by="in_process",
    needs="translating_draft",
)

# The run's target against the pinned release (target.release.model), along the fallback continuations
# (gate.loop.identity.drift_along); the same values for every draft's scope: the target drifted, not a draft.
TARGET_DRIFT_TV = Metric(
    "target_drift_tv",
    Dimension.RATIO,
    SAMPLE_AGGREGATIONS,
    "one position of a target continuation",
    False,
    "1/2 sum_x |p(x) - r(x)|: total variation between the loaded target's law p and the release's r under the "
    "declared law (needs target.release.model)",
    sampling="position",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.DRIFT,
    better="lower",
    needs="target.release.model",
    share=True,
)

TARGET_DRIFT_KL = Metric(
    "target_drift_kl",
    Dimension.RATIO,
    SAMPLE_AGGREGATIONS,
    "one position of a target continuation",
    False,
    "KL(p || r) in nats, the loaded target's law p against the release's r under the declared law; +inf where "
    "p "
    "puts mass on a token r excludes (needs target.release.model)",
    sampling="position",
    timed=False,
    repeatable=False,
    ratio_not_share=True,
    failure_stage=FailureStage.DRIFT,
    better="lower",
    needs="target.release.model",
)

TARGET_DRIFT_TOP1 = Metric(
    "target_drift_top1",
    Dimension.RATIO,
    SAMPLE_AGGREGATIONS,
    "one position of a target continuation",
    False,
    "1 when the loaded target's argmax equals the release's at a position (needs target.release.model)",
    sampling="position",
    timed=False,
    repeatable=False,
    failure_stage=FailureStage.DRIFT,
    better="higher",
    needs="target.release.model",
    share=True,
)


# Every metric a rule can bind to, by name: the built-in ones above in this order, then those
# added (gate.rules.samples.register_metric).
METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        OVERLAP,
        TOP1_AGREEMENT,
        ACCEPTANCE_RATE,
        POSITION_ACCEPTANCE_RATE,
        CONDITIONAL_ACCEPTANCE_RATE,
        MEAN_ACCEPTANCE_LENGTH,
        SPEEDUP,
        REQUEST_SPEEDUP,
        REQUEST_ACCEPTANCE_RATE,
        COMMITTED_TOKENS_PER_S,
        TTFT_MS,
        ITL_MS,
        ITL_CHUNK_MS,
        TPOT_MS,
        E2EL_MS,
        OUTPUT_THROUGHPUT,
        REQUEST_THROUGHPUT,
        GOODPUT,
        QUEUE_MS,
        SERVER_HEADERS_MS,
        MEMORY_BILL_BYTES,
        MEMORY_LINE_BYTES,
        MEMORY_HEADROOM_BYTES,
        EXTRA_SEQUENCES,
        KV_CACHE_BYTES,
        PROCESS_PEAK_RSS_BYTES,
        DEVICE_PEAK_ALLOCATED_BYTES,
        DEVICE_PEAK_RESERVED_BYTES,
        UNACCOUNTED_DEVICE_BYTES,
        SERVER_DEVICE_BYTES,
        MAPPING_MS,
        MAPPING_SHARE,
        TRANSLATION_LOSS,
        TARGET_DRIFT_TV,
        TARGET_DRIFT_KL,
        TARGET_DRIFT_TOP1,
    )
}


def add(metric: Metric) -> Metric:
    """Add `metric` to METRICS, after the built-in ones. Returns `metric`. Raises ValueError
    when another metric has its name. Called by gate.rules.samples.register_metric, which
    also says how its samples are taken (a metric without that cannot be decided)."""
    if metric.name in METRICS:
        raise ValueError(f"metric {metric.name!r} is already in the catalogue (gate.metrics.catalogue.METRICS)")
    METRICS[metric.name] = metric
    return metric


class MetricNames(Set[str]):
    """The names of METRICS' metrics that `has` holds for, in catalogue order, read from
    METRICS on every use (a metric added later is in it). A read-only set of str: `in`,
    iteration, len, and set operators (which return frozensets)."""

    def __init__(self, has: Callable[[Metric], bool]):
        self._has = has

    def __contains__(self, name: object) -> bool:
        metric = METRICS.get(name) if isinstance(name, str) else None
        return metric is not None and self._has(metric)

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, m in METRICS.items() if self._has(m)])

    def __len__(self) -> int:
        return sum(1 for m in METRICS.values() if self._has(m))

    @classmethod
    def _from_iterable(cls, it: Any) -> frozenset[str]:  # type: ignore[override]  # Set's is generic in its item
        return frozenset(it)


# Metrics read from clocks: a contended machine (gate.measure.contention) distorts them, so
# their verdicts leave contended requests out. Overlap, acceptance and bills do not depend on it.
TIMED = MetricNames(lambda m: m.timed)
# Metrics whose verdicts more timed repetitions can settle (overlap is measured once, on repetition 0).
REPEATABLE = MetricNames(lambda m: m.repeatable)
# Computed or measured once per draft (bills, process peaks): no interval, no breakdown by `per`.
COMPUTED_ONCE = MetricNames(lambda m: m.computed_once)
# Every metric with a sampling distribution: all but those computed or measured once (gate.rules.resampling resamples
# them).
RESAMPLED = MetricNames(lambda m: not m.computed_once)
# Dimensionless metrics that are not shares: a percentage threshold is a mistake there ('5%' would be 0.05x).
RATIO_NOT_SHARE = MetricNames(lambda m: m.ratio_not_share)
# One sample per request, and one per token or step of a request (gate.rules.power counts them).
PER_REQUEST = MetricNames(lambda m: m.sampling == "request")
PER_TOKEN = MetricNames(lambda m: m.sampling == "token")
# Metrics that are a draft's ratio to the fallback by definition (paired requests).
FALLBACK_RATIOS = MetricNames(lambda m: m.ratio_to_fallback)
# Measured only on an accelerator: without one their rules are skipped, not failed.
ON_ACCELERATOR = MetricNames(lambda m: m.on_accelerator)


def compares_with_fallback(metric: str, relative_to: str | None) -> bool:
    """Whether a rule's value compares a runner with the fallback: a fallback ratio by
    definition (FALLBACK_RATIOS) or a metric taken relative_to the fallback."""
    return relative_to == "fallback" or metric in FALLBACK_RATIOS
