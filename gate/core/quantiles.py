"""The descriptive quantile that reports and self-checks quote (a median, a p99 of lags or of
server times): not a verdict's, which has its interval (gate.rules.confidence)."""

from __future__ import annotations

from collections.abc import Iterable


def order_statistic(values: Iterable[float], q: float) -> float | None:
    """The sample q-quantile as one observed value: the order statistic x_(i) at 0-based
    index i = min(n - 1, floor(q n)) of the sorted values (the upper of two middle values
    for a median of an even count; Hyndman & Fan 1996's inverse empirical distribution,
    rounded up). Same unit as the values; None when there are none.

    Raises ValueError for q outside [0, 1]."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    xs = sorted(values)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(q * len(xs)))]
