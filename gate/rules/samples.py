"""Samples of a metric for one runner (draft or fallback), law and category set, taken from
raw records, and their aggregation. Never runs a model.

Pooled aggregations pool counters (vLLM) or totals (all tokens / all seconds); they never
average per-request ratios.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gate.records import FALLBACK, Measurements, RequestRecord, SpecDecodeCounters


@dataclass(frozen=True)
class Selection:
    """Which records a value is computed from. None: every value of that field.
    `max_new_tokens` does not filter overlap records (overlap does not depend on it)."""

    runner: str  # a draft name or "fallback"
    law: str
    categories: tuple[str, ...] | None  # None: all
    context_length: int | None = None  # a context-sweep length (tokens)
    max_new_tokens: int | None = None

    def takes(self, record: Any) -> bool:
        """Whether a request or overlap record belongs to this selection."""
        return (record.draft == self.runner and record.law == self.law
                and (self.categories is None or record.category in self.categories)
                and (self.context_length is None or getattr(record, "context_length", None) == self.context_length)
                and (self.max_new_tokens is None or getattr(record, "max_new_tokens", self.max_new_tokens) == self.max_new_tokens))

    def of(self, runner: str) -> "Selection":
        """The same cells for another runner (the fallback, or a baseline's draft)."""
        return replace(self, runner=runner)


def _requests(m: Measurements, sel: Selection) -> list[RequestRecord]:
    return [r for r in m.requests if sel.takes(r)]


def samples(metric: str, m: Measurements, sel: Selection, line: str | None = None) -> list[float]:
    """Raw samples of `metric` (see gate.metrics for what one sample is). NaNs are dropped."""
    reqs = _requests(m, sel)
    values: list[float]
    if metric in ("overlap", "top1_agreement"):
        values = []
        for o in m.overlaps:
            if sel.takes(o):
                seq = o.overlap if metric == "overlap" else o.top1
                values += [float(v) for v in seq if v is not None]
    elif metric == "committed_tokens_per_s":
        values = [r.committed_tokens_per_s for r in reqs]
    elif metric == "ttft_ms":
        values = [r.ttft_ms for r in reqs]
    elif metric == "itl_ms":
        values = [x for r in reqs for x in r.itl_ms]
    elif metric == "itl_chunk_ms":
        values = [x for r in reqs for x in r.itl_chunk_ms]
    elif metric == "tpot_ms":
        values = [r.tpot_ms for r in reqs]
    elif metric == "e2el_ms":
        values = [r.e2el_ms for r in reqs]
    elif metric == "kv_cache_bytes":
        values = [float(r.kv_cache_bytes + r.draft_kv_cache_bytes) for r in reqs]
    elif metric == "memory_bill_bytes":
        values = [float(b.total_bytes) for b in m.bills if b.draft == sel.runner]
    elif metric == "memory_line_bytes":
        values = [float(x.bytes) for b in m.bills if b.draft == sel.runner for x in b.lines if x.name == line]
    elif metric in ("memory_headroom_bytes", "extra_sequences"):
        budgets = [b.budget for b in m.bills if b.draft == sel.runner and b.budget is not None]
        values = [float(x.headroom_bytes if metric == "memory_headroom_bytes" else x.extra_sequences) for x in budgets]
    elif metric in ("request_speedup", "request_acceptance_rate"):
        from gate.rules.units import units  # per-request values built in one place (units imports this module)

        u = units(metric, "mean", m, sel)
        values = [float(v) for a in (u.values if u else []) for v in a]
    elif metric == "process_peak_rss_bytes":
        values = [float(m.process_peak_rss_bytes)] if m.process_peak_rss_bytes is not None else []
    else:
        raise KeyError(f"no sample extraction for metric {metric!r}")
    return [v for v in values if not math.isnan(v)]


def pooled(metric: str, m: Measurements, sel: Selection) -> tuple[float, int]:
    """A pooled value and the number of requests it pools (NaN when there is nothing)."""
    reqs = _requests(m, sel)
    if metric == "committed_tokens_per_s":
        seconds = sum(r.e2el_ms for r in reqs) / 1e3
        return (sum(r.output_tokens for r in reqs) / seconds if seconds > 0 else float("nan")), len(reqs)
    counters = sum((r.counters for r in reqs), SpecDecodeCounters())
    if metric == "acceptance_rate":
        return counters.acceptance_rate, len(reqs)
    if metric == "mean_acceptance_length":
        return counters.mean_acceptance_length, len(reqs)
    raise KeyError(f"metric {metric!r} has no pooled aggregation")


def aggregate(values: list[float], aggregation: str) -> float:
    """mean, median, p10, p90, p95, p99 (linear interpolation between order statistics), min, max."""
    if not values:
        return float("nan")
    arr = np.asarray(values, dtype=float)
    if aggregation == "mean":
        return float(arr.mean())
    if aggregation == "median":
        return float(np.median(arr))
    if aggregation in ("p10", "p90", "p95", "p99"):
        return float(np.percentile(arr, float(aggregation[1:])))
    if aggregation == "min":
        return float(arr.min())
    if aggregation == "max":
        return float(arr.max())
    raise KeyError(f"unknown aggregation {aggregation!r}")


def value(metric: str, aggregation: str, m: Measurements, sel: Selection, line: str | None = None) -> tuple[float, int]:
    """The aggregated value and its sample count (requests for pooled metrics)."""
    if aggregation == "pooled":
        return pooled(metric, m, sel)
    xs = samples(metric, m, sel, line)
    return aggregate(xs, aggregation), len(xs)


__all__ = ["FALLBACK", "Selection", "aggregate", "pooled", "samples", "value"]
