"""One summary row per (runner, law): the figures the console table and the JSON report show.

Rates come from pooled counters and totals, speedup from pooled throughput (all output
tokens / all E2E seconds, draft over fallback on the same prompts and law). Breakdowns by
category and by context length pool their own requests the same way, so their counters
and tokens add up to the row's totals (never averaged ratios)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gate.metrics.catalogue import (
    COMMITTED_TOKENS_PER_S,
    DEVICE_PEAK_ALLOCATED_BYTES,
    DEVICE_PEAK_RESERVED_BYTES,
    ITL_MS,
    KV_CACHE_BYTES,
    OVERLAP,
    REQUEST_ACCEPTANCE_RATE,
    REQUEST_SPEEDUP,
    SERVER_DEVICE_BYTES,
    TOP1_AGREEMENT,
    TPOT_MS,
    TTFT_MS,
    Metric,
)
from gate.records import FALLBACK, Measurements, RequestRecord, SpecDecodeCounters
from gate.rules.samples import Selection, aggregate, device_memory_unmeasured, pooled, samples


@dataclass
class Breakdown:
    """One runner's figures on one slice of the workload (a category or a context length)."""

    requests: int
    output_tokens: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    overlap_mean: float | None
    acceptance_rate: float | None  # pooled counters of the slice
    mean_acceptance_length: float | None
    speedup: float | None  # pooled committed tokens/s over the fallback's on the slice's cells
    slower_than_fallback: float | None  # share of paired requests with lower committed tokens/s than the fallback's


@dataclass
class SummaryRow:
    """Figures for one runner under one law (NaN-free: missing values are None)."""

    runner: str
    law: str
    requests: int
    output_tokens: int
    overlap_mean: float | None
    top1_agreement: float | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None  # committed tokens per step with a proposal
    acceptance_rate_per_pos: list[float]
    accepted_length_histogram: list[int]
    committed_tokens_per_s: float | None  # pooled
    speedup: float | None  # pooled committed tokens/s over the fallback's
    ttft_p50_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    tpot_mean_ms: float | None
    memory_bill_bytes: int | None
    kv_cache_bytes_max: int | None  # measured, target + draft cache tensors
    vllm_mean_acceptance_length: float | None = None  # 1 + accepted / drafts (vLLM's formula; see SpecDecodeCounters)
    num_committed_tokens: int = 0  # tokens committed by steps with a proposal
    request_acceptance_rate_p10: float | None = None  # the distribution of per-request acceptance: the low tail
    request_acceptance_rate_p50: float | None = None
    slower_than_fallback: float | None = None  # share of paired requests slower than their fallback request
    request_speedup_p10: float | None = None  # the slowest decile of per-request speedups
    # the accelerator's measured peak beside the bill (in-process: the allocator's allocated and reserved peaks over
    # the runner's requests; served: the server's NVML figure); None: not measured, device_memory_note says why
    device_peak_bytes: int | None = None
    device_reserved_bytes: int | None = None
    device_memory_note: str | None = None
    by_category: dict[str, Breakdown] = field(default_factory=dict)
    by_context_length: dict[str, Breakdown] = field(default_factory=dict)
    by_constraint: dict[str, Breakdown] = field(
        default_factory=dict
    )  # workload.constraints label -> figures, in policy order


def _clean(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def _figure(metric: Metric, aggregation: str, m: Measurements, sel: Selection) -> float | None:
    """`aggregation` of `metric`'s samples on `sel` (None: no sample)."""
    return _clean(aggregate(samples(metric.name, m, sel), aggregation))


def _counters(m: Measurements, sel: Selection, reqs: list[RequestRecord]) -> SpecDecodeCounters:
    """Spec-decode counters of a selection: pooled over its requests' per-step counts, or, for
    served requests (none), over the server counter deltas of its whole windows."""
    counts = [r.counters for r in reqs if r.counters is not None]
    if counts or not reqs:
        return sum(counts, SpecDecodeCounters())
    if not sel.whole_windows:
        return SpecDecodeCounters()
    return sum((w.counters for w in m.runs if sel.takes_window(w) and w.counters is not None), SpecDecodeCounters())


def breakdown(m: Measurements, sel: Selection) -> Breakdown:
    """Pooled figures of one runner on one selection of cells."""
    reqs = [r for r in m.requests if sel.takes(r)]
    counters = _counters(m, sel, reqs)
    fallback_tps, _ = pooled(COMMITTED_TOKENS_PER_S.name, m, sel.of(FALLBACK))
    tps, _ = pooled(COMMITTED_TOKENS_PER_S.name, m, sel)
    return Breakdown(
        requests=len(reqs),
        output_tokens=sum(r.output_tokens for r in reqs),
        num_drafts=counters.num_drafts,
        num_draft_tokens=counters.num_draft_tokens,
        num_accepted_tokens=counters.num_accepted_tokens,
        overlap_mean=_figure(OVERLAP, "mean", m, sel) if sel.runner != FALLBACK else None,
        acceptance_rate=_clean(counters.acceptance_rate),
        mean_acceptance_length=_clean(counters.mean_acceptance_length),
        speedup=_clean(tps / fallback_tps) if fallback_tps and not math.isnan(fallback_tps) else None,
        slower_than_fallback=_slower_share(m, sel),
    )


def _slower_share(m: Measurements, sel: Selection) -> float | None:
    """Share of the runner's paired requests with lower committed tokens/s than their fallback request."""
    ratios = samples(REQUEST_SPEEDUP.name, m, sel) if sel.runner != FALLBACK else []
    return sum(x < 1 for x in ratios) / len(ratios) if ratios else None


def _by_constraint(m: Measurements, sel: Selection, reqs: list[RequestRecord]) -> dict[str, Breakdown]:
    """Pooled figures per workload.constraints label, in the workload's order (first seen
    when the report has no workload record); empty when the requests carry no label."""
    seen = [c for c in (getattr(r, "constraint", None) for r in reqs) if c is not None]
    declared = (
        list(m.workload.constraints) if m.workload is not None and getattr(m.workload, "constraints", None) else []
    )
    labels = [c for c in declared if c in seen] + [c for c in dict.fromkeys(seen) if c not in declared]
    return {c: breakdown(m, replace(sel, constraints=(c,))) for c in labels}


def summarize(m: Measurements) -> list[SummaryRow]:
    """Rows for the fallback and every draft under every law, in policy order."""
    rows: list[SummaryRow] = []
    for law in m.laws:
        fallback_tps, _ = pooled(COMMITTED_TOKENS_PER_S.name, m, Selection(FALLBACK, law, None))
        for runner in [FALLBACK, *m.drafts]:
            sel = Selection(runner, law, None)
            reqs = [r for r in m.requests if r.draft == runner and r.law == law]
            counters = _counters(m, sel, reqs)
            tps, _ = pooled(COMMITTED_TOKENS_PER_S.name, m, sel)
            itl = samples(ITL_MS.name, m, sel)
            bill = next((b.total_bytes for b in m.bills if b.draft == runner), None)
            kv = samples(KV_CACHE_BYTES.name, m, sel)
            peak, reserved, note = _device_memory(m, sel)
            rows.append(
                SummaryRow(
                    runner=runner,
                    law=law,
                    requests=len(reqs),
                    output_tokens=sum(r.output_tokens for r in reqs),
                    overlap_mean=_figure(OVERLAP, "mean", m, sel) if runner != FALLBACK else None,
                    top1_agreement=_figure(TOP1_AGREEMENT, "mean", m, sel) if runner != FALLBACK else None,
                    acceptance_rate=_clean(counters.acceptance_rate),
                    mean_acceptance_length=_clean(counters.mean_acceptance_length),
                    vllm_mean_acceptance_length=_clean(counters.vllm_mean_acceptance_length),
                    num_committed_tokens=counters.num_committed_tokens,
                    acceptance_rate_per_pos=[x for x in counters.acceptance_rate_per_pos if not math.isnan(x)],
                    accepted_length_histogram=counters.accepted_length_histogram,
                    committed_tokens_per_s=_clean(tps),
                    speedup=_clean(tps / fallback_tps) if fallback_tps and not math.isnan(fallback_tps) else None,
                    ttft_p50_ms=_figure(TTFT_MS, "median", m, sel),
                    itl_p50_ms=_clean(aggregate(itl, "median")),
                    itl_p99_ms=_clean(aggregate(itl, "p99")),
                    tpot_mean_ms=_figure(TPOT_MS, "mean", m, sel),
                    memory_bill_bytes=bill,
                    kv_cache_bytes_max=int(max(kv)) if kv else None,
                    request_acceptance_rate_p10=_figure(REQUEST_ACCEPTANCE_RATE, "p10", m, sel),
                    request_acceptance_rate_p50=_figure(REQUEST_ACCEPTANCE_RATE, "median", m, sel),
                    slower_than_fallback=_slower_share(m, sel),
                    request_speedup_p10=_figure(REQUEST_SPEEDUP, "p10", m, sel),
                    by_category={
                        c: breakdown(m, replace(sel, categories=(c,))) for c in sorted({r.category for r in reqs})
                    },
                    by_context_length={
                        str(n): breakdown(m, replace(sel, context_length=n))
                        for n in sorted({r.context_length for r in reqs if r.context_length is not None})
                    },
                    by_constraint=_by_constraint(m, sel, reqs),
                    device_peak_bytes=peak,
                    device_reserved_bytes=reserved,
                    device_memory_note=note,
                )
            )
    return rows


def _device_memory(m: Measurements, sel: Selection) -> tuple[int | None, int | None, str | None]:
    """The runner's measured device peak: (allocated or the server's, reserved, None), or
    (None, None, why not measured)."""
    allocated = samples(DEVICE_PEAK_ALLOCATED_BYTES.name, m, sel)
    if allocated:
        reserved = samples(DEVICE_PEAK_RESERVED_BYTES.name, m, sel)
        return int(max(allocated)), int(max(reserved)) if reserved else None, None
    served = samples(SERVER_DEVICE_BYTES.name, m, sel)
    if served:
        return int(max(served)), None, None
    why = device_memory_unmeasured(
        SERVER_DEVICE_BYTES.name if m.servers else DEVICE_PEAK_ALLOCATED_BYTES.name, m, sel.runner
    )
    return None, None, why[1] if why is not None else None
