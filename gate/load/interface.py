"""What offered load is: a strategy the runner follows when it sends planned requests.

A strategy says how many requests may be in flight at once (`concurrency`) and how fast
new ones arrive (`request_rate`, requests/s; None: as soon as a slot is free). It does not
send anything itself: a runner (gate.runners.interface.Runner.run) reads it and refuses a
strategy beyond its declared capabilities. The measured window records it as an
OfferedLoad (gate.records.RunRecord.load)."""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import ClassVar

from gate.records import OfferedLoad


@dataclass(frozen=True)
class LoadStrategy(ABC):
    """Offered load. `kind`: the strategy's name ("sequential", ...); `concurrency`: most
    requests in flight at once (None: unbounded); `request_rate`: mean arrivals per second
    (None: the next request goes as soon as a slot is free)."""

    kind: ClassVar[str]
    concurrency: int | None = 1
    request_rate: float | None = None

    def offered(self) -> OfferedLoad:
        """The strategy as the run record states it."""
        return OfferedLoad(self.kind, self.concurrency, self.request_rate)
