"""A busy machine must not give definite timing verdicts (issue 10, item 3).

Unit tests on synthetic records (no timing assertions): parsing /proc/pressure/cpu, the
contended classification, timing rules decided without contended requests (inconclusive,
naming the cause, when too many are left out), overlap rules untouched; then the reruns
with a probe that reports contention, and a real run on the tiny model filling the fields.
"""

from __future__ import annotations


import pytest

from gate.commands.check import contention_note
from gate.measure.contention import (Pressure, cpu_share, describe, is_contended, load_stall_share,
                                     parse_pressure, pooled_stall_share, stall_share)
from gate.policy.model import MeasurementSpec, RuleSpec
from gate.records import DraftInfo, Environment, Measurements, OverlapRecord, RequestRecord
from gate.rules.evaluate import Settings, evaluate
from gate.runners.interface import Capabilities, Runner, StreamResult

PSI = "some avg10=0.39 avg60=0.16 avg300=0.03 total=1398539\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def test_parse_pressure_reads_the_some_line() -> None:
    assert parse_pressure(PSI) == Pressure(0.39, 1398539)
    assert parse_pressure("full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n") is None
    assert parse_pressure("") is None
    assert parse_pressure("some avg10=x total=12\n") is None


def request(runner: str, prompt: int, e2el_ms: float, stall_ms: float | None = None, category: str = "qa",
            load: float | None = None) -> RequestRecord:
    n = 10
    return RequestRecord(runner, "greedy", f"p{prompt}", category, n, 0, 10, list(range(n)),
                         [e2el_ms * (i + 1) / n for i in range(n)], [1] * n, [0] * n, [0] * n, "length", e2el_ms, 0, 20,
                         1000, 0, cpu_time_ms=2 * e2el_ms * 0.9, cpu_stall_ms=stall_ms, load_avg_1m=load, threads=2)


def test_stall_share_from_pressure_else_load_average() -> None:
    assert stall_share(request("fallback", 0, 1000.0, 250.0)) == pytest.approx(0.25)
    assert stall_share(request("fallback", 0, 1000.0, 5000.0)) == 1.0  # capped: the read window is a little wider
    # no pressure source: 6 runnable tasks on 2 CPUs leave two thirds of the demand unserved
    assert stall_share(request("fallback", 0, 1000.0, None, load=6.0), cpus=2) == pytest.approx(2 / 3)
    assert stall_share(request("fallback", 0, 1000.0, None, load=1.5), cpus=2) == 0.0
    assert stall_share(request("fallback", 0, 1000.0)) is None  # nothing recorded (older reports)
    assert load_stall_share(None, 2) is None
    assert cpu_share(request("fallback", 0, 1000.0)) == pytest.approx(0.9)


def test_contended_classification() -> None:
    quiet, busy = request("fallback", 0, 1000.0, 50.0), request("fallback", 0, 1000.0, 400.0)
    assert not is_contended(quiet, 0.1) and is_contended(busy, 0.1)
    assert not is_contended(busy, None)  # max_cpu_stall: null never leaves a request out
    assert not is_contended(request("fallback", 0, 1000.0), 0.1)  # unmeasured: not contended
    assert pooled_stall_share([quiet, busy]) == pytest.approx(0.225)
    assert describe(0.4, 18, 24, "paired requests") == "machine contended: 40% of wall time without CPU on 18 of 24 paired requests"


def env() -> Environment:
    return Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0, cpu_count=2, threads=2,
                       cpu_pressure_source="/proc/pressure/cpu")


def measurements(pairs: int, contended: set[int], stall: float = 0.6) -> Measurements:
    """`pairs` paired requests: the fallback at 1000 ms, the draft at 500 ms (2x) when quiet;
    in a contended pair both stall for `stall` of their wall time and the draft crawls (4 s)."""
    m = Measurements(environment=env(), laws=["greedy"], drafts={"d": DraftInfo("model")})
    for i in range(pairs):
        if i in contended:
            m.requests += [request("fallback", i, 1000.0, stall * 1000.0), request("d", i, 4000.0 + 10 * i, stall * (4000.0 + 10 * i))]
        else:
            m.requests += [request("fallback", i, 1000.0, 20.0), request("d", i, 500.0 + 10 * i, 10.0)]
        m.overlaps.append(OverlapRecord("d", "greedy", f"p{i}", "qa", "distribution", [0.9, 0.8, 0.7], [True, True, False]))
    return m


SPEEDUP = RuleSpec(id="speedup", metric="speedup", aggregation="pooled", comparison=">=", threshold="1.0x")
TTFT = RuleSpec(id="ttft", metric="ttft_ms", aggregation="mean", relative_to="fallback", comparison="<=", threshold="1.25x")
OVERLAP = RuleSpec(id="overlap", metric="overlap", aggregation="mean", comparison=">=", threshold=0.6)


def test_a_rule_resting_on_contended_requests_is_inconclusive_and_names_the_cause() -> None:
    m = measurements(24, set(range(18)))
    for rule in (SPEEDUP, TTFT):
        (o,) = evaluate([rule], m, Settings(resamples=500))
        assert o.status == "inconclusive", o.message
        assert "machine contended: 60% of wall time without CPU on 18 of 24 paired requests" in o.message
    # the same records with contention ignored: a definite (and wrong) fail
    (o,) = evaluate([SPEEDUP], m, Settings(resamples=500, max_cpu_stall=None))
    assert o.status == "fail" and "contended" not in o.message


def test_a_few_contended_requests_are_left_out_and_the_rest_decides() -> None:
    m = measurements(12, {3, 7})
    (o,) = evaluate([SPEEDUP], m, Settings(resamples=500))
    assert o.status == "pass", o.message
    assert "machine contended: 60% of wall time without CPU on 2 of 12 paired requests, left out" in o.message
    assert "10 paired requests" in o.message  # the interval rests on the clean ones
    # a contended fallback request takes its pair out too
    m.requests[0].cpu_stall_ms = 900.0
    (o,) = evaluate([SPEEDUP], m, Settings(resamples=500))
    assert "3 of 12 paired requests" in o.message
    # with fewer than 5 clean pairs there is no interval: inconclusive, naming the contention
    (o,) = evaluate([SPEEDUP], measurements(6, {0, 1}), Settings(resamples=500))
    assert o.status == "inconclusive" and "2 of 6 paired requests" in o.message and "(4 clean: an interval needs at least 5)" in o.message


def test_max_contended_sets_how_many_may_be_left_out() -> None:
    m = measurements(24, set(range(6)))
    (o,) = evaluate([SPEEDUP], m, Settings(resamples=500))
    assert o.status == "pass"
    (o,) = evaluate([SPEEDUP], m, Settings(resamples=500, max_contended=0.2))
    assert o.status == "inconclusive" and "6 of 24 paired requests" in o.message


def test_overlap_and_acceptance_rules_ignore_contention() -> None:
    quiet, busy = measurements(12, set()), measurements(12, set(range(12)), stall=1.0)
    acceptance = RuleSpec(id="acc", metric="acceptance_rate", aggregation="pooled", comparison=">=", threshold=0.0)
    for rule in (OVERLAP, acceptance):
        (a,) = evaluate([rule], quiet, Settings(resamples=500))
        (b,) = evaluate([rule], busy, Settings(resamples=500))
        assert (a.status, a.message) == (b.status, b.message)
        assert "contended" not in b.message


def test_the_note_says_when_the_machine_was_busy() -> None:
    m = measurements(12, {3, 7})
    m.environment.cpu_stall_share, m.environment.load_avg_1m_max = 0.2, 3.9
    note = contention_note(m, 0.1)
    assert note is not None and "4 of 24 requests contended" in note and "load average up to 3.9 on 2 CPUs" in note
    assert contention_note(measurements(12, set()), 0.1) is None


def test_policy_fields_and_defaults() -> None:
    ms = MeasurementSpec()
    assert (ms.max_cpu_stall, ms.contention_reruns, ms.max_contended) == (Settings().max_cpu_stall, 2, Settings().max_contended)
    assert MeasurementSpec(max_cpu_stall=None).max_cpu_stall is None
    with pytest.raises(ValueError):
        MeasurementSpec(max_cpu_stall=1.5)


DRAFTS = "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n"
RULES = ("  - id: speedup\n    metric: speedup\n    aggregation: pooled\n    comparison: '>='\n    threshold: 0.01x\n")


def test_a_latency_ceiling_met_while_contended_passes_and_a_miss_is_inconclusive() -> None:
    """Contention only slows: a ceiling met with contended requests in is met without them,
    but a ceiling missed on contended requests may be the machine's fault."""
    m = measurements(24, set(range(18)))
    loose = RuleSpec(id="ttft", metric="ttft_ms", aggregation="mean", comparison="<=", threshold="10 s")
    (o,) = evaluate([loose], m, Settings(resamples=500))
    assert o.status == "pass" and "18 of 24 requests" in o.message and "passed nonetheless" in o.message
    tight = RuleSpec(id="ttft", metric="ttft_ms", aggregation="mean", comparison="<=", threshold="100 ms")
    (o,) = evaluate([tight], m, Settings(resamples=500))
    assert o.status == "inconclusive" and "machine contended" in o.message


class FakeRunner(Runner):
    """Runs a cell in no time: every request 'takes' 100 ms and is contended (all its wall time
    without CPU) when `busy(rerun)` says so, `rerun` being whether the attempt repeats the cell
    before it. Counts first attempts and reruns."""

    kind = "fake"
    capabilities = Capabilities(interleaves=True, cpu_accounting=True)

    def __init__(self, busy) -> None:
        self.busy, self.last, self.first, self.reruns = busy, None, 0, 0

    def run(self, cell, load, done, ended=None) -> None:
        key = cell[0].prompt.id
        rerun = key == self.last
        self.last = key
        self.reruns += rerun
        self.first += not rerun
        stalled = self.busy(rerun)
        for i, _ in enumerate(cell):
            done(i, StreamResult([10, 11, 12], [40.0, 70.0, 100.0], "length", 100.0, started_s=float(self.first),
                                 step_committed=[1, 1, 1], step_proposed=[0, 0, 0], step_accepted=[0, 0, 0],
                                 cpu_stall_ms=100.0 if stalled else 1.0))
            if ended is not None:
                ended(i)


def run_cells(busy, cells: int = 20, reruns: int = 2, budget: float = 0.5) -> tuple[Measurements, FakeRunner]:
    """`cells` cells (fallback and draft d on one prompt each) through gate.loop.run's loop."""
    from types import SimpleNamespace

    from gate.measure.contention import Handling
    from gate.core.requests import PlannedPrompt
    from gate.loop.run import Loop, Settings

    law = SimpleNamespace(name="greedy")
    runner = FakeRunner(busy)
    session = SimpleNamespace(runner=runner, prompts=[PlannedPrompt(f"p{i}", "qa", (1, 2, 3)) for i in range(cells)],
                              local=False)  # a served session (Session.local)
    m = Measurements(environment=env(), laws=["greedy"], drafts={"d": DraftInfo("prompt_lookup", 3)})
    settings = Settings([3], warmup=0, contention=Handling(0.1, reruns, 2, budget))
    Loop(session, m, settings, lambda *_: None).requests(["fallback", "d"], [law], range(1))
    return m, runner


def test_reruns_stop_once_the_machine_stays_busy_across_three_cells() -> None:
    """A machine busy throughout (issue 23: the example crawled, every contended cell rerun twice
    more): the first 3 cells are rerun, stay contended, and no cell after them is rerun."""
    m, runner = run_cells(lambda rerun: True)
    assert runner.first == 20 and runner.reruns == 3 * 2
    per_cell = [r.contention_reruns for r in m.requests[::2]]
    assert per_cell == [2, 2, 2] + [0] * 17
    assert m.notes == ["contention reruns: the machine stayed busy across 3 consecutive cells: reruns cannot help, "
                       "stopped rerunning after cell 3 of 20 (17 contended cell(s) after it not rerun); verdicts "
                       "resting on contended requests are inconclusive"]
    # the cost: 6 reruns against 20 first attempts of equal length, within the default budget of half of them
    assert runner.reruns <= 0.5 * runner.first
    # and the speedup verdict on these records is inconclusive, naming the contention (never a pass or a fail)
    (o,) = evaluate([SPEEDUP], m, Settings(resamples=500))
    assert o.status == "inconclusive" and "machine contended: 100% of wall time without CPU on 20 of 20 paired requests" in o.message


def test_reruns_that_help_are_held_to_the_time_budget() -> None:
    """Every first attempt contended, every rerun clean: reruns help, so they do not stop, but
    they may add at most measurement.contention_rerun_budget (0.5) of the first attempts' time:
    10 of the 20 cells are rerun, so the run takes 1.5x its time without reruns."""
    m, runner = run_cells(lambda rerun: not rerun)
    assert runner.first == 20 and runner.reruns == 10
    assert (runner.first + runner.reruns) / runner.first <= 1.5  # attempts of equal length: the wall-time multiple
    per_cell = [r.contention_reruns for r in m.requests[::2]]
    assert per_cell == [1] * 10 + [0] * 10
    assert m.notes == ["contention reruns: 10 rerun(s) of contended cells held back by the time budget (reruns took "
                       "2.0 s, first attempts 4.0 s; measurement.contention_rerun_budget 0.5: at most 1.5x the run's "
                       "time without reruns); verdicts resting on contended requests are inconclusive"]
    # a larger budget lets every cell have its rerun, and nothing is held back
    m, runner = run_cells(lambda rerun: not rerun, budget=1.0)
    assert runner.reruns == 20 and m.notes == []
    assert not any(is_contended(r, 0.1) for r in m.requests)


def test_reruns_that_mostly_stay_contended_stop() -> None:
    """Reruns alternating between rescuing a cell and not (never 3 stuck cells in a row): once 6
    cells were rerun and as many stayed contended as came out clean, reruns stop for good."""
    attempts = iter(range(10**6))
    # first attempts contended; a cell's rerun comes out clean on every other cell
    m, runner = run_cells(lambda rerun: not rerun or next(attempts) % 2 == 0, reruns=1, budget=10.0)
    per_cell = [r.contention_reruns for r in m.requests[::2]]
    assert per_cell == [1] * 6 + [0] * 14
    assert m.notes == ["contention reruns: 3 of the 6 cells rerun so far stayed contended through every rerun: reruns "
                       "cannot help, stopped rerunning after cell 6 of 20 (14 contended cell(s) after it not rerun); "
                       "verdicts resting on contended requests are inconclusive"]


def test_no_rerun_no_note() -> None:
    m, runner = run_cells(lambda rerun: False)
    assert runner.reruns == 0 and m.notes == []
    m, runner = run_cells(lambda rerun: True, reruns=0)  # contention_reruns: 0 asks for none: nothing to say
    assert runner.reruns == 0 and m.notes == []


def test_rerun_budget_field() -> None:
    assert MeasurementSpec().contention_rerun_budget == 0.5
    assert "1.5x" in MeasurementSpec.model_fields["contention_rerun_budget"].description
    with pytest.raises(ValueError):
        MeasurementSpec(contention_rerun_budget=-0.1)


def test_what_contention_can_only_push_towards_failing_follows_the_metrics_direction() -> None:
    """A slower machine lowers rates and raises times: a floor on a rate and a ceiling on a time
    met while contended stand (Metric.better). A ceiling on a rate, a floor on a time and any
    ratio to the fallback (both arms slowed) are decided on the clean requests. The throughput
    metrics of a served run read `metric == "committed_tokens_per_s"` here once, which took a
    ceiling on output_throughput for the side contention can only push towards failing."""
    from gate.rules.kinds.metric import _only_slower_fails

    def spec(metric: str, comparison: str) -> RuleSpec:
        return RuleSpec.model_construct(id="r", metric=metric, comparison=comparison, relative_to=None)

    assert all(_only_slower_fails(spec(m, ">=")) for m in ("committed_tokens_per_s", "output_throughput", "goodput"))
    assert not any(_only_slower_fails(spec(m, "<=")) for m in ("committed_tokens_per_s", "output_throughput"))
    assert _only_slower_fails(spec("ttft_ms", "<=")) and not _only_slower_fails(spec("ttft_ms", ">="))
    assert not _only_slower_fails(spec("request_speedup", ">="))


def test_compute_threads_fit_the_cpus_other_tasks_leave_free(tmp_path) -> None:
    """measurement.threads auto (issue 42): two threads on the one core a steady neighbour
    leaves ran 10x slower than one; the fit is the process's CPUs less the tasks runnable
    elsewhere, at least 1, never above what the process was given."""
    from gate.measure.contention import fitted_threads, runnable_elsewhere

    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nprocs_running 2\nprocs_blocked 0\n")  # the reader and one neighbour
    assert runnable_elsewhere(samples=3, interval_s=0.0, stat=stat) == 1.0
    assert runnable_elsewhere(stat=tmp_path / "missing") is None
    assert fitted_threads(2, 1.0, 2) == 1 and fitted_threads(2, 0.0, 2) == 2
    assert fitted_threads(2, 5.0, 2) == 1  # a crowded machine: still one thread
    assert fitted_threads(16, 0.0, 4) == 4  # never more than the process was given
    assert fitted_threads(2, None, 2) == 2  # unknown: as given
    from gate.measure.contention import cpu_quota

    quota = tmp_path / "cpu.max"
    for text, cpus in (("150000 100000\n", 2), ("100000 100000", 1), ("max 100000", None), ("junk", None)):
        quota.write_text(text)
        assert cpu_quota(quota) == cpus, text
    assert cpu_quota(tmp_path / "none") is None


class FittingRunner(FakeRunner):
    """A FakeRunner with the optional ability to fit its threads (gate.runners.interface.FitsThreads)."""

    threads_given = 2

    def __init__(self, busy) -> None:
        super().__init__(busy)
        self.fits: list[str] = []

    def fit_threads(self, when: str) -> None:
        self.fits.append(when)


def test_a_runner_that_fits_its_threads_is_asked_again_before_a_contended_cells_rerun() -> None:
    from types import SimpleNamespace

    from gate.core.requests import PlannedPrompt
    from gate.loop.run import Loop, Settings
    from gate.measure.contention import Handling
    from gate.runners.interface import FitsThreads

    runner = FittingRunner(lambda rerun: not rerun)  # every first attempt contended, every rerun clean
    assert isinstance(runner, FitsThreads) and not isinstance(FakeRunner(lambda rerun: False), FitsThreads)
    session = SimpleNamespace(runner=runner, prompts=[PlannedPrompt(f"p{i}", "qa", (1, 2, 3)) for i in range(4)],
                              local=False)
    m = Measurements(environment=env(), laws=["greedy"], drafts={"d": DraftInfo("prompt_lookup", 3)})
    settings = Settings([3], warmup=0, contention=Handling(0.1, 1, 2, 1.0))
    Loop(session, m, settings, lambda *_: None).requests(["fallback", "d"], [SimpleNamespace(name="greedy")], range(1))
    assert runner.reruns == 4 and runner.fits == ["before a contended cell's rerun"] * 4


def test_an_absolute_timing_verdict_on_fewer_threads_than_given_stands_only_where_slower_cannot_change_it() -> None:
    """Requests on fewer compute threads than the process was given (measurement.threads auto
    on a busy machine) ran slower than the machine allows: a latency ceiling met on them stands,
    a miss is inconclusive, and a paired ratio (both arms on the same threads) is decided and
    says the threads it was measured at."""
    from dataclasses import replace as with_

    m = measurements(24, set())
    m.requests = [with_(r, threads=1) for r in m.requests]
    m.environment.threads_given = 2
    loose = RuleSpec(id="ttft", metric="ttft_ms", aggregation="mean", comparison="<=", threshold="10 s")
    (o,) = evaluate([loose], m, Settings(resamples=500))
    assert o.status == "pass" and "24 of the 24 requests of d ran on 1 of the 2 compute threads" in o.message
    assert "passed nonetheless" in o.message
    tight = RuleSpec(id="ttft", metric="ttft_ms", aggregation="mean", comparison="<=", threshold="40 ms")  # ~55 ms
    (o,) = evaluate([tight], m, Settings(resamples=500))
    assert o.status == "inconclusive" and "a slower configuration than the machine's" in o.message
    (o,) = evaluate([SPEEDUP], m, Settings(resamples=500))  # a ratio of two arms on the same threads: decided, said
    assert o.status == "pass" and "of the 24 requests of d ran on 1 of the 2 compute threads" in o.message and "of each cell alike" in o.message
    m.environment.threads_given = None  # a fixed measurement.threads: the count the policy chose
    (o,) = evaluate([tight], m, Settings(resamples=500))
    assert o.status == "fail"
