"""Offered load strategies (issue 15): closed loop at a concurrency, open loop with gamma
arrivals (vLLM benchmark_serving's burstiness convention) and an optional cap, and the
scheduler that drives a send function under them, without any server."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from gate.load.closed import ClosedLoop
from gate.load.open import OpenLoop
from gate.load.schedule import split
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


def test_a_closed_loop_splits_its_slots_over_the_workers_and_an_open_loop_deals_its_arrivals() -> None:
    assert [x.slots for x in split(20, ClosedLoop(concurrency=4), 3, 0.0)] == [2, 1, 1]
    assert [x.slots for x in split(3, ClosedLoop(concurrency=8), 2, 0.0)] == [2, 1]  # no more slots than requests
    assert [x.slots for x in split(5, ClosedLoop(concurrency=5), 8, 0.0)] == [1] * 5  # no worker without a slot
    load = OpenLoop(request_rate=10.0, seed=1, concurrency=2)
    shares = split(5, load, 2, 100.0)
    offsets = load.arrival_offsets(5)
    assert [i for i, _ in shares[0].arrivals] == [0, 2, 4] and [i for i, _ in shares[1].arrivals] == [1, 3]
    assert all(x.capped and not x.slots for x in shares)
    assert dict(a for x in shares for a in x.arrivals) == pytest.approx({i: 100.0 + o for i, o in enumerate(offsets)})
    with pytest.raises(ValueError, match="need at least one request and one worker"):
        split(0, ClosedLoop(concurrency=2), 1, 0.0)


