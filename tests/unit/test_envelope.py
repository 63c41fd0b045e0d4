"""The envelope search (load.search, gate.load.search): the search on probes with a known
answer, and `gate check` finding a stub server's known capacity (Stub.slots) through the
whole pipeline, with the envelope rule deciding on the interval."""

from __future__ import annotations

import math

import pytest

from gate.load.search import ProbeResult, elasticity, rising, search
from gate.records import EnvelopeRecord, ProbeRecord


def server(capacity: float, slo_load: float, per_unit: float = 100.0):
    """Probes of a server whose throughput rises linearly up to `capacity` and is flat beyond
    it, and whose SLOs hold up to `slo_load`; returns the probe and the loads it was asked."""
    asked: list[float] = []

    def probe(load: float) -> ProbeResult:
        asked.append(load)
        return ProbeResult(load <= slo_load, per_unit * min(load, capacity), "")
    return probe, asked


def test_the_search_brackets_then_bisects_to_the_slo_load() -> None:
    probe, asked = server(capacity=1000, slo_load=11)
    env = search(probe, 1, 64, integer=True)
    assert (env.lower, env.upper, env.stop) == (11, 12, "slo")
    assert asked[:5] == [1, 2, 4, 8, 16] and set(asked[5:]) <= set(range(9, 16))  # doubled, then bisected
    assert len(asked) == 5 + 3  # 12, 10, 11: log2 of the bracket


def test_the_search_finds_the_knee_where_throughput_stops_rising() -> None:
    probe, asked = server(capacity=6, slo_load=1000)
    env = search(probe, 1, 64, integer=True)
    assert (env.lower, env.upper, env.stop) == (6, 7, "saturation")
    # 16 added nothing over 8; 7 -> 8 added nothing, 3 -> 4 rose: the knee lies in [4, 8), then 5 -> 6 rose, 6 -> 7 did not
    assert asked == [1, 2, 4, 8, 16, 7, 3, 5, 6]
    assert {s.load: s.verdict for s in env.steps} == {1: "held", 2: "held", 3: "held", 4: "held", 5: "held", 6: "held",
                                                     7: "saturation", 8: "saturation", 16: "saturation"}


def test_an_slo_that_breaks_below_the_knee_bounds_the_envelope() -> None:
    probe, _ = server(capacity=6, slo_load=5)
    env = search(probe, 1, 64, integer=True)
    assert (env.lower, env.upper, env.stop) == (5, 6, "slo")


def test_a_rate_search_ends_within_its_tolerance_and_the_maximum_ends_a_search_that_always_held() -> None:
    probe, _ = server(capacity=math.inf, slo_load=3.3)
    env = search(probe, 0.5, 16.0, integer=False, tolerance=0.05)
    assert env.stop == "slo" and env.lower <= 3.3 < env.upper and env.upper / env.lower <= 1.05
    probe, asked = server(capacity=math.inf, slo_load=math.inf)
    env = search(probe, 1, 10, integer=True)
    assert (env.lower, env.upper, env.stop) == (10, None, "max") and asked == [1, 2, 4, 8, 10]


def test_the_budget_and_an_inconclusive_probe_stop_the_search_with_what_it_found() -> None:
    clock = iter(range(100))
    probe, asked = server(capacity=1000, slo_load=11)
    env = search(probe, 1, 64, integer=True, budget_s=3, clock=lambda: next(clock))
    assert env.stop == "budget" and env.lower == 2 and env.upper is None and asked == [1, 2]

    def busy(load: float) -> ProbeResult:
        return ProbeResult(True, 100 * load) if load < 4 else ProbeResult(None, 400, "contended")
    env = search(busy, 1, 64, integer=True)
    assert (env.lower, env.upper, env.stop) == (2, None, "inconclusive")
    signalled = search(lambda load: ProbeResult(True, 100 * load) if load < 4 else
                       ProbeResult(None, None, "a signal stopped the probe", interrupted=True), 1, 64, integer=True)
    assert (signalled.lower, signalled.upper, signalled.stop) == (2, None, "interrupted")
    failing = search(lambda load: ProbeResult(False, 1.0, "ttft"), 1, 8, integer=True)
    assert (failing.lower, failing.upper, failing.stop) == (None, 1, "slo")
    with pytest.raises(ValueError, match="start <= maximum"):
        search(busy, 8, 4, integer=True)


def test_the_knee_is_where_a_step_of_load_adds_under_half_its_proportional_throughput() -> None:
    assert elasticity(4, 400.0, 8, 800.0) == pytest.approx(1.0) and elasticity(4, 400.0, 8, 400.0) == 0.0
    assert rising(4, 400.0, 8, 570.0) and not rising(4, 400.0, 8, 560.0)  # sqrt(2) x 400 = 565.7: elasticity 0.5
    assert elasticity(4, None, 8, 1.0) is None and rising(4, None, 8, 1.0)  # unknown: nothing says it flattened


def envelope(lower: float | None, upper: float | None, runner: str = "fast", stop: str = "slo") -> EnvelopeRecord:
    return EnvelopeRecord(runner, "greedy", "concurrency", lower, upper, stop,
                          [ProbeRecord(1, 4, 0, 0, [100.0], [1.0], [None], "held", "every SLO held")], 1.0)


def test_an_interval_gives_the_least_and_greatest_slo_load() -> None:
    assert envelope(4, 5).bounds() == (4, 4)
    assert envelope(4, 8).bounds() == (4, 7)
    assert envelope(16, None, stop="max").bounds() == (16, math.inf)
    assert envelope(16, None, stop="max").shown() == "concurrency [16, max)"
    assert envelope(2, None, stop="inconclusive").shown() == "concurrency [2, ?)"  # nothing failed: upper unknown
    assert envelope(None, 1).bounds() == (0, 0)
    rate = EnvelopeRecord("fast", "greedy", "request_rate", 2.0, 2.2, "slo", [], 1.0)
    assert rate.bounds() == (2.0, 2.2) and rate.shown() == "request rate [2, 2.2)/s"


# -- through gate check, on stub servers of a known capacity -----------------------------------

# Each stub generates at most 4 requests at once (the others wait, FIFO); a request takes
# 20 ms + 11 x 5 ms = 75 ms, so at concurrency 5 one request in five waits ~75 ms for a slot.
SEARCH = ("{concurrency: [1], goodput: {ttft: %s}, search: {over: concurrency, start: 1, max: 16, requests_per_load: 4, "
          "min_good_share: 0.9}, per_user_tokens_s: 50}")
RULES = """\
  - {id: sustains, kind: envelope, comparison: '>=', threshold: 4}
  - {id: beyond, kind: envelope, comparison: '>=', threshold: 6}
  - {id: as-fallback, kind: envelope, comparison: '>=', threshold: 1.0, relative_to: fallback}
"""


# -- throughput at equal interactivity (gate.analysis.interactivity) -------------------------------

def test_the_pareto_front_and_the_throughput_read_off_it_at_a_per_user_speed() -> None:
    from gate.records import Environment, Measurements
    from gate.analysis.interactivity import compare, points, throughput_at

    m = Measurements(environment=Environment("3.11", "2.x", "5.x", "0.1.0", "linux", "cpu", "cpu", 0))
    m.envelopes = [EnvelopeRecord("fallback", "greedy", "concurrency", 4, 5, "slo", [
        ProbeRecord(c, 8, 0, 0, [thr], [1.0], [None], "held", "", tpot_mean_ms=[tpot])
        for c, thr, tpot in ((1, 100.0, 10.0), (2, 180.0, 11.0), (4, 300.0, 13.0), (8, 310.0, 25.0), (3, 150.0, 12.0))], 1.0),
        EnvelopeRecord("fast", "greedy", "concurrency", 4, 5, "slo", [
            ProbeRecord(c, 8, 0, 0, [thr], [1.0], [None], "held", "", tpot_mean_ms=[tpot])
            for c, thr, tpot in ((1, 150.0, 6.0), (2, 270.0, 7.0), (4, 420.0, 9.0), (8, 500.0, 12.0))], 1.0)]
    pts = points(m, [])
    front = {(p.runner, p.where): p.pareto for p in pts}
    assert front[("fallback", "search c=3")] is False  # c=2 is both faster per user (90.9 tok/s) and higher (180)
    assert front[("fallback", "search c=8")] and front[("fallback", "search c=4")] and front[("fallback", "search c=1")]
    fallback = [p for p in pts if p.runner == "fallback"]
    # 1000 / 11 = 90.9 tok/s (180) and 1000 / 13 = 76.9 tok/s (300): at 80 tok/s, linear between them
    assert throughput_at(fallback, 80.0) == pytest.approx(180 + (300 - 180) * (80 - 1000 / 11) / (1000 / 13 - 1000 / 11))
    assert throughput_at(fallback, 200.0) is None and throughput_at(fallback, 10.0) is None  # never extrapolated
    (eq,) = compare(pts, 90.0)  # fast: between c=8 (83.3 tok/s per user, 500) and c=4 (111.1, 420)
    assert eq.runner == "fast" and eq.throughput == pytest.approx(500 + (420 - 500) * (90 - 1000 / 12) / (1000 / 9 - 1000 / 12))
    assert eq.fallback_throughput == pytest.approx(300 + (180 - 300) * (90 - 1000 / 13) / (1000 / 11 - 1000 / 13))
    assert eq.gain == pytest.approx(eq.throughput / eq.fallback_throughput) and eq.gain > 2
    assert "fast under greedy at 90 tokens/s per user:" in eq.message and f"({eq.gain:.2f}x)" in eq.message
    (far,) = compare(pts, 500.0)
    assert far.gain is None and "not compared (fast and fallback measured no per-user speeds on both sides" in far.message
    assert compare(pts, None) == []


def test_an_open_loop_saturates_when_queueing_grows_along_its_window() -> None:
    from gate.load.search import queueing_grew
    from gate.records import RequestRecord

    def req(e2el_ms: float) -> RequestRecord:
        return RequestRecord("fast", "greedy", "p", "qa", 1, 0, 2, [0, 1], [10.0, e2el_ms], [1, 1], [0, 0], [0, 0],
                             "length", e2el_ms, 1, 1, 1, 1)
    level = [(0.1 * i, req(100.0 + (7 if i % 2 else 0))) for i in range(9)]  # Poisson-ish jitter, no trend
    growing = [(0.1 * i, req(100.0 + 60.0 * i)) for i in range(9)]  # each request waits longer than the one before
    assert queueing_grew(level) is False and queueing_grew(growing) is True and queueing_grew(level[:5]) is None


def test_a_rule_on_a_search_that_failed_or_was_interrupted_is_an_error() -> None:
    from gate.records import Environment, Measurements
    from gate.rules.kinds.envelope import KIND
    from gate.rules.kinds.interface import Settings
    from gate.policy.model import RuleSpec

    m = Measurements(environment=Environment("3.11", "2.x", "5.x", "0.1.0", "linux", "cpu", "cpu", 0))
    died = envelope(4, None, stop="failed")
    died.probes.append(ProbeRecord(8, 32, 30, 0, [0.0], [0.0], [None], "failed", "30 requests failed"))
    m.envelopes = [died, envelope(4, 5, runner="fallback")]
    absolute = RuleSpec(id="a", kind="envelope", comparison=">=", threshold=4)
    relative = RuleSpec(id="r", kind="envelope", comparison=">=", threshold=1.0, relative_to="fallback")
    for rule in (absolute, relative):
        (o,) = KIND.evaluate(rule, m, ["fast"], ["greedy"], Settings())
        assert o.status == "error" and "the search of fast failed at concurrency 8 (30 requests failed)" in o.message
    m.envelopes = [envelope(4, 5)]  # no fallback search: only the relative rule misses it
    (o,) = KIND.evaluate(absolute, m, ["fast"], ["greedy"], Settings())
    assert o.status == "pass"
    (o,) = KIND.evaluate(relative, m, ["fast"], ["greedy"], Settings())
    assert o.status == "error" and "no search of fallback under greedy" in o.message
    m.envelopes = [envelope(4, None, stop="max"), envelope(4, None, runner="fallback", stop="max")]
    (o,) = KIND.evaluate(relative, m, ["fast"], ["greedy"], Settings())
    assert o.status == "inconclusive" and "held every SLO up to load.search.max (raise it)" in o.message


