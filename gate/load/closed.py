"""Closed-loop load: a fixed number of requests in flight; a new one is sent as soon as one
ends (vLLM `vllm bench serve --max-concurrency N` with no request rate). Offered load:
concurrency N, no rate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gate.load.interface import LoadStrategy
from gate.load.registry import LoadKind


@dataclass(frozen=True)
class ClosedLoop(LoadStrategy):
    """`concurrency` requests in flight (>= 1); the next request in plan order goes as soon as
    a slot is free, so nothing waits client-side (queue time 0). Raises ValueError for a
    concurrency below 1 or a request rate."""

    kind: ClassVar[str] = "concurrency"
    concurrency: int | None = 1
    request_rate: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.concurrency, int) or isinstance(self.concurrency, bool) or self.concurrency < 1:
            raise ValueError(f"closed-loop load needs a concurrency >= 1, got {self.concurrency!r}")
        if self.request_rate is not None:
            raise ValueError("closed-loop load has no request rate (use gate.load.open.OpenLoop)")


def _points(policy: Any) -> list[LoadStrategy]:
    """load.concurrency: one closed loop per concurrency, in the order given."""
    return [ClosedLoop(concurrency=c) for c in policy.load.concurrency or []]


KIND = LoadKind("concurrency", _points, default=lambda: ClosedLoop(concurrency=1))
