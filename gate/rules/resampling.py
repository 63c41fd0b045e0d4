"""A metric's samples grouped into resampling units, so intervals respect correlation.

Tokens of one request are correlated (one slow step delays several), so every interval
resamples whole units: a request for request and token metrics, a continuation for
overlap. A unit's key pairs it with the same cell of another runner (the fallback, or a
baseline report): (prompt_id, max_new_tokens, repetition) for requests.

The statistic of all units equals gate.rules.samples.value() on the same records:
sample aggregations aggregate the concatenated samples; pooled ones sum counters or
totals over the units and divide (never averaging per-request ratios).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gate.metrics.catalogue import COMMITTED_TOKENS_PER_S, REQUEST_SPEEDUP
from gate.records import Measurements
from gate.rules.samples import (
    CONTINUATION_SAMPLES,
    DRIFT_SAMPLES,
    REQUEST_SAMPLES,
    Key,
    Selection,
    aggregate,
    drift_records,
    has_counts,
    paired_speedups,
    pooled_parts,
    request_key,
    uses_windows,
    window_key,
    window_parts,
    windows,
)


@dataclass
class UnitSet:
    """Samples of one metric for one selection, one entry per resampling unit.

    Sample aggregations: values[i] holds unit i's samples (ms, tokens/s, ...). Pooled:
    num[i] / den[i] hold its counter or total (value = offset + sum num / sum den)."""

    aggregation: str
    unit: str  # "request", "continuation" or "window"
    keys: list[Key] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)
    num: np.ndarray = field(default_factory=lambda: np.zeros(0))
    den: np.ndarray = field(default_factory=lambda: np.zeros(0))
    offset: float = 0.0

    @property
    def n(self) -> int:
        return len(self.keys)

    @property
    def samples(self) -> int:
        """Samples behind the statistic: requests for pooled values, else every sample."""
        return self.n if self.aggregation == "pooled" else sum(len(v) for v in self.values)

    def subset(self, keys: list[Key]) -> UnitSet:
        """The units with these keys, in this order (keys must be present)."""
        at = {k: i for i, k in enumerate(self.keys)}
        idx = [at[k] for k in keys]
        return UnitSet(
            self.aggregation,
            self.unit,
            list(keys),
            [self.values[i] for i in idx] if self.values else [],
            self.num[idx] if len(self.num) else self.num,
            self.den[idx] if len(self.den) else self.den,
            self.offset,
        )

    def statistic(self, idx: np.ndarray) -> np.ndarray:
        """The statistic of the units at `idx` (shape (..., k), repeats allowed) -> shape (...)."""
        idx = np.asarray(idx, dtype=int)
        if self.aggregation == "pooled":
            den = self.den[idx].sum(axis=-1)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(den > 0, self.num[idx].sum(axis=-1) / np.where(den > 0, den, 1), np.nan)
                return np.asarray(self.offset + ratio)
        if self.aggregation == "mean":  # the mean of the concatenation: summed sums over summed counts
            sums = np.array([v.sum() for v in self.values])[idx].sum(axis=-1)
            return np.asarray(sums / np.array([len(v) for v in self.values], dtype=float)[idx].sum(axis=-1))
        if all(len(v) == 1 for v in self.values):  # one sample per unit: vectorised
            flat = np.array([v[0] for v in self.values], dtype=float)[idx]
            return _aggregate_last(flat, self.aggregation)
        rows = idx.reshape(-1, idx.shape[-1])
        out = np.array(
            [aggregate(np.concatenate([self.values[i] for i in row]).tolist(), self.aggregation) for row in rows]
        )
        return out.reshape(idx.shape[:-1])

    def point(self) -> float:
        return float(self.statistic(np.arange(self.n))) if self.n else float("nan")


def _aggregate_last(x: np.ndarray, aggregation: str) -> np.ndarray:
    if aggregation in ("p10", "p90", "p95", "p99"):
        return np.asarray(np.percentile(x, float(aggregation[1:]), axis=-1))
    reduce: dict[str, Callable[..., Any]] = {"mean": np.mean, "median": np.median, "min": np.min, "max": np.max}
    return np.asarray(reduce[aggregation](x, axis=-1))


def units(metric: str, aggregation: str, m: Measurements, sel: Selection) -> UnitSet | None:
    """The metric's units for a selection, or None when the metric is not resampled
    (bills and process peaks: computed once, no sampling distribution)."""
    if metric in CONTINUATION_SAMPLES:
        out = UnitSet(aggregation, "continuation")
        seen: dict[str, int] = {}
        for o in m.overlaps:
            if sel.takes(o):
                seq = CONTINUATION_SAMPLES[metric](o)
                vals = np.array([float(v) for v in seq if v is not None], dtype=float)
                if len(vals):
                    seen[o.prompt_id] = seen.get(o.prompt_id, -1) + 1
                    out.keys.append((o.prompt_id, seen[o.prompt_id]))
                    out.values.append(vals)
        return out
    if metric in DRIFT_SAMPLES:  # one continuation of the target against the release
        out = UnitSet(aggregation, "continuation")
        seen = {}
        for d in drift_records(m, sel):
            vals = np.array([float(v) for v in DRIFT_SAMPLES[metric](d) if v is not None], dtype=float)
            if len(vals):
                seen[d.prompt_id] = seen.get(d.prompt_id, -1) + 1
                out.keys.append((d.prompt_id, seen[d.prompt_id]))
                out.values.append(vals)
        return out
    by_window = window_parts(metric, sel) if aggregation == "pooled" else None
    if by_window is not None and uses_windows(metric, m, sel):
        num_w, den_w = by_window  # one unit per measured window, paired by load point and repetition
        ws = [w for w in windows(m, sel, metric) if den_w(w) > 0 and num_w(w) == num_w(w)]
        return UnitSet(
            "pooled",
            "window",
            [window_key(w) for w in ws],
            [],
            np.array([float(num_w(w)) for w in ws]),
            np.array([float(den_w(w)) for w in ws]),
        )
    reqs = [r for r in m.requests if sel.takes(r)]
    if metric == REQUEST_SPEEDUP.name:  # one paired request: draft tokens/s over the fallback's on the same cell
        out = UnitSet(aggregation, "request")
        for key, x in paired_speedups(m, sel):
            out.keys.append(key)
            out.values.append(np.array([x]))
        return out
    parts = pooled_parts(metric, sel) if aggregation == "pooled" else None
    if parts is not None:
        num, den, offset = parts
        if metric != COMMITTED_TOKENS_PER_S.name:
            reqs = [r for r in reqs if has_counts(metric, r)]
        reqs = [r for r in reqs if den(r) > 0]  # e.g. no proposal made: nothing to pool, and no key to pair
        return UnitSet(
            "pooled",
            "request",
            [request_key(r) for r in reqs],
            [],
            np.array([float(num(r)) for r in reqs]),
            np.array([float(den(r)) for r in reqs]),
            offset,
        )
    if metric in REQUEST_SAMPLES:
        out = UnitSet(aggregation, "request")
        for r in reqs:
            vals = np.array([v for v in REQUEST_SAMPLES[metric](r) if v == v], dtype=float)
            if len(vals):
                out.keys.append(request_key(r))
                out.values.append(vals)
        return out
    return None
