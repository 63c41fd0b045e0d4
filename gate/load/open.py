"""Open-loop load: requests arrive at a mean rate whatever the server does, with gamma
distributed inter-arrival times, optionally capped by a concurrency (a request that
arrives while `concurrency` are in flight waits client-side: its queue time).

Arrivals follow vLLM's serving benchmark (benchmarks/benchmark_serving.py, get_request):
gaps ~ gamma(shape=burstiness, scale=1/(request_rate * burstiness)), mean 1/request_rate s;
burstiness 1 is a Poisson process (exponential gaps), below 1 burstier, above 1 more even.
As there, the first request goes at once (offset 0) and each later one one gap after the
previous one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gate.load.interface import LoadStrategy
from gate.load.registry import LoadKind
from gate.records import OfferedLoad


@dataclass(frozen=True)
class OpenLoop(LoadStrategy):
    """`request_rate` arrivals per second (> 0) with gamma gaps of shape `burstiness` (> 0,
    1: Poisson), drawn from numpy.random.default_rng(`seed`); `concurrency`: most requests in
    flight (None: unbounded). Raises ValueError for a rate or burstiness that is not a finite
    positive number, or a concurrency below 1."""

    kind: ClassVar[str] = "request_rate"
    concurrency: int | None = None
    request_rate: float | None = 1.0
    burstiness: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.request_rate is None or not math.isfinite(self.request_rate) or self.request_rate <= 0:
            raise ValueError(f"open-loop load needs a finite request rate > 0 (requests/s), got {self.request_rate!r}")
        if not math.isfinite(self.burstiness) or self.burstiness <= 0:
            raise ValueError(f"burstiness (gamma shape) must be a finite number > 0, got {self.burstiness!r}")
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or self.concurrency < 1):
            raise ValueError(f"open-loop concurrency cap must be >= 1 or None, got {self.concurrency!r}")

    def arrival_offsets(self, n: int) -> list[float]:
        """Arrival times (s from the window start, non-decreasing) of `n` requests: 0.0, then
        cumulative gamma gaps (mean 1/request_rate s). The same seed gives the same offsets.
        Raises ValueError for n < 0."""
        if n < 0:
            raise ValueError(f"number of requests must be >= 0, got {n}")
        if n == 0:
            return []
        assert self.request_rate is not None
        scale_s = 1.0 / (self.request_rate * self.burstiness)
        gaps_s = np.random.default_rng(self.seed).gamma(shape=self.burstiness, scale=scale_s, size=n - 1)
        return [0.0, *np.cumsum(gaps_s).tolist()]

    def offered(self) -> OfferedLoad:
        """The strategy as the run record states it (with its burstiness)."""
        return OfferedLoad(self.kind, self.concurrency, self.request_rate, self.burstiness)


def _points(policy: Any) -> list[LoadStrategy]:
    """load.request_rate: one open loop per rate, in the order given, with load.burstiness,
    arrivals seeded by workload.seed, capped by load.max_concurrency."""
    load = policy.load
    return [
        OpenLoop(
            request_rate=r, burstiness=load.burstiness, seed=policy.workload.seed, concurrency=load.max_concurrency
        )
        for r in load.request_rate or []
    ]


KIND = LoadKind("request_rate", _points)
