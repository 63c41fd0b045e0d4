"""Which records a value is computed from (Selection), and how raw samples aggregate.

The bottom of the rules layer: samples, units, confidence and evaluation all build on it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gate.records import FALLBACK, Measurements, OverlapRecord, RequestRecord, RunRecord


@dataclass(frozen=True)
class Selection:
    """Which records a value is computed from. None: every value of that field.
    `max_new_tokens` does not filter overlap records (overlap does not depend on it)."""

    runner: str  # a draft name or "fallback"
    law: str
    categories: tuple[str, ...] | None  # None: all
    context_length: int | None = None  # a context-sweep length (tokens)
    max_new_tokens: int | None = None
    concurrency: tuple[int, ...] | None = None  # served load points (closed loop); None: all
    request_rate: tuple[float, ...] | None = None  # served load points (open loop, requests/s); None: all
    constraints: tuple[str, ...] | None = None  # workload.constraints labels; None: all
    position: int | None = None  # a per-position metric's proposal position (1-based; rules[].position)

    def takes(self, record: RequestRecord | OverlapRecord) -> bool:
        """Whether a request or overlap record belongs to this selection."""
        return (
            record.draft == self.runner
            and record.law == self.law
            and (self.categories is None or record.category in self.categories)
            and (self.context_length is None or getattr(record, "context_length", None) == self.context_length)
            and (
                self.max_new_tokens is None
                or getattr(record, "max_new_tokens", self.max_new_tokens) == self.max_new_tokens
            )
            and (self.constraints is None or getattr(record, "constraint", None) in self.constraints)
            and self.takes_load(getattr(record, "concurrency", None), getattr(record, "request_rate", None))
        )

    def takes_load(self, concurrency: int | None, request_rate: float | None) -> bool:
        """Whether a load point (a record's concurrency or request rate; None, None: none) is in the selection."""
        if self.concurrency is None and self.request_rate is None:
            return True
        return (self.concurrency is not None and concurrency in self.concurrency) or (
            self.request_rate is not None and request_rate in self.request_rate
        )

    def takes_window(self, w: RunRecord) -> bool:
        """Whether a measured window (its runner, law and load point) belongs to this selection."""
        return (
            w.runner == self.runner
            and w.law == self.law
            and self.takes_load(w.load.concurrency if w.load.kind == "concurrency" else None, w.load.request_rate)
        )

    @property
    def whole_windows(self) -> bool:
        """Whether the selection takes whole windows (no filter by category, length, context or constraint)."""
        return (
            self.categories is None
            and self.context_length is None
            and self.max_new_tokens is None
            and self.constraints is None
        )

    def of(self, runner: str) -> Selection:
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


def swept_runners(m: Measurements) -> dict[str, dict[int, str]]:
    """Each swept draft -> {K: the runner that ran it}, K = 0 the fallback and the declared K
    the draft itself; only drafts some sweep runner varies."""
    out: dict[str, dict[int, str]] = {}
    for name, info in m.drafts.items():
        if info is None:  # a draft known by name only (recorded samples, hand-made measurements)
            continue
        if info.swept:
            out.setdefault(name, {})
        if info.sweep_of is not None and info.num_draft_tokens is not None:
            out.setdefault(info.sweep_of, {})[info.num_draft_tokens] = name
    for draft, ks in out.items():
        declared = m.drafts.get(draft)
        if declared is not None and declared.num_draft_tokens is not None:
            ks[declared.num_draft_tokens] = draft
        ks[0] = FALLBACK
    return {d: dict(sorted(ks.items())) for d, ks in out.items()}
