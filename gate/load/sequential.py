"""Sequential load: one request at a time, in plan order (the plan interleaves the
fallback and every draft per cell, gate.plan.matrix). Offered load: concurrency 1, no rate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gate.load.interface import LoadStrategy


@dataclass(frozen=True)
class Sequential(LoadStrategy):
    """One request in flight; the next starts when the previous one has ended."""

    kind: ClassVar[str] = "sequential"
    concurrency: int | None = 1
    request_rate: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency != 1 or self.request_rate is not None:
            raise ValueError("sequential load has concurrency 1 and no request rate")


SEQUENTIAL = Sequential()
