"""One summary row per (runner, law): the figures the console table and the JSON report show.

Rates come from pooled counters and totals, speedup from pooled throughput (all output
tokens / all E2E seconds, draft over fallback on the same prompts and law)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gate.records import FALLBACK, Measurements, SpecDecodeCounters
from gate.rules.samples import Selection, aggregate, pooled, samples


@dataclass
class SummaryRow:
    """Figures for one runner under one law (NaN-free: missing values are None)."""

    runner: str
    law: str
    requests: int
    output_tokens: int
    overlap_mean: float | None
    overlap_by_category: dict[str, float]  # mean overlap per prompt category
    top1_agreement: float | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
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


def _clean(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def _by_category(m: Measurements, runner: str, law: str) -> dict[str, float]:
    cats = sorted({o.category for o in m.overlaps if o.draft == runner and o.law == law})
    out = {c: aggregate(samples("overlap", m, Selection(runner, law, (c,))), "mean") for c in cats}
    return {c: v for c, v in out.items() if not math.isnan(v)}


def summarize(m: Measurements) -> list[SummaryRow]:
    """Rows for the fallback and every draft under every law, in policy order."""
    rows: list[SummaryRow] = []
    for law in m.laws:
        fallback_tps, _ = pooled("committed_tokens_per_s", m, Selection(FALLBACK, law, None))
        for runner in [FALLBACK, *m.drafts]:
            sel = Selection(runner, law, None)
            reqs = [r for r in m.requests if r.draft == runner and r.law == law]
            counters = sum((r.counters for r in reqs), SpecDecodeCounters())
            tps, _ = pooled("committed_tokens_per_s", m, sel)
            itl = samples("itl_ms", m, sel)
            bill = next((b.total_bytes for b in m.bills if b.draft == runner), None)
            kv = samples("kv_cache_bytes", m, sel)
            rows.append(SummaryRow(
                runner=runner, law=law, requests=len(reqs), output_tokens=sum(r.output_tokens for r in reqs),
                overlap_mean=_clean(aggregate(samples("overlap", m, sel), "mean")) if runner != FALLBACK else None,
                overlap_by_category={} if runner == FALLBACK else _by_category(m, runner, law),
                top1_agreement=_clean(aggregate(samples("top1_agreement", m, sel), "mean")) if runner != FALLBACK else None,
                acceptance_rate=_clean(counters.acceptance_rate),
                mean_acceptance_length=_clean(counters.mean_acceptance_length),
                acceptance_rate_per_pos=[x for x in counters.acceptance_rate_per_pos if not math.isnan(x)],
                accepted_length_histogram=counters.accepted_length_histogram,
                committed_tokens_per_s=_clean(tps),
                speedup=_clean(tps / fallback_tps) if fallback_tps and not math.isnan(fallback_tps) else None,
                ttft_p50_ms=_clean(aggregate(samples("ttft_ms", m, sel), "median")),
                itl_p50_ms=_clean(aggregate(itl, "median")),
                itl_p99_ms=_clean(aggregate(itl, "p99")),
                tpot_mean_ms=_clean(aggregate(samples("tpot_ms", m, sel), "mean")),
                memory_bill_bytes=bill,
                kv_cache_bytes_max=int(max(kv)) if kv else None,
            ))
    return rows
