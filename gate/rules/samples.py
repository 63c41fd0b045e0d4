"""Samples of a metric for one runner (draft or fallback), law and category set, taken from
raw records, and their aggregation. Never runs a model.

How a metric's samples are taken is registered here once, next to nothing else: SAMPLES maps
every metric of gate.metrics.catalogue.METRICS to its extractor (a check at import fails when a
metric has none), REQUEST_SAMPLES gives a request's own samples and POOLED a request's
counters or totals for pooled aggregations (gate.rules.resampling groups both into resampling
units). Pooled aggregations pool counters (vLLM) or totals (all tokens / all seconds); they
never average per-request ratios.

A new metric is one module with one registration line, register_metric(Metric(...), extract):
its declaration goes into gate.metrics.catalogue.METRICS and its extractor into the table its sampling
reads (made before gate.policy is imported, it is a value of the policy's rules[].metric).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from gate.measure.device_memory import NO_ACCELERATOR, no_accelerator
from gate.metrics.catalogue import METRICS, Metric, add
from gate.records import (
    FALLBACK,
    DeviceMemoryRecord,
    DriftRecord,
    Measurements,
    OverlapRecord,
    RequestRecord,
    RunRecord,
    SpecDecodeCounters,
)
from gate.rules.selection import Selection, aggregate

# A metric's raw samples for one selection: (measurements, selection, bill line) -> values (NaNs allowed).
Extractor = Callable[[Measurements, Selection, "str | None"], list[float]]
# A cell's or a window's pairing key across runners (request_key, window_key): a tuple of its coordinates.
Key = tuple[Any, ...]


def _counts(r: RequestRecord | RunRecord) -> SpecDecodeCounters:
    """A record's spec-decode counters; zero where it has none (the callers keep only records
    with counts, so a zero here is never pooled)."""
    return r.counters if r.counters is not None else SpecDecodeCounters()


# metric -> one request's samples (ms, tokens/s, bytes, ratio; NaNs are dropped by the callers)
REQUEST_SAMPLES: dict[str, Callable[[RequestRecord], list[float]]] = {
    "committed_tokens_per_s": lambda r: [r.committed_tokens_per_s],
    "ttft_ms": lambda r: [r.ttft_ms],
    "itl_ms": lambda r: r.itl_ms,
    "itl_chunk_ms": lambda r: r.itl_chunk_ms,
    "tpot_ms": lambda r: [r.tpot_ms],
    "e2el_ms": lambda r: [r.e2el_ms],
    "kv_cache_bytes": lambda r: (
        []
        if r.kv_cache_bytes is None or r.draft_kv_cache_bytes is None  # not measured
        else [float(r.kv_cache_bytes + r.draft_kv_cache_bytes)]
    ),
    "request_acceptance_rate": lambda r: [r.counters.acceptance_rate] if r.counters is not None else [],
    "queue_ms": lambda r: [r.queue_ms] if r.queue_ms is not None else [],
    "server_headers_ms": lambda r: [r.server_headers_ms] if r.server_headers_ms is not None else [],
    "mapping_ms": lambda r: _mapping_steps(r),
    "mapping_share": lambda r: (
        [r.mapping_ms / r.e2el_ms] if r.step_mapping_ms is not None and r.draft != FALLBACK and r.e2el_ms > 0 else []
    ),
}
# pooled metric -> (numerator, denominator, offset) per request: value = offset + sum(num) / sum(den)
POOLED: dict[str, tuple[Callable[[RequestRecord], float], Callable[[RequestRecord], float], float]] = {
    "committed_tokens_per_s": (lambda r: r.output_tokens, lambda r: r.e2el_ms / 1e3, 0.0),
    "acceptance_rate": (lambda r: _accepted(r), lambda r: _drafted(r), 0.0),
    "mean_acceptance_length": (lambda r: _counts(r).num_committed_tokens, lambda r: _counts(r).num_drafts, 0.0),
    # 1 - verified / drafted, as offset + sum(-verified) / sum(drafted)
    "translation_loss": (lambda r: -float(sum(r.step_proposed or [])), lambda r: float(r.draft_tokens or 0), 1.0),
}


def _mapping_steps(r: RequestRecord) -> list[float]:
    """Mapping time (ms) of every step in which the draft was called (it drafted tokens in its
    own vocabulary); none for the fallback or a request without per-step mapping times."""
    if r.step_mapping_ms is None or r.draft == FALLBACK:
        return []
    drafted = r.step_draft_tokens or [0] * len(r.step_mapping_ms)
    return [ms for ms, n in zip(r.step_mapping_ms, drafted, strict=False) if n > 0]


def _accepted(r: RequestRecord) -> float:
    """Proposals committed: from per-step counts, else the server's per-response count (llama.cpp)."""
    c = r.counters
    return (
        c.num_accepted_tokens
        if c is not None
        else (r.server_accepted_tokens if r.server_accepted_tokens is not None else float("nan"))
    )


def _drafted(r: RequestRecord) -> float:
    """Proposals made: from per-step counts, else the server's per-response count (llama.cpp)."""
    c = r.counters
    return (
        c.num_draft_tokens
        if c is not None
        else (r.server_draft_tokens if r.server_draft_tokens is not None else float("nan"))
    )


def _at(xs: list[int], i: int) -> float:
    return float(xs[i]) if 0 <= i < len(xs) else 0.0


def position_parts(metric: str, k: int) -> tuple[Callable[[Any], float], Callable[[Any], float]]:
    """(numerator, denominator) of a per-position acceptance metric at proposal position `k`
    (1-based) over one record's counters (a request's, or a window's server counter deltas):
    position_acceptance_rate: committed at k over steps proposing k or more (gate's own
    counts), or over every step with a proposal where only a server's counters are known
    (vLLM's num_drafts); conditional_acceptance_rate: committed at k over steps that reached
    k (every earlier proposal committed, k proposed), or, from a server's counters, over
    steps that committed k - 1 (num_drafts at k = 1). Raises KeyError for another metric."""

    def drafted(r: Any) -> float:
        c = _counts(r)
        return _at(c.num_draft_tokens_per_pos, k - 1) if c.num_draft_tokens_per_pos else float(c.num_drafts)

    def reached(r: Any) -> float:
        c = _counts(r)
        if c.num_verified_per_pos:
            return _at(c.num_verified_per_pos, k - 1)
        return float(c.num_drafts) if k == 1 else _at(c.num_accepted_tokens_per_pos, k - 2)

    def accepted(r: Any) -> float:
        return _at(_counts(r).num_accepted_tokens_per_pos, k - 1)

    if metric == "position_acceptance_rate":
        return accepted, drafted
    if metric == "conditional_acceptance_rate":
        return accepted, reached
    raise KeyError(f"metric {metric!r} is not a per-position metric")


POSITION_METRICS = frozenset({"position_acceptance_rate", "conditional_acceptance_rate"})


def position_denominator(metric: str, k: int) -> str:
    """What the steps a per-position metric at position `k` divides by did, for messages
    ("proposed 3 or more tokens")."""
    if metric == "conditional_acceptance_rate":
        return f"committed every proposal before position {k}"
    return f"proposed {k} or more tokens"


def pooled_parts(metric: str, sel: Selection) -> tuple[Callable[[Any], float], Callable[[Any], float], float] | None:
    """(numerator, denominator, offset) per request of a pooled metric for `sel` (its
    position for a per-position metric); None for a metric pooled otherwise (speedup)."""
    if metric in POSITION_METRICS:
        num, den = position_parts(metric, sel.position or 1)
        return num, den, 0.0
    return POOLED.get(metric)


def window_parts(
    metric: str, sel: Selection
) -> tuple[Callable[[RunRecord], float], Callable[[RunRecord], float]] | None:
    """(numerator, denominator) per measured window of a window-pooled metric for `sel`
    (WINDOW_POOLED, or a per-position metric at sel.position from the server's counters);
    None for a metric not pooled over windows."""
    if metric in POSITION_METRICS:
        return position_parts(metric, sel.position or 1)
    return WINDOW_POOLED.get(metric)


def has_counts(metric: str, r: RequestRecord) -> bool:
    """Whether a request carries the counts a pooled acceptance metric needs: per-step counts,
    or (acceptance_rate) the server's per-response proposal counts."""
    return r.counters is not None or (metric == "acceptance_rate" and r.server_draft_tokens is not None)


# pooled metric -> (numerator, denominator) per measured window (gate.records.RunRecord): value = sum num / sum den.
# Throughput and goodput are window metrics; acceptance falls back to the windows' server counter deltas where the
# requests carry no per-step counts (served runners).
WINDOW_POOLED: dict[str, tuple[Callable[[RunRecord], float], Callable[[RunRecord], float]]] = {
    "output_throughput": (lambda w: w.committed_tokens, lambda w: w.duration_s),
    "request_throughput": (lambda w: w.requests, lambda w: w.duration_s),
    "goodput": (lambda w: float("nan") if w.good_requests is None else w.good_requests, lambda w: w.duration_s),
    "acceptance_rate": (lambda w: _counts(w).num_accepted_tokens, lambda w: _counts(w).num_draft_tokens),
    "mean_acceptance_length": (lambda w: _counts(w).num_committed_tokens, lambda w: _counts(w).num_drafts),
}
WINDOW_ONLY = frozenset({"output_throughput", "request_throughput", "goodput"})


def windows(m: Measurements, sel: Selection, metric: str) -> list[RunRecord]:
    """The measured windows a window-pooled metric of `sel` is computed from: whole windows
    only (a selection by category, length or context has none); for acceptance, only windows
    with server counter deltas."""
    if not sel.whole_windows:
        return []
    out = [w for w in getattr(m, "runs", []) if sel.takes_window(w)]
    return [w for w in out if w.counters is not None] if metric not in WINDOW_ONLY else out


def window_key(w: RunRecord) -> Key:
    """A window's pairing key across runners: its load point and repetition."""
    return (w.load.kind, w.load.concurrency, w.load.request_rate, w.repetition)


def uses_windows(metric: str, m: Measurements, sel: Selection) -> bool:
    """Whether a pooled metric is computed from windows: throughput and goodput always;
    acceptance when the selection's requests carry no per-step counters."""
    if metric in WINDOW_ONLY:
        return True
    if metric in ("acceptance_rate", "mean_acceptance_length") or metric in POSITION_METRICS:
        reqs = _requests(m, sel)
        return bool(reqs) and not any(has_counts(metric, r) for r in reqs)
    return False


# metric -> one overlap record's per-position samples (None: a position not measured)
CONTINUATION_SAMPLES: dict[str, Callable[[OverlapRecord], Sequence[float | bool | None]]] = {
    "overlap": lambda o: o.overlap,
    "top1_agreement": lambda o: o.top1,
}


# metric -> one drift record's per-position samples: the run's target against the pinned release
# (gate.records.DriftRecord); an infinite KL (stored as None: JSON has no infinity) is +inf here, so a ceiling fails.
DRIFT_SAMPLES: dict[str, Callable[[DriftRecord], Sequence[float | bool | None]]] = {
    "target_drift_tv": lambda d: d.tv,
    "target_drift_kl": lambda d: [math.inf if v is None else v for v in d.kl],
    "target_drift_top1": lambda d: d.top1,
}


def drift_records(m: Measurements, sel: Selection) -> list[DriftRecord]:
    """The drift records of a selection's law and categories, whatever its runner: the
    target drifted, so every draft's scope sees the same values."""
    return [d for d in getattr(m, "drift", []) if sel.of(d.draft).takes(d)]


def _requests(m: Measurements, sel: Selection) -> list[RequestRecord]:
    return [r for r in m.requests if sel.takes(r)]


def request_key(r: RequestRecord) -> Key:
    """The cell a request belongs to: the fallback and every draft share it (served: at
    the same load point)."""
    key: Key = (r.prompt_id, r.max_new_tokens, r.repetition)
    if r.concurrency is not None or r.request_rate is not None:
        key += (r.concurrency, r.request_rate)
    return key


def window_of(key: Key) -> tuple[Key, int] | None:
    """((concurrency, request_rate), repetition): the window a request_key (5 fields at a load
    point) or window_key (4 fields) was timed in. None for a request of gate's own loop (no
    load point: the runners ran cell by cell, back to back) and for a continuation."""
    if len(key) == 5:
        return (key[3], key[4]), key[2]
    if len(key) == 4:
        return (key[1], key[2]), key[3]
    return None


def paired_speedups(m: Measurements, sel: Selection) -> list[tuple[Key, float]]:
    """(cell key, the request's committed tokens/s over its paired fallback request's) for every
    request of the selection whose fallback request on the same cell was measured (> 0 tokens/s)."""
    fallback = {request_key(r): r for r in m.requests if sel.of(FALLBACK).takes(r)}
    out = []
    for r in _requests(m, sel):
        f = fallback.get(request_key(r))
        if f is not None and f.committed_tokens_per_s > 0 and r.committed_tokens_per_s == r.committed_tokens_per_s:
            out.append((request_key(r), r.committed_tokens_per_s / f.committed_tokens_per_s))
    return out


def _per_request(get: Callable[[RequestRecord], list[float]]) -> Extractor:
    return lambda m, sel, line: [v for r in _requests(m, sel) for v in get(r)]


def _per_position(get: Callable[[OverlapRecord], Sequence[float | bool | None]]) -> Extractor:
    return lambda m, sel, line: [float(v) for o in m.overlaps if sel.takes(o) for v in get(o) if v is not None]


def _device_peaks(m: Measurements, sel: Selection) -> list[DeviceMemoryRecord]:
    return [d for d in m.device_memory if d.runner == sel.runner and d.law == sel.law]


def _unaccounted(m: Measurements, sel: Selection) -> list[float]:
    """The runner's allocated peak less its bill's total (one bill per runner)."""
    bill = next((b.total_bytes for b in m.bills if b.draft == sel.runner), None)
    return [float(d.allocated_bytes - bill) for d in _device_peaks(m, sel)] if bill is not None else []


def device_memory_unmeasured(metric: str, m: Measurements, runner: str) -> tuple[bool, str] | None:
    """Why a device-memory metric (Metric.on_accelerator) has no value for `runner`: (skip,
    reason), skip True where there is no accelerator (the rule is skipped, nothing fails:
    gate.measure.device_memory); None for any other metric, or where it has a value."""
    if not METRICS[metric].on_accelerator:
        return None
    if metric == "server_device_bytes":
        server = next((x for x in m.servers if x.runner == runner), None)
        note = server.device_memory_note if server is not None else None
        if note is None:
            return None if server is not None and server.device_bytes is not None else (False, "not measured")
        return no_accelerator(note), f"not measured: {note}"
    if m.accelerator is None:
        return True, f"not measured: {NO_ACCELERATOR}"
    return None


def _budgets(m: Measurements, sel: Selection) -> list[Any]:
    return [b.budget for b in m.bills if b.draft == sel.runner and b.budget is not None]


# metric -> its raw samples; None: no raw samples (pooled counters or a ratio of pooled values,
# see pooled() and gate.rules.confidence.estimand). Every metric of gate.metrics.catalogue has an entry.
SAMPLES: dict[str, Extractor | None] = {
    **{name: _per_position(get) for name, get in CONTINUATION_SAMPLES.items()},
    **{
        name: (
            # the outer lambda binds `get` per item (the inner one reads its parameter, not the loop's)
            lambda get: lambda m, sel, line: [float(v) for d in drift_records(m, sel) for v in get(d) if v is not None]  # noqa: B023
        )(get)
        for name, get in DRIFT_SAMPLES.items()
    },
    "acceptance_rate": None,
    "mean_acceptance_length": None,
    "position_acceptance_rate": None,
    "conditional_acceptance_rate": None,
    "speedup": None,
    "output_throughput": None,
    "request_throughput": None,
    "goodput": None,
    "translation_loss": None,
    "request_speedup": lambda m, sel, line: [v for _, v in paired_speedups(m, sel)],
    **{name: _per_request(get) for name, get in REQUEST_SAMPLES.items()},
    "memory_bill_bytes": lambda m, sel, line: [float(b.total_bytes) for b in m.bills if b.draft == sel.runner],
    "memory_line_bytes": lambda m, sel, line: [
        float(x.bytes) for b in m.bills if b.draft == sel.runner for x in b.lines if x.name == line
    ],
    "memory_headroom_bytes": lambda m, sel, line: [float(x.headroom_bytes) for x in _budgets(m, sel)],
    "extra_sequences": lambda m, sel, line: [float(x.extra_sequences) for x in _budgets(m, sel)],
    "process_peak_rss_bytes": lambda m, sel, line: (
        [float(m.process_peak_rss_bytes)] if m.process_peak_rss_bytes is not None else []
    ),
    "device_peak_allocated_bytes": lambda m, sel, line: [float(d.allocated_bytes) for d in _device_peaks(m, sel)],
    "device_peak_reserved_bytes": lambda m, sel, line: [float(d.reserved_bytes) for d in _device_peaks(m, sel)],
    "unaccounted_device_bytes": lambda m, sel, line: _unaccounted(m, sel),
    "server_device_bytes": lambda m, sel, line: [
        float(x.device_bytes) for x in m.servers if x.runner == sel.runner and x.device_bytes is not None
    ],
}


def _check_registry() -> None:
    """Every metric of the catalogue says how its samples are taken (and nothing else does)."""
    missing, unknown = set(METRICS) - set(SAMPLES), (set(SAMPLES) | set(POOLED) | set(REQUEST_SAMPLES)) - set(METRICS)
    if missing or unknown:
        raise RuntimeError(
            f"gate.rules.samples.SAMPLES does not match gate.metrics.catalogue.METRICS: no extractor for "
            f"{sorted(missing)}; not a metric: {sorted(unknown)}"
        )


_check_registry()


def register_metric(metric: Metric, extract: Callable[..., Any]) -> Metric:
    """Add `metric` to the catalogue (gate.metrics.catalogue.METRICS) with how its samples are taken,
    by its sampling: "request" or "token": `extract(RequestRecord) -> list[float]`, one
    request's samples (NaNs are dropped), resampled by request; "position":
    `extract(OverlapRecord) -> list[float | None]`, one continuation's per-position samples
    (None: a position not measured), resampled by continuation; "once": an Extractor
    `(Measurements, Selection, bill line) -> list[float]`, decided on the value itself.
    Returns `metric`. Raises ValueError for a name already in the catalogue, and for a
    "pooled" metric (pooled counters or window totals need their case in pooled())."""
    if metric.sampling == "pooled":
        raise ValueError(f"metric {metric.name!r}: a pooled metric needs its case in gate.rules.samples.pooled()")
    add(metric)
    if metric.sampling == "position":
        CONTINUATION_SAMPLES[metric.name] = extract
        SAMPLES[metric.name] = _per_position(extract)
    elif metric.sampling == "once":
        SAMPLES[metric.name] = extract
    else:  # "request" or "token": a request's samples
        REQUEST_SAMPLES[metric.name] = extract
        SAMPLES[metric.name] = _per_request(extract)
    return metric


def samples(metric: str, m: Measurements, sel: Selection, line: str | None = None) -> list[float]:
    """Raw samples of `metric` (see gate.metrics.catalogue for what one sample is). NaNs are dropped.
    Raises KeyError for a metric without raw samples (pooled only) or not in the catalogue."""
    extract = SAMPLES.get(metric)
    if extract is None:
        raise KeyError(f"no sample extraction for metric {metric!r}")
    return [v for v in extract(m, sel, line) if not math.isnan(v)]


def pooled(metric: str, m: Measurements, sel: Selection) -> tuple[float, int]:
    """A pooled value and the number of requests it pools (NaN when there is nothing).

    committed_tokens_per_s is the throughput of the measured windows (gate.records.RunRecord):
    committed tokens over the time the runner was busy. Where every window of the selection's
    runner and law was run one request at a time (sequential load, concurrency 1) its busy
    time is the sum of its requests' E2E latencies, so the value is computed from the
    requests (any subset a rule selects); a window with more requests in flight counts its
    own busy time, and then only a selection of whole windows (no category, length or
    context filter) has a value. Acceptance metrics pool per-step counters; NaN when a
    request has none (a runner without step counters)."""
    if uses_windows(metric, m, sel):
        ws = windows(m, sel, metric)
        parts_w = window_parts(metric, sel)
        if parts_w is None:
            raise KeyError(f"metric {metric!r} is not pooled over windows")
        w_num, w_den = parts_w
        w_total = sum(w_den(w) for w in ws)
        return (sum(w_num(w) for w in ws) / w_total if w_total > 0 else float("nan")), sum(w.requests for w in ws)
    reqs = _requests(m, sel)
    if metric == "committed_tokens_per_s":
        mine = [w for w in getattr(m, "runs", []) if sel.takes_window(w)]
        if any(w.load.concurrency != 1 for w in mine):
            busy = sum(w.busy_s for w in mine)
            rate = sum(w.committed_tokens for w in mine) / busy if sel.whole_windows and busy > 0 else float("nan")
            return rate, sum(w.requests for w in mine)
        seconds = sum(r.e2el_ms for r in reqs) / 1e3
        return (sum(r.output_tokens for r in reqs) / seconds if seconds > 0 else float("nan")), len(reqs)
    if metric == "acceptance_rate" and any(
        r.counters is None for r in reqs
    ):  # served: the server's per-response counts
        if not all(has_counts(metric, r) for r in reqs):
            return float("nan"), len(reqs)
        drafted = sum(_drafted(r) for r in reqs)
        return (sum(_accepted(r) for r in reqs) / drafted if drafted > 0 else float("nan")), len(reqs)
    counts = [r.counters for r in reqs if r.counters is not None]
    if len(counts) < len(reqs):
        return float("nan"), len(reqs)
    counters = sum(counts, SpecDecodeCounters())
    if metric == "acceptance_rate":
        return counters.acceptance_rate, len(reqs)
    if metric == "mean_acceptance_length":
        return counters.mean_acceptance_length, len(reqs)
    parts = pooled_parts(metric, sel)
    if parts is not None:  # a ratio of per-request totals (translation_loss, the per-position rates)
        num, den, offset = parts
        total = sum(den(r) for r in reqs)
        return (offset + sum(num(r) for r in reqs) / total if total > 0 else float("nan")), len(reqs)
    raise KeyError(f"metric {metric!r} has no pooled aggregation")


def value(metric: str, aggregation: str, m: Measurements, sel: Selection, line: str | None = None) -> tuple[float, int]:
    """The aggregated value and its sample count (requests for pooled metrics)."""
    if aggregation == "pooled":
        return pooled(metric, m, sel)
    xs = samples(metric, m, sel, line)
    return aggregate(xs, aggregation), len(xs)


__all__ = [
    "CONTINUATION_SAMPLES",
    "FALLBACK",
    "POOLED",
    "POSITION_METRICS",
    "REQUEST_SAMPLES",
    "SAMPLES",
    "Selection",
    "WINDOW_POOLED",
    "aggregate",
    "paired_speedups",
    "pooled",
    "pooled_parts",
    "position_denominator",
    "register_metric",
    "request_key",
    "samples",
    "uses_windows",
    "value",
    "window_key",
    "window_parts",
    "windows",
]
