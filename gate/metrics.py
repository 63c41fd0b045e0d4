"""The catalogue of metrics a rule can bind to: name, dimension, aggregations, meaning.

This module only names and describes metrics; how their samples are taken from
measurement records lives in ``gate.rules.samples`` (rules never run models, and
measurements never know about rules).
"""

from __future__ import annotations

from dataclasses import dataclass

from gate.units import Dimension

SAMPLE_AGGREGATIONS = ("mean", "median", "p10", "p90", "p95", "p99", "min", "max")
POOLED = "pooled"


@dataclass(frozen=True)
class Metric:
    """One metric: its unit's dimension, allowed aggregations and what one sample is."""

    name: str
    dimension: Dimension
    aggregations: tuple[str, ...]
    sample: str  # what one sample is, for messages and docs
    fallback_has_it: bool  # whether the non-speculative fallback produces it (relative_to)
    description: str


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("overlap", Dimension.RATIO, SAMPLE_AGGREGATIONS, "one position of a target continuation", False,
               "sum_x min(p(x), q(x)) under the declared law (Leviathan et al. 2023, Sec. 3): the per-step acceptance probability"),
        Metric("top1_agreement", Dimension.RATIO, SAMPLE_AGGREGATIONS, "one position of a target continuation", False,
               "1 when argmax q equals argmax p at a position (diagnostic only; not the acceptance probability under sampling)"),
        Metric("acceptance_rate", Dimension.RATIO, (POOLED,), "pooled counters", False,
               "num_accepted_tokens / num_draft_tokens, counters pooled across requests (vLLM)"),
        Metric("mean_acceptance_length", Dimension.TOKENS, (POOLED,), "pooled counters", False,
               "1 + num_accepted_tokens / num_drafts: committed tokens per verification step with a proposal (vLLM's mean acceptance length)"),
        Metric("speedup", Dimension.RATIO, (POOLED,), "paired requests", False,
               "the draft's pooled committed tokens/s over the fallback's on the same cells (paired, interleaved requests)"),
        Metric("request_speedup", Dimension.RATIO, SAMPLE_AGGREGATIONS, "one paired request", False,
               "a request's committed tokens/s over its paired fallback request's: p10 is the slowest decile, "
               "mean of (draft < fallback) the share slower than the fallback"),
        Metric("request_acceptance_rate", Dimension.RATIO, SAMPLE_AGGREGATIONS, "one speculative request with proposals", False,
               "one request's num_accepted_tokens / num_draft_tokens: its distribution shows the low-acceptance requests"),
        Metric("committed_tokens_per_s", Dimension.RATE, SAMPLE_AGGREGATIONS + (POOLED,), "one request", True,
               "output tokens / E2E latency per request; pooled = all output tokens / all E2E time"),
        Metric("ttft_ms", Dimension.TIME_MS, SAMPLE_AGGREGATIONS, "one request", True,
               "time from request start to the first committed token (prefill and first sample)"),
        Metric("itl_ms", Dimension.TIME_MS, SAMPLE_AGGREGATIONS, "one committed token after the first", True,
               "inter-token latency, token by token: a step committing k tokens yields its gap and k-1 gaps of 0"),
        Metric("itl_chunk_ms", Dimension.TIME_MS, SAMPLE_AGGREGATIONS, "one verification step after the first token", True,
               "inter-token latency per streamed chunk (vLLM's bench convention): one gap per step, whatever it commits"),
        Metric("tpot_ms", Dimension.TIME_MS, SAMPLE_AGGREGATIONS, "one request with 2+ output tokens", True,
               "(E2E latency - TTFT) / (output tokens - 1)"),
        Metric("e2el_ms", Dimension.TIME_MS, SAMPLE_AGGREGATIONS, "one request", True, "end-to-end latency of a request"),
        Metric("memory_bill_bytes", Dimension.BYTES, ("max",), "one bill per draft and law", True,
               "predicted resident bytes at the peak: weights, KV caches, verification slots, logits (see gate bill)"),
        Metric("memory_line_bytes", Dimension.BYTES, ("max",), "one bill line per draft (the rule's `line`)", True,
               "one line of the bill, e.g. 'draft KV cache' or 'target logits' (see gate bill)"),
        Metric("memory_headroom_bytes", Dimension.BYTES, ("min",), "one budget per draft", True,
               "resources.capacity minus the bill total (needs resources.capacity)"),
        Metric("extra_sequences", Dimension.RATIO, ("min",), "one budget per draft", True,
               "more sequences of the same context that fit in the headroom (needs resources.capacity)"),
        Metric("kv_cache_bytes", Dimension.BYTES, SAMPLE_AGGREGATIONS, "one request", True,
               "measured bytes of the target and draft KV cache tensors at the end of a request"),
        Metric("process_peak_rss_bytes", Dimension.BYTES, ("max",), "one run of gate check", True,
               "peak resident set size of the gate process (CPU) as reported by the OS"),
    )
}

# Metrics read from clocks: a contended machine (gate.measure.contention) distorts them, so
# their verdicts leave contended requests out. Overlap, acceptance and bills do not depend on it.
TIMED = frozenset({"committed_tokens_per_s", "speedup", "request_speedup", "ttft_ms", "tpot_ms", "e2el_ms", "itl_ms",
                   "itl_chunk_ms"})
