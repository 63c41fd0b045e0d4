"""Offered load strategies (issue 15): closed loop at a concurrency, open loop with gamma
arrivals (vLLM benchmark_serving's burstiness convention) and an optional cap, and the
scheduler that drives a send function under them, without any server."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import numpy as np
import pytest
from scipy import stats

from gate.load.closed import ClosedLoop
from gate.load.open import OpenLoop
from gate.load.schedule import drive
from gate.records import OfferedLoad


def test_strategies_validate_and_state_their_offered_load() -> None:
    assert ClosedLoop(concurrency=8).offered() == OfferedLoad("concurrency", 8, None)
    assert OpenLoop(request_rate=4.0, burstiness=0.5, concurrency=16).offered() == OfferedLoad("request_rate", 16, 4.0, 0.5)
    assert OpenLoop(request_rate=2.0).offered() == OfferedLoad("request_rate", None, 2.0, 1.0)
    for bad in (0, -1, None):
        with pytest.raises(ValueError, match="concurrency >= 1"):
            ClosedLoop(concurrency=bad)
    with pytest.raises(ValueError, match="no request rate"):
        ClosedLoop(concurrency=2, request_rate=1.0)
    with pytest.raises(ValueError, match="request rate > 0"):
        OpenLoop(request_rate=0.0)
    with pytest.raises(ValueError, match="burstiness"):
        OpenLoop(request_rate=1.0, burstiness=0.0)
    with pytest.raises(ValueError, match="cap must be >= 1"):
        OpenLoop(request_rate=1.0, concurrency=0)


def test_gamma_arrivals_have_the_rate_and_are_seeded() -> None:
    load = OpenLoop(request_rate=20.0, burstiness=1.0, seed=7)
    offsets = load.arrival_offsets(20001)
    assert offsets[0] == 0.0 and all(b >= a for a, b in zip(offsets, offsets[1:]))
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.03)
    assert load.arrival_offsets(50) == OpenLoop(request_rate=20.0, seed=7).arrival_offsets(50)
    assert load.arrival_offsets(50) != OpenLoop(request_rate=20.0, seed=8).arrival_offsets(50)
    assert load.arrival_offsets(0) == [] and load.arrival_offsets(1) == [0.0]


def test_burstiness_one_is_poisson_and_lower_is_burstier() -> None:
    poisson = np.diff(OpenLoop(request_rate=5.0, burstiness=1.0, seed=1).arrival_offsets(5001))
    assert stats.kstest(poisson, "expon", args=(0, 1 / 5.0)).pvalue > 0.01
    bursty = np.diff(OpenLoop(request_rate=5.0, burstiness=0.25, seed=1).arrival_offsets(5001))
    assert bursty.mean() == pytest.approx(0.2, rel=0.08)  # same mean rate
    assert stats.kstest(bursty, "expon", args=(0, 1 / 5.0)).pvalue < 1e-6
    # gamma(shape k): coefficient of variation 1/sqrt(k): 1 for Poisson, 2 for k = 0.25
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.08)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)


class Recorder:
    """A fake send: sleeps `duration_s`, tracks how many are in flight, raises for some indices."""

    def __init__(self, duration_s: float = 0.01, fail: set[int] = frozenset()):
        self.duration_s, self.fail = duration_s, fail
        self.in_flight = self.max_in_flight = 0
        self.sent: dict[int, tuple[float, float]] = {}  # index -> (scheduled, sent) perf_counter s

    async def __call__(self, i: int, scheduled_s: float):
        self.sent[i] = (scheduled_s, time.perf_counter())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.duration_s)
            if i in self.fail:
                raise RuntimeError(f"boom {i}")
            return f"ok {i}"
        finally:
            self.in_flight -= 1


def test_closed_loop_keeps_concurrency_in_flight_and_results_in_order() -> None:
    send = Recorder(0.01, fail={3})
    ended: list[int] = []
    out = asyncio.run(drive(20, ClosedLoop(concurrency=4), send, lambda i, r: ended.append(i)))
    assert send.max_in_flight == 4
    assert [r if isinstance(r, str) else "err" for r in out] == [f"ok {i}" if i != 3 else "err" for i in range(20)]
    assert isinstance(out[3], RuntimeError) and "boom 3" in str(out[3])
    assert sorted(ended) == list(range(20))
    # sent in plan order; nothing waits client-side
    order = sorted(send.sent, key=lambda i: send.sent[i][1])
    assert order[:4] == sorted(order[:4]) and set(order[:4]) == {0, 1, 2, 3}
    assert max(s - sch for sch, s in send.sent.values()) < 0.02
    assert asyncio.run(drive(0, ClosedLoop(concurrency=2), send)) == []


def test_open_loop_sends_at_the_arrival_times() -> None:
    load = OpenLoop(request_rate=100.0, seed=3)
    send = Recorder(0.001)
    t0 = time.perf_counter()
    asyncio.run(drive(10, load, send))
    offsets = load.arrival_offsets(10)
    for i, off in enumerate(offsets):
        scheduled, sent = send.sent[i]
        assert scheduled - t0 == pytest.approx(off, abs=0.01)
        assert 0 <= sent - scheduled < 0.03  # uncapped: sent on arrival


def test_open_loop_cap_makes_late_arrivals_queue() -> None:
    # 6 arrivals within ~6 ms, 50 ms each, at most 2 in flight: pairs wait ~0, ~50, ~100 ms
    load = OpenLoop(request_rate=1000.0, burstiness=1e6, concurrency=2)  # near-constant 1 ms gaps
    send = Recorder(0.05)
    asyncio.run(drive(6, load, send))
    queue_ms = [(send.sent[i][1] - send.sent[i][0]) * 1e3 for i in range(6)]
    assert send.max_in_flight == 2
    # lower bounds are exact (a sleep never ends early); upper bounds leave room for a busy machine
    assert max(queue_ms[:2]) < 25
    assert 35 < min(queue_ms[2:4]) and max(queue_ms[2:4]) < 200
    assert 85 < min(queue_ms[4:]) and max(queue_ms[4:]) < 300


def test_ctrl_c_propagates_keeps_what_ended_and_cancels_the_rest() -> None:
    send = Recorder(5.0)  # would take 5 s each
    ended: list[int] = []

    async def quick(i, s):
        return "first" if i == 0 else await send(i, s)

    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))  # Ctrl-C while three are in flight
    timer.start()
    t = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(drive(4, ClosedLoop(concurrency=4), quick, lambda i, r: ended.append(i)))
    timer.join()
    assert ended == [0] and time.perf_counter() - t < 2.0
