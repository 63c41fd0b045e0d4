"""The envelope search (`load.search`): the highest load at which a runner meets every SLO
before the server saturates, as an interval, found by probing.

A probe runs the workload at one load (closed-loop concurrency or open-loop request rate),
`repetitions` times, and says whether every SLO held in every repetition and what output
throughput (committed tokens/s) the server gave (gate.loop.run measures it; this module decides
where to probe next and what the probes say). The search:

1. **brackets**: from `start`, doubles the load until a probe's SLOs fail, or the doubling
   raised throughput by less than half proportionally (its elasticity, ln(thr(2L) / thr(L)) /
   ln 2, below KNEE_ELASTICITY = 0.5: the server is past its knee; guidellm stops its sweep at
   saturation, vLLM's `bench sweep` looks for the same knee), or `maximum` held;
2. **finds the knee** after that: the highest load whose last step (from the load just below:
   1 less for concurrency, 1 + `tolerance` times less for a rate) still had an elasticity of at
   least 0.5, by bisection (for a throughput curve that rises and then flattens the test is
   true below the knee and false above it; each test probes the load and the one just below).
   Beyond the knee more offered load buys queueing, not tokens;
3. **bisects the SLO boundary** when a probe's SLOs failed (below the knee, if one was found):
   between the highest load that held and the lowest that failed, until they are adjacent
   (concurrency: 1 apart; request rate: within `tolerance`, relative).

The answer is an interval [lower, upper): every SLO held at `lower`, and at `upper` an SLO
failed (`slo`) or the load was past the knee (`saturation`: lower is the knee, upper the load
just above it whose step added under half its proportional throughput); upper None: held up to `maximum` (`max`); lower
None: the
first probe failed. A probe whose requests were too often contended or client delayed decides
nothing: the search stops there (`inconclusive`), as it does when its wall-time budget or the
run's measurement.max_wall_s runs out (`budget`), a probe's requests failed (`failed`) or a
signal stopped a probe (`interrupted`); the interval then says what was found before.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from gate.load.interface import LoadStrategy
from gate.records import RequestRecord

Stop = Literal["slo", "saturation", "max", "budget", "inconclusive", "failed", "interrupted"]

KNEE_ELASTICITY = 0.5  # d ln(throughput) / d ln(load) below this: past the knee (1: linear, 0: flat)


@dataclass(frozen=True)
class ProbeResult:
    """What a probe at one load measured: `holds` every SLO held in every repetition (None: the
    probe decided nothing: contended, client delayed or failed requests, `why` says which);
    `throughput` the median over repetitions of its output tokens/s (None: nothing measured);
    `why` a sentence for the report ("ttft p99 612 ms over 500 ms in repetition 1"); `failed`:
    its requests failed; `ran_out`: the run's wall-time budget stopped it; `interrupted`: a
    signal (SIGINT, SIGTERM) stopped it."""

    holds: bool | None
    throughput: float | None
    why: str = ""
    failed: bool = False
    ran_out: bool = False  # the run's wall-time budget ran out during the probe
    interrupted: bool = False  # a signal stopped the probe
    saturated: bool | None = None  # open loop: its queueing grew along the window (None: judged by throughput)


@dataclass(frozen=True)
class Step:
    """One probe as the search judged it: `load`, its `result`, `saturated` (its throughput
    is past the knee or on the plateau) and its `verdict` ("held", "slo", "saturation",
    "inconclusive", "failed", "budget")."""

    load: float
    result: ProbeResult
    saturated: bool
    verdict: str


@dataclass(frozen=True)
class Envelope:
    """The search's answer (module docstring): every SLO held at `lower` (None: not even at
    the start), `upper` the lowest load that failed or lay past the knee (None: none up to the
    maximum), why it stopped, the probes in the order they ran, the wall time (s)."""

    lower: float | None
    upper: float | None
    stop: Stop
    steps: tuple[Step, ...]
    wall_s: float


def elasticity(a: float, a_throughput: float | None, b: float, b_throughput: float | None) -> float | None:
    """How throughput rose from load `a` to load `b` > a, relative to the load: ln(thr_b / thr_a)
    / ln(b / a) (1: proportionally, 0: not at all; the arc elasticity). None when a throughput
    is unknown or not positive."""
    if a_throughput is None or b_throughput is None or a_throughput <= 0 or b_throughput <= 0 or b <= a:
        return None
    return math.log(b_throughput / a_throughput) / math.log(b / a)


def rises(a: float, ra: ProbeResult, b: float, rb: ProbeResult) -> bool:
    """Whether the step of load from `a` to `b` still paid: for an open loop, that the probe at
    `b` did not saturate (ProbeResult.saturated: queueing grew along its window); otherwise by
    the elasticity of throughput (`rising`)."""
    if rb.saturated is not None:
        return not rb.saturated
    return rising(a, ra.throughput, b, rb.throughput)


def rising(a: float, a_throughput: float | None, b: float, b_throughput: float | None) -> bool:
    """Whether the step from `a` to `b` raised throughput by at least KNEE_ELASTICITY
    proportionally; an unknown elasticity counts as rising (nothing says it flattened)."""
    e = elasticity(a, a_throughput, b, b_throughput)
    return e is None or e >= KNEE_ELASTICITY


def search(
    probe: Callable[[float], ProbeResult],
    start: float,
    maximum: float,
    integer: bool,
    tolerance: float = 0.1,
    budget_s: float = math.inf,
    clock: Callable[[], float] = time.monotonic,
    stopped: Callable[[], bool] = lambda: False,
) -> Envelope:
    """Bracket, find the knee, bisect the SLO boundary (module docstring) with `probe(load)`
    from `start` up to `maximum`. `integer`: loads are whole numbers (concurrency; adjacent
    means 1 apart); otherwise they are rates, adjacent when upper / lower <= 1 + `tolerance`.
    `budget_s`: no probe starts once this much wall time (`clock`, s) has passed since the
    search began, nor once `stopped()` (the run's own budget ran out: interrupt.ran_out). Each
    load is probed at most once. Raises ValueError for a start that is not positive or above
    the maximum."""
    if not start > 0 or start > maximum:
        raise ValueError(f"the search needs 0 < start <= maximum, got start {start:g}, maximum {maximum:g}")
    began = clock()
    steps: list[Step] = []
    seen: dict[float, ProbeResult] = {}
    ended: list[Stop] = []  # why the search stopped early (budget, inconclusive, failed)

    def get(load: float) -> ProbeResult | None:
        """The probe at `load` (once), or None when the search must stop (recorded in `ended`)."""
        if load in seen:
            return seen[load]
        if clock() - began >= budget_s or stopped():
            ended.append("budget")
            return None
        r = probe(load)
        seen[load] = r
        verdict = (
            ("interrupted" if r.interrupted else "budget" if r.ran_out else "failed" if r.failed else "inconclusive")
            if r.holds is None or r.ran_out or r.interrupted
            else "held"
            if r.holds
            else "slo"
        )
        steps.append(Step(load, r, False, verdict))
        if verdict in ("budget", "failed", "inconclusive", "interrupted"):
            ended.append(verdict)  # type: ignore[arg-type]
            return None
        return r

    def adjacent(a: float, b: float) -> bool:
        return b - a <= 1 if integer else b / a <= 1 + tolerance

    def middle(a: float, b: float) -> float:
        return (a + b) // 2 if integer else math.sqrt(a * b)

    def result(lower: float | None, upper: float | None, stop: Stop, knee: float | None = None) -> Envelope:
        marked = tuple(
            Step(s.load, s.result, True, "saturation" if s.verdict == "held" else s.verdict)
            if knee is not None and s.load > knee
            else s
            for s in steps
        )
        return Envelope(lower, upper, ended[0] if ended else stop, marked, clock() - began)

    # 1. bracket
    held: float | None = None
    failed_at: float | None = None
    flattened: float | None = None  # the first load of the bracket whose doubling was not rising
    load, previous = start, None
    while True:
        r = get(load)
        if r is None:
            return result(held, None, "budget")
        if not r.holds:
            failed_at = load
            break
        if r.saturated or (previous is not None and not rises(previous, seen[previous], load, r)):
            flattened = load
            break
        held = load
        if load >= maximum:
            return result(held, None, "max")
        previous, load = load, min(maximum, load * 2)
    # 2. the knee
    knee: float | None = None
    if flattened is not None:

        def below(v: float) -> float:
            return v - 1 if integer else v / (1 + tolerance)

        def step_rises(v: float) -> bool | None:
            """Whether the step into `v` rose (True for `start`); None: the search must stop or
            an SLO broke (then `failed_at` says where)."""
            nonlocal failed_at
            if v <= start:
                return not seen[v].saturated if v in seen else True
            u = below(v)
            a, b = get(u), get(v)
            if a is None or b is None:
                return None
            if not a.holds or not b.holds:
                failed_at = u if not a.holds else v
                return None
            return rises(u, a, v, b)

        lo_k: float = start
        hi_k = flattened
        for v in sorted(
            (v for v, x in seen.items() if x.holds and v < flattened), reverse=True
        ):  # the bracket, top down
            up = step_rises(v)
            if up is None:
                break
            if up:
                lo_k = v
                break
            hi_k = v
        else:
            up = True
        while up is not None and failed_at is None and not adjacent(lo_k, hi_k):
            mid = middle(lo_k, hi_k)
            up = step_rises(mid)
            if up is None:
                break
            lo_k, hi_k = (mid, hi_k) if up else (lo_k, mid)
        if failed_at is None:
            if lo_k == start and not step_rises(start):  # saturated at the first load probed
                return result(None, start, "saturation", None)
            if ended:
                return result(lo_k, hi_k, "budget", lo_k)  # the knee lies in [lo_k, hi_k)
            return result(lo_k, hi_k, "saturation", lo_k)
        knee = lo_k
    # 3. the SLO boundary (below the knee, if one was found)
    assert failed_at is not None
    lo = max((v for v, x in seen.items() if x.holds and v < failed_at and (knee is None or v <= knee)), default=None)
    hi = failed_at
    while lo is not None and not adjacent(lo, hi):
        mid = middle(lo, hi)
        r = get(mid)
        if r is None:
            break
        if r.holds:
            lo = mid
        else:
            hi = mid
    return result(lo, hi, "slo", knee)


@dataclass(frozen=True)
class SearchPlan:
    """load.search as the measurement loop runs it: the load searched (`over`), `start`,
    `maximum`, `repetitions` per probe, `tolerance` (rates), `requests_per_load`, the SLOs
    (`slo_ms`: load.goodput in ms, `itl_p99_ms`, `min_good_share`), `budget_s` per runner and
    law; the open loop's `burstiness`, `seed` and `max_concurrency`; and when a request is left
    out of timing (`max_cpu_stall`, `cpus`, `max_client_lag_ms`) and how many may be
    (`max_contended`, a share)."""

    over: str
    start: float
    maximum: float
    repetitions: int = 1
    tolerance: float = 0.1
    requests_per_load: int = 4
    slo_ms: dict[str, float] = field(default_factory=dict)
    itl_p99_ms: float | None = None
    min_good_share: float = 0.9
    budget_s: float = 600.0
    burstiness: float = 1.0
    seed: int = 0
    max_concurrency: int | None = None
    max_cpu_stall: float | None = None
    cpus: int | None = None
    max_client_lag_ms: float | None = None
    max_contended: float = 0.2

    @property
    def integer(self) -> bool:
        """Whether loads are whole numbers (a concurrency search)."""
        return self.over == "concurrency"

    def strategy(self, load: float) -> LoadStrategy:
        """The offered load of a probe at `load`: ClosedLoop(concurrency) or OpenLoop(rate)."""
        from gate.load.closed import ClosedLoop
        from gate.load.open import OpenLoop

        if self.integer:
            return ClosedLoop(concurrency=int(load))
        return OpenLoop(request_rate=load, burstiness=self.burstiness, seed=self.seed, concurrency=self.max_concurrency)

    def request_count(self, load: float, workload: int) -> int:
        """Requests per probe window: max(`workload`, ceil(requests_per_load x load))."""
        return max(workload, math.ceil(self.requests_per_load * load))

    def describe(self) -> str:
        """The SLOs a probe must meet, as a note names them: "ttft <= 500 ms, 90% of requests"."""
        parts = [f"{k} <= {v:g} ms" for k, v in self.slo_ms.items()]
        out = f"{', '.join(parts)} on {self.min_good_share:.0%} of requests" if parts else ""
        if self.itl_p99_ms is not None:
            out += ("; " if out else "") + f"itl p99 <= {self.itl_p99_ms:g} ms"
        return out or "no SLO (saturation only)"


def meets(r: RequestRecord, slo_ms: dict[str, float], queued: bool = False) -> bool:
    """Whether a request met every SLO (ms): ttft, tpot, e2el (vLLM's goodput; a request with
    one output token has no TPOT and meets that objective). `queued`: its TTFT and E2EL count
    its wait in the client's queue for a slot of load.max_concurrency (queue_ms), as its user
    waits it (the envelope search: a load the server cannot take queues)."""
    wait = (r.queue_ms or 0.0) if queued else 0.0
    values = {"ttft": r.ttft_ms + wait, "tpot": r.tpot_ms, "e2el": r.e2el_ms + wait}
    return all(not (values[k] > limit) for k, limit in slo_ms.items())


# An open-loop window saturated when its requests' sojourn (client queue + end-to-end latency)
# grew along it: the median of its last third over QUEUE_GROWTH x that of its first third.
QUEUE_GROWTH = 2.0


def queueing_grew(spans: list[tuple[float, RequestRecord]]) -> bool | None:
    """Whether the sojourn of a window's requests (queue_ms + e2el_ms, in arrival order) grew
    along it: median of the last third > QUEUE_GROWTH x median of the first third. Below its
    capacity a server's sojourn times are stationary; beyond it arrivals outpace completions
    and every request waits longer than the one before. None with fewer than 6 requests."""
    if len(spans) < 6:
        return None
    order = sorted(spans, key=lambda x: x[0] - (x[1].queue_ms or 0.0) / 1e3)
    sojourn = [(r.queue_ms or 0.0) + r.e2el_ms for _, r in order]
    k = len(sojourn) // 3
    return float(np.median(sojourn[-k:])) > QUEUE_GROWTH * float(np.median(sojourn[:k]))


@dataclass(frozen=True)
class Window:
    """One repetition of a probe as measured: its requests with their wall-clock starts (s)
    and how many failed."""

    spans: list[tuple[float, RequestRecord]]
    failed: int = 0


def judge_probe(plan: SearchPlan, load: float, windows: list[Window]) -> tuple[ProbeResult, dict[str, Any]]:
    """Whether a probe's windows hold every SLO (module docstring), and its figures per window
    for the report: {"throughputs", "good_shares", "itl_p99_ms", "tpot_mean_ms", "requests",
    "failed", "excluded"}. A window's throughput is its committed output tokens over the time from its
    first start to its last end (tokens/s). A probe with a failed request, no measured request
    or more than `max_contended` of its requests contended or client delayed decides nothing
    (holds None). SLO shares and the ITL p99 are taken over the requests not left out."""
    from gate.measure.client_check import is_client_delayed
    from gate.measure.contention import is_contended

    figures: dict[str, Any] = {
        "throughputs": [],
        "good_shares": [],
        "itl_p99_ms": [],
        "tpot_mean_ms": [],
        "requests": 0,
        "failed": 0,
        "excluded": 0,
        "queueing_grew": [],
    }
    reasons: list[str] = []
    holds = True
    for i, w in enumerate(windows, 1):
        recs = [r for _, r in w.spans]
        figures["requests"] += len(recs)
        figures["failed"] += w.failed
        if not recs:
            figures["throughputs"].append(0.0)
            figures["good_shares"].append(0.0)
            figures["itl_p99_ms"].append(None)
            figures["tpot_mean_ms"].append(None)
            continue
        t0 = min(s for s, _ in w.spans)
        t1 = max(s + r.e2el_ms / 1e3 for s, r in w.spans)
        figures["throughputs"].append(sum(r.output_tokens for r in recs) / (t1 - t0) if t1 > t0 else 0.0)
        clean = [
            r
            for r in recs
            if not is_contended(r, plan.max_cpu_stall, plan.cpus) and not is_client_delayed(r, plan.max_client_lag_ms)
        ]
        figures["excluded"] += len(recs) - len(clean)
        share = sum(meets(r, plan.slo_ms, queued=True) for r in clean) / len(clean) if clean else 0.0
        if not plan.integer:
            figures["queueing_grew"].append(queueing_grew(w.spans))
        figures["good_shares"].append(share)
        gaps = sorted(g for r in clean for g in r.itl_ms)
        p99 = float(np.percentile(gaps, 99)) if gaps else None
        figures["itl_p99_ms"].append(p99)
        tpots = [r.tpot_ms for r in clean if r.output_tokens > 1 and math.isfinite(r.tpot_ms)]
        figures["tpot_mean_ms"].append(float(np.mean(tpots)) if tpots else None)
        if plan.slo_ms and share < plan.min_good_share:
            holds = False
            reasons.append(f"{share:.0%} of requests met the SLOs in repetition {i} (needs {plan.min_good_share:.0%})")
        if plan.itl_p99_ms is not None and p99 is not None and p99 > plan.itl_p99_ms:
            holds = False
            reasons.append(f"itl p99 {p99:.1f} ms over {plan.itl_p99_ms:g} ms in repetition {i}")
    n = figures["requests"]
    throughput = float(np.median(figures["throughputs"])) if figures["throughputs"] and n else None
    if figures["failed"]:
        return ProbeResult(None, throughput, f"{figures['failed']} requests failed", failed=True), figures
    if not n:
        return ProbeResult(None, None, "no request measured", failed=True), figures
    if figures["excluded"] / n > plan.max_contended:
        return ProbeResult(
            None,
            throughput,
            f"{figures['excluded']} of {n} requests contended or client delayed "
            f"(over {plan.max_contended:.0%}): the probe decides nothing",
        ), figures
    grew = [g for g in figures["queueing_grew"] if g is not None]
    saturated = (any(grew) if grew else False) if not plan.integer else None
    if saturated:
        reasons.append(f"queueing grew along the window (sojourn of its last third over {QUEUE_GROWTH:g}x its first's)")
    return ProbeResult(holds, throughput, "; ".join(reasons) or "every SLO held", saturated=saturated), figures
