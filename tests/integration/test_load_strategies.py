"""The tests of tests/unit/test_load_strategies.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import pytest

from gate.load.closed import ClosedLoop
from gate.load.open import OpenLoop
from gate.core.law import Law
from gate.core.requests import PlannedPrompt, Request
from gate.runners.interface import StreamResult
from gate.runners.openai import Endpoint, OpenAIRunner
from served_stub import Stub


def runner_on(stub: Stub, workers: int | None = None) -> OpenAIRunner:
    return OpenAIRunner({"fallback": Endpoint(stub.url, api="llama_cpp")}, set(), request_timeout_s=10,
                        client_workers=workers)


def reqs(n: int) -> list[Request]:
    return [Request("fallback", Law("greedy", 0.0), PlannedPrompt(f"p{i}", "c", (500 + i, 1)), 1, 0, i) for i in range(n)]


def test_closed_loop_keeps_concurrency_in_flight_over_two_workers_in_order() -> None:
    with Stub(ttft_s=0.05, itl_s=0.01) as stub:
        out = runner_on(stub, workers=2).run(reqs(12), ClosedLoop(concurrency=4))
        log = list(stub.requests)
        assert stub.max_in_flight == 4
    assert all(isinstance(r, StreamResult) for r in out)
    assert {r.client.worker for r in out} == {0, 1}
    first = sorted(log, key=lambda r: r["t_recv"])[:4]
    assert {r["body"]["prompt"][0] for r in first} == {500, 501, 502, 503}  # the first wave is the first 4 in plan order
    assert max(r.client.schedule_lag_ms for r in out) < 50  # a slot sends its next request as the last one ends


def test_open_loop_sends_at_the_arrival_times() -> None:
    load = OpenLoop(request_rate=50.0, seed=3)
    with Stub(ttft_s=0.005, itl_s=0.001) as stub:
        out = runner_on(stub).run(reqs(10), load)
        recv = {r["body"]["prompt"][0] - 500: r["t_recv"] for r in stub.requests}
    offsets = load.arrival_offsets(10)
    for i, off in enumerate(offsets):
        assert recv[i] - recv[0] == pytest.approx(off - offsets[0], abs=0.02)
    assert all(r.queue_ms < 30 for r in out)  # uncapped: sent on arrival


def test_open_loop_cap_makes_late_arrivals_queue() -> None:
    # 6 arrivals within ~6 ms, ~50 ms each, at most 2 in flight: pairs wait ~0, ~50, ~100 ms
    load = OpenLoop(request_rate=1000.0, burstiness=1e6, concurrency=2)  # near-constant 1 ms gaps
    with Stub(ttft_s=0.05, itl_s=0.01) as stub:
        out = runner_on(stub).run(reqs(6), load)
        assert stub.max_in_flight == 2
    queue_ms = [r.queue_ms for r in out]
    # lower bounds are exact (a stream never ends early); upper bounds leave room for a busy machine
    assert max(queue_ms[:2]) < 25
    assert 35 < min(queue_ms[2:4]) and max(queue_ms[2:4]) < 200
    assert 85 < min(queue_ms[4:]) and max(queue_ms[4:]) < 300
    assert all(r.client.schedule_lag_ms < 30 for r in out)  # waiting for a slot is queueing, not the client's lag
