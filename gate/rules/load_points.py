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

Predicted at load. With i.i.d. acceptance alpha and K proposals a verification step commits
(1 - alpha^(K+1)) / (1 - alpha) tokens on average, and the speedup is that over the step's cost
relative to one decode step of the target (Leviathan et al. 2023, Eq. 1 and Thm 3.8: cost
gamma c + 1 at batch 1). At load the cost is not gamma c + 1: the server verifies K + 1 tokens
of every sequence in flight, and once the batch's tokens near the compute roof a verification
step costs several decode steps. So at each load point gate measures it: the step cost ratio is
one verification step (the draft's mean TPOT x its measured tokens per decode step: every step
commits one token plus the proposals it accepted, so (output - first tokens) / (that -
accepted), the accepted proposals from the server's counters) over one decode step of the
fallback (its mean TPOT) at the same load, and the predicted speedup is the expected accepted
length from alpha over that ratio. The effective batch beside it is the mean number of
requests in flight, by Little's law (L = lambda W: request throughput x mean E2EL), so a row
reads: at B requests in flight a step verifies B (K + 1) tokens, costs r decode steps, commits
E tokens, and E / r is the speedup the model predicts (measured tokens per step / r is what was
measured). Prediction and measurement differ where acceptance is not i.i.d. across positions,
where steps make no proposal (prompt lookup without a match: alpha's E assumes every step
proposes K) and by the prefill, which TPOT leaves out.

The crossover of a draft is the lowest load point at which its whole speedup interval lies
below 1.0x: from there on the draft costs more than it saves (vLLM #50851: 2.1x at
concurrency 1, 0.77x at 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gate.measure.roofline import expected_committed
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
    # The speedup model at load (module docstring, "Predicted at load"); drafts only, None where a figure is missing
    effective_batch: float | None = None  # requests in flight on average (Little's law: request throughput x mean E2EL)
    expected_accepted_length: float | None = None  # (1 - alpha^(K+1)) / (1 - alpha): tokens per step, i.i.d. acceptance
    tokens_per_step: float | None = None  # measured tokens per decode step: (output - first tokens) / (that - accepted)
    step_cost_ratio: float | None = None  # one verification step's time over one fallback decode step's, at this load
    predicted_speedup: float | None = None  # expected_accepted_length / step_cost_ratio

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
                reqs_s = row.request_throughput
                e2el = aggregate([r.e2el_ms for r in reqs], "mean")
                if reqs_s is not None and e2el is not None and math.isfinite(e2el):
                    row.effective_batch = reqs_s * e2el / 1000.0
                rows.append(row)
    for row in rows:
        row.tokens_per_step = _tokens_per_step(m, row)
        fallback = next((r for r in rows if (r.runner, r.law, r.kind, r.value) == (FALLBACK, row.law, row.kind, row.value)), None)
        info = m.drafts.get(row.runner)
        if row.runner != FALLBACK and fallback is not None and info is not None and info.num_draft_tokens:
            predict_at_load(row, fallback, info.num_draft_tokens)
    return rows, crossovers(rows, confidence)


def _tokens_per_step(m: Measurements, row: LoadPoint) -> float | None:
    """Tokens one decode step of `row`'s runner committed on average over its windows at its
    load point: every step commits one token plus the proposals it accepted, so over the
    decode steps (the first token of each request is the prefill's) it is
    (output - requests) / (output - requests - accepted). The fallback's is 1. None where a
    draft's window has no counters (a server without spec-decode counts)."""
    committed = requests = accepted = 0
    for w in m.runs:
        at = w.load.concurrency if row.kind == "concurrency" else w.load.request_rate
        if w.runner != row.runner or w.law != row.law or at is None or float(at) != row.value or \
                (row.kind == "concurrency" and w.load.request_rate is not None):
            continue
        if w.counters is None and row.runner != FALLBACK:
            return None
        committed, requests = committed + w.committed_tokens, requests + w.requests
        accepted += w.counters.num_accepted_tokens if w.counters is not None else 0
    steps = committed - requests - accepted
    return (committed - requests) / steps if steps > 0 else None


def predict_at_load(row: LoadPoint, fallback: LoadPoint, num_draft_tokens: int) -> None:
    """The speedup model at load for one draft row (module docstring): fills
    expected_accepted_length, step_cost_ratio and predicted_speedup where the figures exist."""
    alpha = row.acceptance_rate
    if alpha is not None and 0.0 <= alpha <= 1.0:
        row.expected_accepted_length = expected_committed(alpha, num_draft_tokens)
    if row.tpot_mean_ms and fallback.tpot_mean_ms and row.tokens_per_step:
        row.step_cost_ratio = row.tpot_mean_ms * row.tokens_per_step / fallback.tpot_mean_ms
    if row.expected_accepted_length is not None and row.step_cost_ratio:
        row.predicted_speedup = row.expected_accepted_length / row.step_cost_ratio


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
