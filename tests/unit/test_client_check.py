"""The served client checks its own timing (gate.measure.client_check): a client slowed on
purpose (its worker processes stopped with SIGSTOP for 40 ms out of every 50 while the
requests stream) makes the timing verdicts inconclusive, naming the client's delay, and
the self-check appears in the JSON, Markdown and HTML reports. Unslowed, the same rule is
decided."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from gate.runners.client.workers import shared_pool

# A TTFT ceiling the stub's 20 ms first token cannot meet: decided as a fail on honest
# requests, inconclusive when the requests the client delayed must be left out.
TTFT_RULE = "  - {id: ttft, metric: ttft_ms, aggregation: median, comparison: '<=', threshold: 5 ms}\n"


@pytest.fixture(autouse=True)
def _resume_workers():
    yield
    for w in shared_pool().workers:  # never leave a stopped worker behind for the next test
        try:
            os.kill(w.proc.pid, signal.SIGCONT)
        except OSError:
            pass


# -- the checks on synthetic records (gate.measure.client_check) -----------------------------

from dataclasses import replace  # noqa: E402

from gate.measure.client_check import check_window, client_checks, disagreement, is_client_delayed  # noqa: E402
from gate.records import ClientWorkerRecord, OfferedLoad, RequestRecord, RunRecord  # noqa: E402
from gate.runners.client.workers import client_workers  # noqa: E402
from gate.runners.engines.interface import ServerLatency, ServerSnapshot, histogram_means  # noqa: E402


def rec(i: int, ttft_ms: float = 40.0, lag_ms: float = 0.5, start_s: float | None = None, c: int | None = 4,
        rate: float | None = None, n: int = 8, **kw: Any) -> RequestRecord:
    times = [ttft_ms + 5.0 * k for k in range(n)]
    base = RequestRecord("fast", "greedy", f"p{i}", "qa", n, 0, 10, list(range(n)), times, [1] * n, None, None,
                         "length", times[-1], 3, None, None, None, concurrency=c, request_rate=rate,
                         schedule_lag_ms=lag_ms, send_ms=0.2, connect_ms=None, loop_lag_ms=lag_ms, client_worker=i % 2,
                         server_output_tokens=n, started_s=start_s if start_s is not None else 1000.0 + 0.05 * i)
    return replace(base, **kw)


def window(records: list[RequestRecord], c: int | None = 4, rate: float | None = None, duration_s: float = 2.0,
           **kw: Any) -> RunRecord:
    w = RunRecord("fast", "greedy", 1000.0, 1000.0 + duration_s, OfferedLoad("closed" if rate is None else "open", c, rate),
                  len(records), duration_s, sum(r.output_tokens for r in records), repetition=0,
                  client_workers=[ClientWorkerRecord(0, duration_s, 0.2 * duration_s, len(records), 0.1, 0.5, 1.0, 100)])
    return replace(w, **kw)


def test_a_clean_window_has_its_figures_and_no_warning() -> None:
    reqs = [rec(i) for i in range(16)]
    c = check_window(window(reqs), reqs, 10.0, server_slots=4, burst_gap_ms=1.0)
    assert c is not None and c.requests == 16 and c.workers == 2 and c.delayed == 0 and c.token_mismatches == 0
    assert c.schedule_lag_p50_ms == pytest.approx(0.5) and c.worker_cpu_max == pytest.approx(0.2)
    assert c.warnings == [] and c.bursts_separable
    assert check_window(window(reqs), [replace(r, schedule_lag_ms=None) for r in reqs], 10.0) is None  # in-process


def test_each_validity_problem_is_a_warning_that_names_its_evidence() -> None:
    reqs = [rec(i, lag_ms=12.0 if i < 3 else 0.5, server_cached_tokens=5 if i == 0 else None,
                server_output_tokens=7 if i == 1 else 8, server_prefill_ms=45.0 if i == 2 else None) for i in range(16)]
    reqs[4] = replace(reqs[4], loop_lag_ms=2.0)
    c = check_window(window(reqs), reqs, 10.0, server_slots=2, burst_gap_ms=1.0)
    text = " | ".join(c.warnings)
    assert c.delayed == 3 and "client delayed: schedule or event-loop lag over 10 ms on 3 of 16 requests" in text
    assert "token counts differ on 1 of 16 requests (e.g. p1: gate read 8, the server counted 7)" in text
    assert "below the server's own prefill time on 1 of 1 requests (by up to 5.0 ms)" in text
    assert "4 requests in flight, the server admits 2 at once" in text
    assert "prefix-cache hits on 1 of 16 requests (5 prompt tokens" in text
    assert "cannot separate bursts on 4 of 16 requests" in text and not c.bursts_separable
    assert is_client_delayed(reqs[0], 10.0) and not is_client_delayed(reqs[5], 10.0) and not is_client_delayed(reqs[0], None)


def test_a_short_window_lockstep_arrivals_and_an_open_loop_below_its_rate_are_named() -> None:
    short = [rec(i, start_s=1000.0) for i in range(4)]  # 4 requests of 75 ms at concurrency 4, all begun together
    c = check_window(window(short, duration_s=0.075), short, 10.0)
    text = " | ".join(c.warnings)
    assert "window too short for steady state: 4 requests with 4.0 in flight" in text
    assert "lockstep arrivals: 4 of 4 requests began within 1 ms of another" in text
    # due every 0.1 s, each begun 0.2 s after the one before it (it waited for the cap's slot)
    spread = [rec(i, c=None, rate=10.0, start_s=1000.0 + 0.2 * i, queue_ms=100.0 * i) for i in range(10)]
    slow = check_window(window(spread, c=None, rate=10.0, duration_s=2.0), spread, 10.0)
    assert slow.achieved_rate == pytest.approx(5.0) and slow.offered_rate == 10.0
    assert any("achieved 5.00 requests/s against the 10.00/s of its scheduled arrivals (50%; offered 10/s)" in w
               for w in slow.warnings), slow.warnings
    assert not any("lockstep" in w for w in slow.warnings)
    # begun when due, in a window whose duration includes the last request's whole stream: no warning
    kept = [rec(i, c=None, rate=10.0, start_s=1000.0 + 0.1 * i, queue_ms=0.0) for i in range(10)]
    assert not any("achieved" in w for w in check_window(window(kept, c=None, rate=10.0, duration_s=4.0), kept,
                                                         10.0).warnings)


def test_repetitions_that_disagree_warn_once_and_agreeing_ones_do_not() -> None:
    a = [rec(i, ttft_ms=40.0 + 0.1 * i, repetition=0) for i in range(12)]
    b = [rec(i, ttft_ms=80.0 + 0.1 * i, repetition=1) for i in range(12)]
    same = [rec(i, ttft_ms=40.05 + 0.1 * i, repetition=1) for i in range(12)]
    w0, w1 = window(a), window(b, repetition=1)
    text = disagreement([(w0, a), (w1, b)])
    assert text is not None and text.startswith("repetitions disagree: TTFT medians 40.5, 80.5 ms over 2 repetitions")
    assert disagreement([(w0, a), (w1, same)]) is None
    checks = client_checks([w0, w1], a + b, 10.0)
    assert [sum("repetitions disagree" in w for w in c.warnings) for c in checks] == [0, 1]


def test_a_capped_open_loop_window_is_checked_on_its_requests() -> None:
    """Requests of an open loop carry its rate alone (gate.load.points.point_of), the window
    its cap too: the check still finds them, and counts the cap as the most in flight."""
    reqs = [rec(i, c=None, rate=10.0, start_s=1000.0 + 0.1 * i) for i in range(16)]
    (c,) = client_checks([window(reqs, c=4, rate=10.0)], reqs, 10.0, slots={"fast": 2})
    assert c.requests == 16 and c.offered_rate == 10.0
    assert any("4 requests in flight, the server admits 2 at once" in w for w in c.warnings), c.warnings


def test_a_server_slow_to_answer_its_headers_is_named_as_the_servers_time() -> None:
    # headers 25 ms after the request left, its first token at 40 ms: the server took 25 ms before it streamed
    held = [rec(i, headers_ms=25.0 + 0.1 * i) for i in range(16)]
    assert held[0].server_headers_ms == 25.0
    c = check_window(window(held), held, 10.0)
    assert c.server_headers_p50_ms == pytest.approx(25.8) and c.server_headers_p99_ms == pytest.approx(26.5)
    (said,) = [w for w in c.warnings if "the server answered the requests' headers" in w]
    assert "a median 25.8 ms (p99 26.5 ms) after they left, of a median TTFT of 40.0 ms, over 16 requests" in said
    assert "its accept queue, its threads, its request handling), not the client's" in said
    # headers that came with the first token tell nothing apart from the prefill: no figure, no warning
    first = [rec(i, headers_ms=40.0) for i in range(16)]
    c = check_window(window(first), first, 10.0)
    assert first[0].server_headers_ms is None and c.server_headers_p50_ms is None and c.warnings == []
    # a hold of 1 ms in 40 is the server answering, not queueing: a figure, no warning
    quick = [rec(i, headers_ms=1.0) for i in range(16)]
    c = check_window(window(quick), quick, 10.0)
    assert c.server_headers_p50_ms == 1.0 and c.warnings == []


def test_the_servers_own_histograms_give_its_mean_ttft_and_itl_over_a_window() -> None:
    before = ServerSnapshot("vllm", {"vllm:time_to_first_token_seconds_sum": 1.0, "vllm:time_to_first_token_seconds_count": 10,
                                     "vllm:inter_token_latency_seconds_sum": 0.5, "vllm:inter_token_latency_seconds_count": 100})
    after = ServerSnapshot("vllm", {"vllm:time_to_first_token_seconds_sum": 1.4, "vllm:time_to_first_token_seconds_count": 20,
                                    "vllm:inter_token_latency_seconds_sum": 0.6, "vllm:inter_token_latency_seconds_count": 120})
    means = histogram_means(before, after, {"ttft": ("vllm:time_to_first_token_seconds",),
                                            "itl": ("vllm:inter_token_latency_seconds",)})
    assert means == {"ttft": pytest.approx((40.0, 10)), "itl": pytest.approx((5.0, 20))}
    reqs = [rec(i, ttft_ms=42.0) for i in range(16)]
    c = check_window(window(reqs, server_ttft_mean_ms=40.0, server_itl_mean_ms=5.0), reqs, 10.0)
    assert c.ttft_minus_server_ms == pytest.approx(2.0) and c.itl_minus_server_ms == pytest.approx(0.0)
    low = check_window(window(reqs, server_ttft_mean_ms=50.0), reqs, 10.0)
    assert any("mean TTFT is 8.0 ms below the server's own" in w for w in low.warnings)
    # vLLM's prefix-cache counter, per window: a hit is named even where no request says so
    from gate.runners.engines.vllm import VLLM

    hits = VLLM().server_latency(ServerSnapshot("vllm", {"vllm:prefix_cache_hits_total": 10.0}),
                                 ServerSnapshot("vllm", {"vllm:prefix_cache_hits_total": 74.0}))
    assert hits == ServerLatency(cached_tokens=64.0)
    cached = check_window(window(reqs, server_cached_tokens=64), reqs, 10.0)
    assert any("the server took 64 prompt tokens from its prefix cache over the window" in w for w in cached.warnings)


def test_the_client_takes_one_worker_per_2_streams_at_most_one_per_cpu() -> None:
    assert [client_workers(c, cpus=2) for c in (1, 2, 3, 64, 128)] == [1, 1, 2, 2, 2]
    assert [client_workers(c, cpus=16) for c in (1, 2, 8, 9, 200)] == [1, 1, 4, 5, 16]


def test_a_client_frame_builds_only_the_clients_own_classes() -> None:
    import pickle

    from gate.runners.client.worker import loads_frame

    frame = ("done", 3, ClientWorkerRecord(0, 1.0, 0.1, 2, 0.1, 0.2, 0.3, 10))
    assert loads_frame(pickle.dumps(frame)) == frame
    with pytest.raises(pickle.UnpicklingError, match="may not hold posix.system"):
        loads_frame(pickle.dumps(os.system))


# -- timing rules on client-delayed requests (gate.rules.kinds.metric) -----------------------

from gate.policy.model import RuleSpec  # noqa: E402
from gate.records import DraftInfo, Environment, Measurements  # noqa: E402
from gate.rules.evaluate import Settings, evaluate  # noqa: E402


def served(requests: list[RequestRecord], windows: list[RunRecord]) -> Measurements:
    env = Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0, cpu_count=2, threads=2)
    return Measurements(environment=env, laws=["greedy"], drafts={"fast": DraftInfo("model")}, requests=requests,
                        runs=windows)


def bunched(i: int) -> RequestRecord:
    """A request whose stamps the client held back: its gaps came out 0.1 ms, its lag 30 ms."""
    times = [40.0 + 0.1 * k for k in range(8)]
    return rec(i, lag_ms=30.0, token_times_ms=times, e2el_ms=times[-1])


def test_a_gap_ceiling_is_never_passed_on_stamps_the_client_held_back() -> None:
    """A client's delay is not only slower: stamps held back and read together shrink the gaps
    after them. An ITL ceiling the honest requests (5 ms gaps) miss is not passed because the
    delayed ones (0.1 ms gaps) pull the mean under it: with 18 of 24 delayed it is inconclusive."""
    reqs = [bunched(i) if i < 18 else rec(i) for i in range(24)]
    itl = RuleSpec(id="itl", metric="itl_ms", aggregation="mean", comparison="<=", threshold="3 ms")
    (o,) = evaluate([itl], served(reqs, []), Settings(resamples=300))
    assert o.status == "inconclusive", o.message
    assert "client delayed: schedule or event-loop lag over 10 ms on 18 of 24 requests" in o.message
    # a TTFT ceiling met with them in is met without them (the delay only adds to a first byte)
    ttft = RuleSpec(id="ttft", metric="ttft_ms", aggregation="mean", comparison="<=", threshold="1 s")
    (o,) = evaluate([ttft], served(reqs, []), Settings(resamples=300))
    assert o.status == "pass" and "passed nonetheless" in o.message, o.message


def test_window_rates_are_inconclusive_when_the_client_delayed_too_many_of_their_requests() -> None:
    """Throughput and goodput are tokens or requests over a window's duration: a delayed
    request cannot be taken out of it. A floor missed with most requests delayed is
    inconclusive; one delayed request of 24 is named and the windows decided whole."""
    def windows(reqs: list[RequestRecord]) -> list[RunRecord]:
        return [window(reqs[k::6], repetition=k) for k in range(6)]

    delayed = [rec(i, lag_ms=30.0) for i in range(24)]
    floor = RuleSpec(id="tput", metric="output_throughput", aggregation="pooled", comparison=">=",
                     threshold="1000 tokens/s")
    (o,) = evaluate([floor], served(delayed, windows(delayed)), Settings(resamples=300))
    assert o.status == "inconclusive", o.message
    assert "client delayed: schedule or event-loop lag over 10 ms on 24 of 24 requests" in o.message
    assert "a window's rate counts every request of it" in o.message
    one = [rec(i, lag_ms=30.0 if i == 0 else 0.5) for i in range(24)]
    (o,) = evaluate([floor], served(one, windows(one)), Settings(resamples=300))
    assert o.status == "fail", o.message  # 16 tokens/s measured against a floor of 1000
    assert "on 1 of 24 requests: a window's rate cannot leave a request out (decided on the whole windows" in o.message
