"""Served runs at their load points: one row per runner, law and load point, and each
draft's crossover. Never runs a model; reads requests and measured windows only.

Speedup at a load point is the draft's pooled committed tokens over E2E time divided by
the fallback's, on the same prompts at the same load point and repetition (paired
requests, bootstrap interval as for every speedup, gate.rules.confidence). In a closed
loop at concurrency c that ratio is the ratio of output throughputs: by Little's law
(Little 1961, L = lambda W) throughput = c * sum(tokens) / sum(E2EL) at steady state, and c
cancels. In an open loop below saturation both runners carry the offered rate, and the
ratio is how much faster each request streams at that rate. Output and request throughput
and goodput are measured over the windows themselves (tokens or requests / window duration).

The crossover of a draft is the lowest load point at which its whole speedup interval lies
below 1.0x: from there on the draft costs more than it saves (vLLM #50851: 2.1x at
concurrency 1, 0.77x at 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gate.records import FALLBACK, Measurements
from gate.rules.confidence import bootstrap_interval, estimand
from gate.rules.samples import pooled
from gate.rules.selection import Selection, aggregate


@dataclass
class LoadPoint:
    """One runner under one law at one load point. Times in ms, throughputs in tokens/s or
    requests/s (goodput: requests meeting every SLO per s); acceptance from the server's
    counter deltas over the windows; speedup with its interval (drafts only). None: not
    measured (no request, no counters, no SLO, fewer than 5 paired requests for an interval)."""

    runner: str
    law: str
    kind: str  # "concurrency" or "request_rate"
    value: float  # the concurrency or the rate (requests/s)
    requests: int
    output_throughput: float | None = None
    request_throughput: float | None = None
    goodput: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    step_p50_ms: float | None = None  # gap between bursts (one verification step as the client sees it)
    tpot_mean_ms: float | None = None
    e2el_p50_ms: float | None = None
    queue_p99_ms: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    tokens_per_burst: float | None = None  # client cross-check: mean tokens per streamed burst after the first
    acceptance_per_pos: list[float] | None = None  # the server's accepted_per_pos / drafts over its windows here
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None

    @property
    def label(self) -> str:
        """Short, for table cells: 'c=4' or '2 req/s'."""
        return f"c={self.value:g}" if self.kind == "concurrency" else f"{self.value:g} req/s"

    @property
    def name(self) -> str:
        """For sentences: 'concurrency 4' or 'request rate 2/s'."""
        return f"concurrency {self.value:g}" if self.kind == "concurrency" else f"request rate {self.value:g}/s"


@dataclass
class Crossover:
    """Where a draft stops paying under one law along one load axis: `at` is the lowest load
    point whose speedup interval lies wholly below 1.0x (None: none does); `message` says so."""

    draft: str
    law: str
    kind: str
    at: float | None
    message: str


def _clean(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _points(m: Measurements) -> list[tuple[str, float]]:
    out: set[tuple[str, float]] = set()
    for r in m.requests:
        if r.concurrency is not None:
            out.add(("concurrency", float(r.concurrency)))
        elif r.request_rate is not None:
            out.add(("request_rate", float(r.request_rate)))
    return sorted(out)


def _per_position(m: Measurements, runner: str, law: str, kind: str, value: float) -> list[float] | None:
    """Acceptance at each proposal position (num_accepted_tokens_per_pos / num_drafts, as
    vLLM's `vllm bench serve` reports it) over the runner's windows at one load point; None
    where the server gives no per-position counts."""
    total = None
    for w in m.runs:
        at = w.load.concurrency if kind == "concurrency" else w.load.request_rate
        if w.runner != runner or w.law != law or w.counters is None or at is None or float(at) != value or \
                (kind == "concurrency" and w.load.request_rate is not None):
            continue
        total = w.counters if total is None else total + w.counters
    if total is None or not total.num_drafts or not total.num_accepted_tokens_per_pos:
        return None
    return [round(x, 4) for x in total.acceptance_rate_per_pos]


def _selection(runner: str, law: str, kind: str, value: float) -> Selection:
    if kind == "concurrency":
        return Selection(runner, law, None, concurrency=(int(value),))
    return Selection(runner, law, None, request_rate=(value,))


def load_summary(m: Measurements, confidence: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[list[LoadPoint], list[Crossover]]:
    """Every runner's row at every load point of a served run (empty in-process), and each
    draft's crossover per law and load axis."""
    points = _points(m)
    if not points:
        return [], []
    rows: list[LoadPoint] = []
    runners = [FALLBACK, *m.drafts]
    for law in m.laws:
        for kind, value in points:
            for runner in runners:
                sel = _selection(runner, law, kind, value)
                reqs = [r for r in m.requests if sel.takes(r)]
                if not reqs:
                    continue
                row = LoadPoint(runner, law, kind, value, len(reqs))
                row.output_throughput = _clean(pooled("output_throughput", m, sel)[0])
                row.request_throughput = _clean(pooled("request_throughput", m, sel)[0])
                row.goodput = _clean(pooled("goodput", m, sel)[0])
                ttft = [r.ttft_ms for r in reqs if r.token_times_ms]
                itl = [x for r in reqs for x in r.itl_ms]
                steps = [x for r in reqs for x in r.itl_chunk_ms]
                tpot = [r.tpot_ms for r in reqs if r.output_tokens > 1]
                queue = [r.queue_ms for r in reqs if r.queue_ms is not None]
                row.ttft_p50_ms, row.ttft_p99_ms = _clean(aggregate(ttft, "median")), _clean(aggregate(ttft, "p99"))
                row.itl_p50_ms, row.itl_p99_ms = _clean(aggregate(itl, "median")), _clean(aggregate(itl, "p99"))
                row.step_p50_ms = _clean(aggregate(steps, "median"))
                row.tpot_mean_ms = _clean(aggregate(tpot, "mean"))
                row.e2el_p50_ms = _clean(aggregate([r.e2el_ms for r in reqs], "median"))
                row.queue_p99_ms = _clean(aggregate(queue, "p99"))
                bursts = [k for r in reqs for k in (r.step_committed or [])[1:]]
                row.tokens_per_burst = _clean(aggregate([float(k) for k in bursts], "mean"))
                if runner != FALLBACK:
                    row.acceptance_rate = _clean(pooled("acceptance_rate", m, sel)[0])
                    row.mean_acceptance_length = _clean(pooled("mean_acceptance_length", m, sel)[0])
                    row.acceptance_per_pos = _per_position(m, runner, law, kind, value)
                    est = estimand("speedup", "pooled", m, sel)
                    if est is not None and all(g[0].n for g in est.groups):
                        row.speedup = _clean(est.point())
                        interval = bootstrap_interval(est, confidence, resamples, seed)
                        if interval is not None:
                            row.speedup_low, row.speedup_high = interval.low, interval.high
                rows.append(row)
    return rows, crossovers(rows, confidence)


def crossovers(rows: list[LoadPoint], confidence: float = 0.95) -> list[Crossover]:
    """Each draft's crossover per law and load axis (see the module docstring)."""
    out: list[Crossover] = []
    keys = sorted({(r.runner, r.law, r.kind) for r in rows if r.runner != FALLBACK}, key=lambda k: (k[1], k[2], k[0]))
    for draft, law, kind in keys:
        mine = sorted((r for r in rows if (r.runner, r.law, r.kind) == (draft, law, kind)), key=lambda r: r.value)
        below = next((r for r in mine if r.speedup_high is not None and r.speedup_high < 1.0), None)
        undecided = [r.name for r in mine if r.speedup_low is None]
        if below is not None:
            text = (f"{draft} under {law}: crossover at {below.name}: speedup {below.speedup:.2f}x, "
                    f"{confidence:.0%} CI {below.speedup_low:.2f}x-{below.speedup_high:.2f}x lies below 1.0x")
        else:
            text = f"{draft} under {law}: no crossover up to {mine[-1].name}: no speedup interval lies wholly below 1.0x"
            if undecided:
                text += f" (no interval at {', '.join(undecided)}: fewer than 5 paired requests)"
        out.append(Crossover(draft, law, kind, below.value if below is not None else None, text))
    return out
