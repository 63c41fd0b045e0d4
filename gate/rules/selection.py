"""Which records a value is computed from (Selection), and how raw samples aggregate.

The bottom of the rules layer: samples, units, confidence and evaluation all build on it."""

from __future__ import annotations

from dataclasses import dataclass, replace
import numpy as np

from gate.records import OverlapRecord, RequestRecord


@dataclass(frozen=True)
class Selection:
    """Which records a value is computed from. None: every value of that field.
    `max_new_tokens` does not filter overlap records (overlap does not depend on it)."""

    runner: str  # a draft name or "fallback"
    law: str
    categories: tuple[str, ...] | None  # None: all
    context_length: int | None = None  # a context-sweep length (tokens)
    max_new_tokens: int | None = None

    def takes(self, record: RequestRecord | OverlapRecord) -> bool:
        """Whether a request or overlap record belongs to this selection."""
        return (record.draft == self.runner and record.law == self.law
                and (self.categories is None or record.category in self.categories)
                and (self.context_length is None or getattr(record, "context_length", None) == self.context_length)
                and (self.max_new_tokens is None or getattr(record, "max_new_tokens", self.max_new_tokens) == self.max_new_tokens))

    def of(self, runner: str) -> "Selection":
        """The same cells for another runner (the fallback, or a baseline's draft)."""
        return replace(self, runner=runner)


def aggregate(values: list[float], aggregation: str) -> float:
    """mean, median, p10, p90, p95, p99 (linear interpolation between order statistics), min, max."""
    if not values:
        return float("nan")
    arr = np.asarray(values, dtype=float)
    if aggregation == "mean":
        return float(arr.mean())
    if aggregation == "median":
        return float(np.median(arr))
    if aggregation in ("p10", "p90", "p95", "p99"):
        return float(np.percentile(arr, float(aggregation[1:])))
    if aggregation == "min":
        return float(arr.min())
    if aggregation == "max":
        return float(arr.max())
    raise KeyError(f"unknown aggregation {aggregation!r}")
