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
gamma c + 1 at batch 1). alpha is estimated under that model from the server's per-position
counters: each step with a proposal is a run of acceptances ended by a rejection or by the
K-th acceptance, so the estimate is accepted / (accepted + steps ended by a rejection) (not
accepted / proposed, which counts the proposals after a rejection that were never tested).
A step that carries no proposal (prompt lookup without a match) commits one token, so with
the share s of decode steps that carry one the model commits 1 + s (E - 1) tokens a step. At
load the cost is not gamma c + 1: the server verifies 1 + its proposals for every sequence in
flight, and once the batch's tokens near the compute roof a verification step costs several
decode steps. So at each load point gate measures it: the step cost ratio is one decode step
of the draft's runner (its mean TPOT x its measured tokens per decode step; each step commits
one token plus the proposals it accepted, so decode tokens / (decode tokens - accepted)) over
one decode step of the fallback (its mean TPOT) at the same load point, and the predicted
speedup is the model's tokens per step over that ratio (the measured tokens per step over it
is what was measured). The requests in flight beside it come from Little's law (L = lambda W:
request throughput x mean E2EL), and in flight x (1 + proposals per step) is the tokens a step
verifies, so a row reads: at B in flight a step verifies V tokens, costs r decode steps of the
fallback and commits E tokens. Prediction and measurement differ where acceptance is not
i.i.d. across positions and by the prefill, which TPOT leaves out. In an open loop the two
runners may hold different numbers in flight at the same offered rate, so the ratio compares
steps at the same offered load, not at the same batch.

The crossover of a draft is the lowest load point at which its whole speedup interval lies
below 1.0x: from there on the draft costs more than it saves (vLLM #50851: 2.1x at
concurrency 1, 0.77x at 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gate.measure.roofline import expected_committed
from gate.metrics.catalogue import (
    ACCEPTANCE_RATE,
    GOODPUT,
    MEAN_ACCEPTANCE_LENGTH,
    OUTPUT_THROUGHPUT,
    REQUEST_THROUGHPUT,
)
from gate.records import FALLBACK, Measurements, RunRecord
from gate.rules.confidence import speedup_interval
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
    alpha_iid: float | None = (
        None  # per-proposal acceptance, i.i.d. model: accepted / (accepted + steps ended by a rejection)
    )
    proposal_share: float | None = None  # share of decode steps that carried a proposal
    expected_tokens_per_step: float | None = None  # the model: 1 + share x ((1 - alpha^(K+1)) / (1 - alpha) - 1)
    tokens_per_step: float | None = (
        None  # measured: decode tokens / decode steps (each step: 1 + its accepted proposals)
    )
    verified_per_step: float | None = None  # tokens a step verifies: in flight x (1 + proposals per step)
    step_cost_ratio: float | None = None  # one verification step's time over one fallback decode step's, at this load
    predicted_speedup: float | None = None  # expected_tokens_per_step / step_cost_ratio

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


def _windows_at(m: Measurements, runner: str, law: str, kind: str, value: float) -> list[RunRecord]:
    """The measured windows of `runner` under `law` at one load point (a closed loop's point
    takes no window of an open loop with that concurrency cap)."""
    out = []
    for w in m.runs:
        at = w.load.concurrency if kind == "concurrency" else w.load.request_rate
        if (
            w.runner == runner
            and w.law == law
            and at is not None
            and float(at) == value
            and not (kind == "concurrency" and w.load.request_rate is not None)
        ):
            out.append(w)
    return out


def _per_position(m: Measurements, runner: str, law: str, kind: str, value: float) -> list[float] | None:
    """Acceptance at each proposal position (num_accepted_tokens_per_pos / num_drafts, as
    vLLM's `vllm bench serve` reports it) over the runner's windows at one load point; None
    where the server gives no per-position counts."""
    total = None
    for w in _windows_at(m, runner, law, kind, value):
        if w.counters is not None:
            total = w.counters if total is None else total + w.counters
    if total is None or not total.num_drafts or not total.num_accepted_tokens_per_pos:
        return None
    return [round(x, 4) for x in total.acceptance_rate_per_pos]


def _selection(runner: str, law: str, kind: str, value: float) -> Selection:
    if kind == "concurrency":
        return Selection(runner, law, None, concurrency=(int(value),))
    return Selection(runner, law, None, request_rate=(value,))


def load_summary(
    m: Measurements, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[list[LoadPoint], list[Crossover]]:
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
                row.output_throughput = _clean(pooled(OUTPUT_THROUGHPUT.name, m, sel)[0])
                row.request_throughput = _clean(pooled(REQUEST_THROUGHPUT.name, m, sel)[0])
                row.goodput = _clean(pooled(GOODPUT.name, m, sel)[0])
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
                    row.acceptance_rate = _clean(pooled(ACCEPTANCE_RATE.name, m, sel)[0])
                    row.mean_acceptance_length = _clean(pooled(MEAN_ACCEPTANCE_LENGTH.name, m, sel)[0])
                    row.acceptance_per_pos = _per_position(m, runner, law, kind, value)
                    row.speedup, row.speedup_low, row.speedup_high = speedup_interval(
                        m, sel, confidence, resamples, seed
                    )
                reqs_s = row.request_throughput
                e2el = aggregate([r.e2el_ms for r in reqs], "mean")
                if reqs_s is not None and e2el is not None and math.isfinite(e2el):
                    row.effective_batch = reqs_s * e2el / 1000.0
                rows.append(row)
    for row in rows:
        fallback = next(
            (r for r in rows if (r.runner, r.law, r.kind, r.value) == (FALLBACK, row.law, row.kind, row.value)), None
        )
        info = m.drafts.get(row.runner)
        if row.runner != FALLBACK and fallback is not None and info is not None and info.num_draft_tokens:
            predict_at_load(m, row, fallback, info.num_draft_tokens)
    return rows, crossovers(rows, confidence)


@dataclass
class _Steps:
    """A runner's decode steps at one load point, from its windows: output tokens less each
    request's first (the prefill's), and the server's spec-decode counter sums (None: a draft
    window without counters)."""

    decode_tokens: int = 0
    accepted: int | None = 0
    drafts: int | None = 0
    proposed: int | None = 0
    full: int | None = 0  # steps whose every one of K proposals was committed (None: no per-position counts)


def _steps(m: Measurements, row: LoadPoint, k: int) -> _Steps:
    out = _Steps()
    for w in _windows_at(m, row.runner, row.law, row.kind, row.value):
        out.decode_tokens += w.committed_tokens - w.requests
        c = w.counters
        if row.runner == FALLBACK:
            continue
        if c is None:
            out.accepted = out.drafts = out.proposed = out.full = None
            continue
        if out.accepted is not None:
            out.accepted += c.num_accepted_tokens
            out.drafts = (out.drafts or 0) + c.num_drafts
            out.proposed = (out.proposed or 0) + c.num_draft_tokens
        per_pos = c.num_accepted_tokens_per_pos
        out.full = None if out.full is None or len(per_pos) < k else out.full + per_pos[k - 1]
    return out


def predict_at_load(m: Measurements, row: LoadPoint, fallback: LoadPoint, k: int) -> None:
    """The speedup model at load for one draft row with K = `k` (module docstring): fills
    alpha_iid, proposal_share, expected_tokens_per_step, tokens_per_step, verified_per_step,
    step_cost_ratio and predicted_speedup where the figures exist (None where not: a server
    without spec-decode counters, or without per-position counts for alpha)."""
    st = _steps(m, row, k)
    if st.accepted is None or st.drafts is None or st.proposed is None:
        return
    steps = st.decode_tokens - st.accepted  # each decode step commits one token plus the proposals it accepted
    if steps <= 0:
        return
    row.tokens_per_step = st.decode_tokens / steps
    row.proposal_share = st.drafts / steps
    if row.effective_batch is not None:
        row.verified_per_step = row.effective_batch * (1.0 + st.proposed / steps)
    if st.full is not None and st.drafts:
        rejected = st.drafts - st.full  # steps with a proposal that ended at a rejection
        if st.accepted + rejected > 0:
            row.alpha_iid = st.accepted / (st.accepted + rejected)
            e = expected_committed(row.alpha_iid, k)  # per step with a proposal
            row.expected_tokens_per_step = 1.0 + row.proposal_share * (e - 1.0)
    if row.tpot_mean_ms and fallback.tpot_mean_ms:
        row.step_cost_ratio = row.tpot_mean_ms * row.tokens_per_step / fallback.tpot_mean_ms
    if row.expected_tokens_per_step is not None and row.step_cost_ratio:
        row.predicted_speedup = row.expected_tokens_per_step / row.step_cost_ratio


def crossovers(rows: list[LoadPoint], confidence: float = 0.95) -> list[Crossover]:
    """Each draft's crossover per law and load axis (see the module docstring)."""
    out: list[Crossover] = []
    keys = sorted({(r.runner, r.law, r.kind) for r in rows if r.runner != FALLBACK}, key=lambda k: (k[1], k[2], k[0]))
    for draft, law, kind in keys:
        mine = sorted((r for r in rows if (r.runner, r.law, r.kind) == (draft, law, kind)), key=lambda r: r.value)
        below = next((r for r in mine if r.speedup_high is not None and r.speedup_high < 1.0), None)
        undecided = [r.name for r in mine if r.speedup_low is None]
        if below is not None:
            text = (
                f"{draft} under {law}: crossover at {below.name}: speedup {below.speedup:.2f}x, "
                f"{confidence:.0%} CI {below.speedup_low:.2f}x-{below.speedup_high:.2f}x lies below 1.0x"
            )
        else:
            text = (
                f"{draft} under {law}: no crossover up to {mine[-1].name}: no speedup interval lies wholly below 1.0x"
            )
            if undecided:
                text += f" (no interval at {', '.join(undecided)}: fewer than 5 paired requests)"
        out.append(Crossover(draft, law, kind, below.value if below is not None else None, text))
    return out
