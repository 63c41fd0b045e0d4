"""Rules, the load summary and the crossover on served records (no server: the records are
built here, as gate.loop.run writes them), and the policy's runner and load sections."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gate.policy.model import RuleSpec
from gate.records import (DraftInfo, Environment, Failure, FailureStage, Measurements, OfferedLoad, RequestRecord, RunRecord,
                          SpecDecodeCounters)
from gate.report.console import ConsoleReport
from gate.report.document import make_report
from gate.rules.evaluate import Settings, evaluate
from gate.analysis.load_points import load_summary
from gate.rules.status import Status
from gate.analysis.summary import summarize

N_TOKENS = 16


def env() -> Environment:
    return Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0)


def served(runner: str, prompt: int, rep: int, c: int, e2el: float, start: float, drafted: int = 0,
           accepted: int = 0) -> tuple[float, RequestRecord]:
    times = [e2el * (i + 1) / N_TOKENS for i in range(N_TOKENS)]
    r = RequestRecord(runner, "greedy", f"p{prompt}", "qa", N_TOKENS, rep, 10, list(range(N_TOKENS)), times, [1] * N_TOKENS,
                      None, None, "length", e2el, 4 if runner != "fallback" else 0, None, None, None, concurrency=c,
                      server_draft_tokens=drafted if runner != "fallback" else None,
                      server_accepted_tokens=accepted if runner != "fallback" else None)
    return start, r


def run(speedup_at: dict[int, float], prompts: int = 8, reps: int = 2, seed: int = 0) -> Measurements:
    """Fallback and draft 'd' at each concurrency; the draft's E2E latency is the fallback's
    divided by speedup_at[c] (lognormal noise per request); each window is one RunRecord."""
    rng = np.random.default_rng(seed)
    m = Measurements(environment=env(), laws=["greedy"], drafts={"d": DraftInfo("model", 4, "distribution")})
    t = 1000.0
    for c, s in speedup_at.items():
        for rep in range(reps):
            for runner in ("fallback", "d"):
                spans = []
                for p in range(prompts):
                    base = 400.0 * c * rng.lognormal(0, 0.05)
                    e2el = base if runner == "fallback" else base / s
                    spans.append(served(runner, p, rep, c, e2el, t + (p // c) * e2el / 1e3, drafted=40, accepted=20))
                m.requests += [r for _, r in spans]
                w = RunRecord.of(runner, "greedy", OfferedLoad("concurrency", c), spans)
                w.repetition = rep
                w.good_requests, w.slo_ms = sum(r.ttft_ms < 100 for _, r in spans), {"ttft": 100.0}
                if runner == "d":
                    w.counters = SpecDecodeCounters(num_drafts=100, num_draft_tokens=400, num_accepted_tokens=200,
                                                    num_committed_tokens=300)
                m.runs.append(w)
                t = w.end_s + 1
    return m


def rule(**kw) -> RuleSpec:
    base = dict(id="r", metric="speedup", aggregation="pooled", comparison=">=", threshold="1.0x")
    return RuleSpec(**(base | kw))


def test_speedup_per_concurrency_is_decided_at_each_load_point_on_its_own_pairs():
    m = run({1: 1.6, 4: 0.7})
    outcomes = evaluate([rule(per="concurrency")], m, Settings())
    by_scope = {o.scope: o for o in outcomes}
    assert by_scope["d/greedy/concurrency=1"].status == Status.PASS
    assert by_scope["d/greedy/concurrency=4"].status == Status.FAIL
    assert by_scope["d/greedy/concurrency=1"].measured == pytest.approx(1.6, rel=0.05)
    assert by_scope["d/greedy/concurrency=4"].measured == pytest.approx(0.7, rel=0.05)
    assert "16 paired requests" in by_scope["d/greedy/concurrency=4"].message


def test_scope_by_concurrency_selects_that_load_point_only():
    m = run({1: 1.6, 4: 0.7})
    (o,) = evaluate([rule(scope={"concurrency": [4]})], m, Settings())
    assert o.scope == "d/greedy/concurrency=4" and o.status == Status.FAIL


def test_crossover_is_the_lowest_load_whose_interval_lies_below_one():
    m = run({1: 1.5, 2: 1.1, 4: 0.8, 8: 0.6})
    rows, crossings = load_summary(m, 0.95, 500, 0)
    (c,) = crossings
    assert c.at == 4 and "crossover at concurrency 4" in c.message
    d4 = next(r for r in rows if r.runner == "d" and r.value == 4)
    assert d4.speedup_high < 1.0 and d4.speedup_low < d4.speedup < d4.speedup_high
    none = load_summary(run({1: 1.5, 2: 1.4}), 0.95, 500, 0)[1][0]
    assert none.at is None and "no crossover up to concurrency 2" in none.message


def test_the_speedup_model_at_load_predicts_from_alpha_and_the_measured_step_cost():
    """Counters per window of 8 requests x 16 tokens: 40 steps with a proposal (K=4) committed 80
    proposals, 10 of them all 4 (per position 30, 25, 15, 10), so the 120 decode tokens took 40
    steps (3.0 tokens a step, every step proposing) and alpha (i.i.d.) = 80 / (80 + 30). The
    draft's TPOT is the fallback's / s, so a step costs 3 / s decode steps. In flight: c."""
    from gate.measure.roofline import expected_committed

    m = run({1: 1.5, 4: 0.8})
    for w in m.runs:
        if w.runner == "d":
            w.counters = SpecDecodeCounters(num_drafts=40, num_draft_tokens=160, num_accepted_tokens=80,
                                            num_accepted_tokens_per_pos=[30, 25, 15, 10], num_committed_tokens=120)
    rows, _ = load_summary(m, 0.95, 300, 0)
    alpha = 80 / 110
    for c, s in ((1, 1.5), (4, 0.8)):
        d = next(r for r in rows if r.runner == "d" and r.value == c)
        assert d.alpha_iid == pytest.approx(alpha) and d.proposal_share == pytest.approx(1.0)
        assert d.tokens_per_step == pytest.approx(3.0) and d.expected_tokens_per_step == pytest.approx(expected_committed(alpha, 4))
        assert d.step_cost_ratio == pytest.approx(3.0 / s, rel=0.05)
        assert d.predicted_speedup == pytest.approx(expected_committed(alpha, 4) * s / 3.0, rel=0.05)
        assert d.effective_batch == pytest.approx(c, rel=0.15)
        assert d.verified_per_step == pytest.approx(d.effective_batch * (1 + 160 / 40))
    fallback = next(r for r in rows if r.runner == "fallback")
    assert fallback.predicted_speedup is None and fallback.effective_batch is not None
    text = ConsoleReport().render(make_report("p.yaml", {}, m, [], summarize(m), 0, rows, []))
    predicted = next(r for r in rows if r.runner == "d" and r.value == 1).predicted_speedup
    assert "Predicted at load" in text and f"{predicted:.2f}x" in text
    for w in m.runs:  # a server without per-position counts: alpha cannot be estimated, so nothing is predicted
        if w.counters is not None:
            w.counters.num_accepted_tokens_per_pos = []
    rows, _ = load_summary(m, 0.95, 300, 0)
    d = next(r for r in rows if r.runner == "d" and r.value == 1)
    assert d.alpha_iid is None and d.predicted_speedup is None and d.tokens_per_step == pytest.approx(3.0)


def _drifted(m: Measurements, factor: dict[tuple[int, int], float]) -> Measurements:
    """The draft's window at (concurrency, repetition) slowed by factor[...] (the machine drifting
    between windows: every request of the window together)."""
    for r in m.requests:
        if r.draft == "d":
            f = factor[(r.concurrency, r.repetition)]
            r.e2el_ms *= f
            r.token_times_ms = [t * f for t in r.token_times_ms]
    return m


def _speedup_by_window(m: Measurements, c: int) -> list[float]:
    """Each repetition's pooled speedup at concurrency c, from the records (tokens / E2E time)."""
    def rate(runner: str, rep: int) -> float:
        rs = [r for r in m.requests if (r.draft, r.concurrency, r.repetition) == (runner, c, rep)]
        return sum(r.output_tokens for r in rs) / sum(r.e2el_ms for r in rs)
    return [rate("d", rep) / rate("fallback", rep) for rep in sorted({r.repetition for r in m.requests})]


def test_drift_between_windows_widens_an_a_a_comparison_that_the_requests_alone_would_decide():
    """A/A: the draft is the fallback (speedup 1.0 in law), but its windows ran on a machine
    drifting by -12% to +15% between repetitions. A bootstrap over the 8 paired requests of one
    window pair excludes 1.0; the interval widened by the drift between windows (its sd pooled
    over both load points, 2 x (3 - 1) = 4 df) holds it, and the verdict is inconclusive."""
    from gate.rules.confidence import between_windows, bootstrap_interval, compared_runners, estimand
    from gate.rules.selection import Selection

    m = _drifted(run({1: 1.0, 4: 1.0}, reps=3, seed=3),
                 {(1, 0): 1.15, (1, 1): 0.88, (1, 2): 1.0, (4, 0): 0.88, (4, 1): 1.12, (4, 2): 1.01})
    by_scope = {o.scope: o for o in evaluate([rule(per="concurrency")], m, Settings())}
    for c in (1, 4):
        o = by_scope[f"d/greedy/concurrency={c}"]
        assert o.status == Status.INCONCLUSIVE and o.interval.low < 1.0 < o.interval.high, o.message
        assert "widened to the drift between windows (t, 4 df)" in o.interval.method
        assert "widened from the requests' " in o.message and "by the drift between windows (sd " in o.message
        assert "over 4 df)" in o.message
        one = Selection("d", "greedy", None, concurrency=(c,))
        rep0 = replace(m, requests=[r for r in m.requests if r.repetition == 0])
        alone = bootstrap_interval(estimand("speedup", "pooled", rep0, one), 0.95, 500, 0)
        assert alone.high < 1.0 or alone.low > 1.0  # the requests of one window pair alone decide it
    logs = {c: np.log(_speedup_by_window(m, c)) for c in (1, 4)}
    sd = np.sqrt(sum(((v - v.mean()) ** 2).sum() for v in logs.values()) / 4)
    where = Selection("d", "greedy", None, concurrency=(1,))
    peers = [estimand("speedup", "pooled", m, replace(where, runner=r, concurrency=None)) for r in compared_runners(m)]
    drift = between_windows(estimand("speedup", "pooled", m, where), peers, 0.95)
    assert drift.sd == pytest.approx(sd) and drift.df == 4 and drift.windows == 3


def test_the_drift_between_windows_is_measured_on_the_requests_the_verdict_keeps():
    """Another job slowed 3 requests of the fallback's window at concurrency 4, repetition 1,
    3x (half their wall time without a CPU): they are left out as contended, and the drift
    between windows, measured without them, stays that of the quiet windows."""
    m = run({1: 1.6, 4: 1.6}, reps=3, seed=1)
    quiet = evaluate([rule(per="concurrency")], m, Settings(max_cpu_stall=0.1))
    for r in m.requests:
        r.cpu_stall_ms = 0.0
        if (r.draft, r.concurrency, r.repetition) == ("fallback", 4, 1) and r.prompt_id in ("p0", "p1", "p2"):
            r.e2el_ms *= 3
            r.token_times_ms = [t * 3 for t in r.token_times_ms]
            r.cpu_stall_ms = 0.5 * r.e2el_ms
    busy = evaluate([rule(per="concurrency")], m, Settings(max_cpu_stall=0.1))
    sd = [o.message.split("between windows (sd ")[1].split(" ")[0] for o in quiet + busy]
    assert "contended" in busy[1].message and len(set(sd[2:])) == 1
    assert abs(float(sd[2].rstrip("%")) - float(sd[0].rstrip("%"))) < 2.0  # percentage points: the quiet drift, not 3x


def test_one_repetition_says_the_drift_between_windows_is_not_measured_and_in_process_has_none():
    m = run({1: 1.6}, reps=1)
    (o,) = evaluate([rule()], m, Settings())
    assert o.status == Status.PASS and "the drift between the runners' windows is not measured" in o.message
    (o,) = evaluate([rule(metric="request_speedup", aggregation="mean")], run({1: 1.6}, reps=2), Settings())
    # request_speedup's values are written without "x" (a mean of per-request ratios): the drift's too
    assert "x-" not in o.message and ("lies within it" in o.message or "by the drift between windows" in o.message)
    for r in m.requests:  # gate's own loop: no load point, the runners ran cell by cell
        r.concurrency = None
    m.runs = []
    (o,) = evaluate([rule()], m, Settings())
    assert o.status == Status.PASS and "between windows" not in o.message and "widened" not in o.interval.method


def test_window_metrics_are_tokens_and_requests_over_window_time():
    m = run({1: 1.0, 4: 1.0}, reps=1)
    ws = [w for w in m.runs if w.runner == "fallback" and w.load.concurrency == 4]
    rows, _ = load_summary(m, 0.95, 200, 0)
    fb4 = next(r for r in rows if r.runner == "fallback" and r.value == 4)
    assert fb4.output_throughput == pytest.approx(ws[0].committed_tokens / ws[0].duration_s)
    assert fb4.request_throughput == pytest.approx(ws[0].requests / ws[0].duration_s)
    assert fb4.goodput == pytest.approx(ws[0].good_requests / ws[0].duration_s)
    d = next(r for r in rows if r.runner == "d" and r.value == 4)
    assert d.acceptance_rate == pytest.approx(0.5)  # the server's per-response counts: 20 of 40
    assert d.mean_acceptance_length == pytest.approx(3.0)  # the window counters: 300 committed / 100 drafts


def test_window_metric_needs_five_windows_for_an_interval():
    m = run({4: 1.0}, reps=2)
    (o,) = evaluate([rule(metric="output_throughput", threshold="1 tokens/s", scope={"concurrency": [4]})], m, Settings())
    assert o.status == Status.INCONCLUSIVE and "2 windows" in o.message
    m5 = run({4: 1.0}, reps=5)
    (o5,) = evaluate([rule(metric="output_throughput", threshold="1 tokens/s", scope={"concurrency": [4]})], m5, Settings())
    assert o5.status == Status.PASS


def test_a_failure_at_one_load_point_errors_only_that_load_points_verdict():
    m = run({1: 1.6, 4: 1.6})
    m.failures.append(Failure(FailureStage.REQUEST, "d", "greedy", "server counters at concurrency 4", "speculation was off",
                              concurrency=4))
    by_scope = {o.scope: o for o in evaluate([rule(per="concurrency")], m, Settings())}
    assert by_scope["d/greedy/concurrency=1"].status == Status.PASS
    assert by_scope["d/greedy/concurrency=4"].status == Status.ERROR
    assert "speculation was off" in by_scope["d/greedy/concurrency=4"].message


def test_a_server_whose_verification_is_not_lossless_passes_no_speedup_or_exactness_rule():
    from gate.records import ServerRecord
    from gate.loop.run import _not_lossless

    m = run({1: 1.6})
    m.servers = [ServerRecord("fallback", "vllm"), ServerRecord("d", "vllm", verification="synthetic", lossless=False)]
    _not_lossless(m)
    _not_lossless(m)  # once per draft, however often the servers are described
    assert [f.stage for f in m.failures] == [FailureStage.VERIFICATION]
    rules = [rule(), rule(id="acc", metric="acceptance_rate", threshold=0.1), RuleSpec(id="ex", kind="exactness")]
    by_rule = {o.rule_id: o for o in evaluate(rules, m, Settings())}
    assert by_rule["r"].status == Status.ERROR and "verifies with synthetic" in by_rule["r"].message
    assert by_rule["ex"].status == Status.ERROR and "does not keep the target's law" in by_rule["ex"].message
    assert by_rule["acc"].status == Status.PASS  # what the server counted is still what it counted


def test_report_shows_load_points_and_crossover():
    m = run({1: 1.5, 4: 0.8})
    rows, crossings = load_summary(m, 0.95, 300, 0)
    report = make_report("p.yaml", {"measurement": {"confidence": 0.95}}, m, evaluate([rule(per="concurrency")], m, Settings()),
                         summarize(m), 1, rows, crossings)
    text = ConsoleReport().render(report)
    assert "At each load point" in text and "concurrency 4" in text and "crossover at concurrency 4" in text


POLICY = """\
version: 1
target: {{model: {model}}}
drafts:
  lookup: {{kind: prompt_lookup, num_draft_tokens: 3}}
law: {{temperature: 0}}
{extra}
rules:
{rules}
"""
SPEEDUP = "  - {id: s, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 1.0x, per: concurrency}"


@pytest.mark.parametrize("gaps, control, expected", [
    ([0.005], 0.5, Status.PASS),           # a near-tie by the rule's own tolerance
    ([0.3], 0.5, Status.INCONCLUSIVE),     # within the fallback runner's own deviation from the local target
    ([0.3, 2.0], 0.5, Status.FAIL),        # beyond it: a fault of speculation
    ([0.3], None, Status.FAIL),            # no control measured: the rule's tolerance alone
    # the fallback runner lies 13.25 logits from the local target (a stub emitting fixed tokens did): another
    # model, so no control and no verdict against the declared law, even with no divergence at all
    ([], 13.25, Status.ERROR),
])
def test_served_greedy_exactness_uses_the_fallback_runner_as_numerical_control(gaps, control, expected):
    from gate.records import Divergence, ExactnessRecord

    m = Measurements(environment=env(), laws=["greedy"], drafts={"d": DraftInfo("model", 4, "distribution")})
    rec = ExactnessRecord("d", "greedy", True, compared=4, numerical_tolerance=control)
    rec.divergences = [Divergence(f"p{i}", 3, 7, 8, g) for i, g in enumerate(gaps)]
    m.exactness.append(rec)
    (o,) = evaluate([RuleSpec(id="x", kind="exactness", tie_tolerance=0.01)], m, Settings())
    assert o.status == expected, o.message
    if expected == Status.ERROR:
        assert "does not serve the declared target" in o.message and "13.250 logits" in o.message


def test_served_requests_that_did_not_get_their_cpu_make_timing_verdicts_inconclusive():
    m = run({1: 1.6, 4: 1.6})
    for r in m.requests:
        if r.concurrency == 4:
            r.cpu_stall_ms = 0.5 * r.e2el_ms  # half their wall time some task waited for a CPU
        else:
            r.cpu_stall_ms = 0.0
    m.environment.cpu_count = 2
    by_scope = {o.scope: o for o in evaluate([rule(per="concurrency")], m, Settings(max_cpu_stall=0.1))}
    assert by_scope["d/greedy/concurrency=1"].status == Status.PASS
    assert by_scope["d/greedy/concurrency=4"].status == Status.INCONCLUSIVE
    assert "contended" in by_scope["d/greedy/concurrency=4"].message
