"""Confidence intervals behind every performance verdict, and the three-way decision.

- Means, ratios and pooled values: a bootstrap over resampling units (requests, or paired
  requests when a draft is divided by the fallback): the bootstrap standard error times a
  t quantile with Hesterberg's small-sample expansion, on the log scale for positive values
  (bootstrap_interval says why: BCa was measured anti-conservative at the sizes gate runs).
- Percentile ceilings against an absolute threshold (p99 ITL <= 50 ms): count the samples
  beyond the threshold and bound the share with the exact binomial (Clopper-Pearson) as
  MLPerf's early stopping does; tokens of one request are correlated, so the sample size is
  deflated by the design effect measured from per-request counts (Kish 1965, Survey
  Sampling, eq. 8.2.2): n_eff = n / deff, deff = cluster variance / binomial variance.

- Comparisons of runners timed in windows of their own (load points): the hull of the
  bootstrap interval and a t interval from the spread of the comparison between repetitions
  of its window pairs, so drift of the machine between windows is in it (between_windows).

Decision: pass when the whole interval satisfies the rule, fail when the whole interval
violates it, inconclusive otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from gate.core.units import Dimension
from gate.metrics.catalogue import COMMITTED_TOKENS_PER_S, METRICS, SPEEDUP
from gate.records import FALLBACK, Measurements
from gate.rules.resampling import UnitSet, units
from gate.rules.samples import Key, window_of
from gate.rules.selection import Selection
from gate.rules.status import Status

PASS, FAIL, INCONCLUSIVE = Status.PASS, Status.FAIL, Status.INCONCLUSIVE
# Fewer resampling units than this give no interval: with 2-4 units the bootstrap has a
# handful of distinct resamples and its interval collapses (e.g. two equal continuations
# give [x, x]); such verdicts are inconclusive.
MIN_UNITS = 5


@dataclass
class Interval:
    """A two-sided confidence interval of a rule's value (the rule's units, or a ratio).

    `units`: resampling units behind it (requests, paired requests, continuations);
    `method`: how it was obtained, e.g. "bootstrap BCa, 2000 resamples"."""

    low: float
    high: float
    level: float
    method: str
    units: int


@dataclass
class Exceedance:
    """A percentile ceiling decided by counting: `count` of `n` samples lie beyond the
    threshold; [low, high] bounds their true share (Clopper-Pearson on the effective sample
    size n / design_effect); `allowed` is the share the percentile permits (0.01 for p99)."""

    count: int
    n: int
    units: int
    design_effect: float
    share: float
    low: float
    high: float
    allowed: float
    level: float


@dataclass
class Estimand:
    """A value computed from groups of unit sets. Sets in one group share keys and are
    resampled together (paired); groups are resampled independently (two runs).
    `combine` maps the statistics of every set, in group order, to the value."""

    groups: list[list[UnitSet]]
    combine: Callable[[list[np.ndarray]], np.ndarray]
    # the value's natural range, which its interval keeps to: a share lies in [0, 1]; times, rates,
    # counts, bytes and ratios of them are >= 0 (translation_loss, 1 - a ratio, can be negative)
    share: bool = False
    nonnegative: bool = True
    # a share of trials (proposals accepted): a value of 0 or 1 on every unit is a sampling outcome, bounded by
    # Clopper-Pearson (bootstrap_interval); on a share of a continuous quantity (overlap, drift) it is structural
    trials: bool = False

    def value(self, *idx: np.ndarray) -> np.ndarray:
        stats_ = [s.statistic(i) for group, i in zip(self.groups, idx, strict=False) for s in group]
        return self.combine(stats_)

    def point(self) -> float:
        return float(self.value(*[np.arange(g[0].n) for g in self.groups]))

    @property
    def units(self) -> int:
        return min(g[0].n for g in self.groups)


def single(u: UnitSet) -> Estimand:
    """One unit set's own statistic."""
    return Estimand([[u]], lambda s: s[0])


def _sets(e: Estimand) -> int:
    return sum(len(g) for g in e.groups)


def ratio(num: Estimand, den: Estimand, paired: bool) -> Estimand:
    """num / den. Paired (one group each): restricted to the cells both have and resampled
    together, so a resample draws the same cells for both (the fallback run moments before
    each draft request). Unpaired: the groups are resampled independently (two runs)."""
    k = _sets(num)

    def combine(s: list[np.ndarray]) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(num.combine(s[:k]) / den.combine(s[k:]))

    if paired and len(num.groups) == len(den.groups) == 1:
        theirs = set(den.groups[0][0].keys)
        keys = [key for key in num.groups[0][0].keys if key in theirs]
        group = [u.subset(keys) for u in num.groups[0]] + [u.subset(keys) for u in den.groups[0]]
        return Estimand([group], combine, nonnegative=num.nonnegative and den.nonnegative)
    return Estimand(num.groups + den.groups, combine, nonnegative=num.nonnegative and den.nonnegative)


def estimand(metric: str, aggregation: str, m: Measurements, where: Selection) -> Estimand | None:
    """One runner's value as an estimand (speedup: its pooled committed tokens/s over the
    fallback's on the same cells, paired); None for metrics that are not resampled."""
    if metric == SPEEDUP.name:
        num = units(COMMITTED_TOKENS_PER_S.name, "pooled", m, where)
        den = units(COMMITTED_TOKENS_PER_S.name, "pooled", m, where.of(FALLBACK))
        return ratio(single(num), single(den), paired=True) if num and den else None
    u = units(metric, aggregation, m, where)
    if u is None:
        return None
    known = METRICS.get(metric)
    return replace(
        single(u),
        share=known is not None and known.share,
        trials=known is not None and known.share and known.of_proposals,
        nonnegative=known is None or known.dimension is not Dimension.RATIO or known.share or known.ratio_not_share,
    )


def bootstrap_interval(est: Estimand, level: float, resamples: int, seed: int) -> Interval | None:
    """The confidence interval of an estimand at `level`: its bootstrap standard error (over
    `resamples` resamples of its units) times a Student t quantile, on the log scale when the
    value and every resample are positive (ratios, times, rates: a ratio's interval is then
    symmetric in log, as 0.8x and 1.25x are), on the logit scale for a share inside (0, 1)
    (overlap, acceptance rate: the interval stays within them; a share whose resamples reach 0
    or 1 on its own scale, cut at 0 and 1), else on the value's own scale:

        value * exp(+-c * se(log value*)),   c = t_{n-1}(1 - alpha/2) * sqrt(n / (n - 1)),

    n the units of the smallest group. c is the t quantile with the expansion that makes a
    bootstrap interval of a mean hold its coverage at small n (Hesterberg 2015, "What
    teachers should know about the bootstrap", The American Statistician 69(4), section
    "expanded percentile interval"). Measured, not assumed: on simulated A/A pairs of the
    embedded default's shape (benchmarks/sequential.py) scipy's BCa interval at 95% rejected
    8.5% of 2,000 runs at 24 pairs, this one 5.7%, and 4.8% at 64 pairs. A standard error
    also holds at the levels a sequential look decides at (99.9% and beyond,
    gate.rules.sequential), where a percentile or BCa tail holds under one of 2,000 resamples.

    On the value's own scale the interval keeps to the value's natural range (Estimand.share,
    .nonnegative). None with fewer than MIN_UNITS units in a group.
    Raises nothing for degenerate data: every unit giving the same value is a point interval,
    but for a share of trials (acceptance) at 0 or 1, whose bound is Clopper-Pearson's over the
    units as trials."""
    if any(g[0].n < MIN_UNITS for g in est.groups):
        return None
    n = min(g[0].n for g in est.groups)
    point = est.point()
    if math.isnan(point):
        return None
    rng = np.random.default_rng(seed)
    draws = np.asarray(est.value(*[rng.integers(0, g[0].n, size=(resamples, g[0].n)) for g in est.groups]), float)
    if np.all(draws == point):  # every unit gives the same value (an infinity included)
        if est.trials and point in (0.0, 1.0):
            # a share of trials at the end of its range (every proposal accepted, or none): the bootstrap has no
            # spread to show, so the bound is Clopper-Pearson's with each unit one trial, which holds however
            # correlated a unit's own counts are (Clopper & Pearson 1934; at n units all 1, the lower bound
            # (alpha/2)^(1/n)). A continuous share at 0 or 1 everywhere (overlap of a draft that is the target,
            # drift of an unchanged target) is structural, and keeps its point interval.
            bound = ((1 - level) / 2) ** (1 / n)
            low, high = (bound, 1.0) if point == 1.0 else (0.0, 1.0 - bound)
            why = f"every unit at {point:g}: Clopper-Pearson bound over its {n} units as trials"
            return Interval(low, high, level, why, est.units)
        return Interval(point, point, level, "bootstrap: every resample equal", est.units)
    draws = draws[np.isfinite(draws)]
    if draws.size < 2 or not math.isfinite(point):
        return None
    c = float(stats.t.ppf(1 - (1 - level) / 2, n - 1)) * math.sqrt(n / (n - 1))
    method = f"bootstrap standard error ({resamples} resamples) x t quantile ({n - 1} df)"
    if est.share and 0 < point < 1 and np.all((draws > 0) & (draws < 1)):  # a share: logit scale, within (0, 1)
        se = float(np.std(np.log(draws / (1 - draws)), ddof=1))
        mid = math.log(point / (1 - point))
        low, high = (1 / (1 + math.exp(-(mid + d * c * se))) for d in (-1, 1))
        return Interval(low, high, level, f"{method}, logit scale", est.units)
    if not est.share and point > 0 and np.all(draws > 0):
        se = float(np.std(np.log(draws), ddof=1))
        return Interval(point * math.exp(-c * se), point * math.exp(c * se), level, f"{method}, log scale", est.units)
    se = float(np.std(draws, ddof=1))
    low, high = point - c * se, point + c * se
    if est.nonnegative:  # a bound beyond the value's range says no more than the range's end
        low = max(low, 0.0)
    if est.share:
        low, high = max(low, 0.0), min(high, 1.0)
    return Interval(low, high, level, method, est.units)


def speedup_interval(
    m: Measurements, where: Selection, level: float, resamples: int, seed: int
) -> tuple[float | None, float | None, float | None]:
    """A runner's pooled speedup over the fallback on the paired requests of `where` (x), with
    its bootstrap interval at `level`, widened by the drift between windows (between_windows):
    (point, low, high); None for what cannot be formed (no paired request; fewer than
    MIN_UNITS units for the interval; a non-finite point)."""
    est = estimand(SPEEDUP.name, "pooled", m, where)
    if est is None or not all(g[0].n for g in est.groups):
        return None, None, None
    point = est.point()
    peers = [estimand(SPEEDUP.name, "pooled", m, sel) for sel in peer_selections(m, where)]
    interval = widened(bootstrap_interval(est, level, resamples, seed), between_windows(est, peers, level))
    return (point if math.isfinite(point) else None, *((interval.low, interval.high) if interval else (None, None)))


@dataclass
class Drift:
    """How far a comparison of two runners moves between repetitions of their windows.

    Runners at a load point are timed one window after another, so whatever drifts on the
    machine between windows (another job, thermal state, the page cache) moves a whole
    window's requests together, and a bootstrap over requests does not see it. Each window
    pair (load point, repetition) gives the comparison's value on its requests alone; `sd` is
    the standard deviation of its log between repetitions at one load point, pooled over every
    runner and load point of the run (one-way ANOVA's error mean square), with `df` = the sum
    of (repetitions - 1) over them. [low, high] is the value's t interval at `level`: log value
    +- t(df) * sd * sqrt(sum w^2), w the share of the value's units in each of its `windows`
    window pairs. df 0 (one repetition everywhere): nothing measures the drift; low, high None."""

    sd: float | None
    df: int
    windows: int
    low: float | None = None
    high: float | None = None

    def describe(self, bootstrap: Interval, shown: Interval, fmt: Callable[[float], str]) -> str:
        """What the drift did to the interval `shown` (widened(bootstrap, self)), for a verdict's
        message; `fmt` formats a value of the comparison (e.g. '0.978x')."""
        if self.sd is None:
            return (
                "one repetition of each window: the drift between the runners' windows is not measured and not in "
                "the interval (measurement.repetitions >= 2 measures it)"
            )
        what = f"the drift between windows (sd {self.sd:.1%} over {self.df} df)"
        if (shown.low, shown.high) == (bootstrap.low, bootstrap.high):
            return f"{what} lies within it"
        return f"widened from the requests' {fmt(bootstrap.low)}-{fmt(bootstrap.high)} by {what}"


def compared_runners(m: Measurements) -> list[str]:
    """The runners of a run other than the fallback (drafts and sweep runners), in record order."""
    return list(dict.fromkeys(r.draft for r in m.requests if r.draft != FALLBACK))


def peer_selections(m: Measurements, where: Selection) -> list[Selection]:
    """`where` for every compared runner of `m` at every load point: the comparisons whose
    spread between repetitions between_windows pools."""
    return [replace(where, runner=r, concurrency=None, request_rate=None) for r in compared_runners(m)]


def _log_by_window(est: Estimand | None) -> dict[Key, dict[int, tuple[float, int]]]:
    """{load point: {repetition: (log value, units)}}: a paired estimand on each window pair's
    units alone; empty when its units were not timed in windows (or it is not paired)."""
    if est is None or len(est.groups) != 1 or not est.groups[0][0].n:
        return {}
    keys = est.groups[0][0].keys
    where = [w for k in keys if (w := window_of(k)) is not None]
    if len(where) < len(keys):
        return {}
    at: dict[tuple[Key, int], list[int]] = {}
    for i, w in enumerate(where):
        at.setdefault(w, []).append(i)
    out: dict[Key, dict[int, tuple[float, int]]] = {}
    for (load, rep), idx in at.items():
        with np.errstate(divide="ignore", invalid="ignore"):
            v = float(est.value(np.array(idx)))
        if math.isfinite(v) and v > 0:
            out.setdefault(load, {})[rep] = (math.log(v), len(idx))
    return out


def between_windows(est: Estimand | None, peers: list[Estimand | None], level: float) -> Drift | None:
    """The drift between windows of a paired comparison (Drift), its variance pooled over
    `peers` (the same comparison for every runner, at every load point; `est` is used when
    there are none). None when `est`'s units were not timed in windows (gate's own loop, which
    runs the runners cell by cell) or its value is not positive."""
    own = _log_by_window(est)
    if not own or est is None:
        return None
    point = est.point()
    if not (math.isfinite(point) and point > 0):
        return None
    ss, df = 0.0, 0
    for peer in [p for p in peers if p is not None] or [est]:
        for reps in _log_by_window(peer).values():
            if len(reps) >= 2:
                v = np.array([x for x, _ in reps.values()])
                ss += float(((v - v.mean()) ** 2).sum())
                df += len(v) - 1
    counts = np.array([n for reps in own.values() for _, n in reps.values()], dtype=float)
    if df == 0:
        return Drift(None, 0, len(counts))
    sd = math.sqrt(ss / df)
    half = float(stats.t.ppf((1 + level) / 2, df)) * sd * math.sqrt(float(((counts / counts.sum()) ** 2).sum()))
    return Drift(sd, df, len(counts), point * math.exp(-half), point * math.exp(half))


def widened(interval: Interval | None, drift: Drift | None) -> Interval | None:
    """The interval that holds both the bootstrap interval over units and the drift's t
    interval (so neither the noise within windows nor the drift between them is left out);
    the bootstrap interval itself without a measured drift, None without a bootstrap interval."""
    if interval is None or drift is None or drift.low is None or drift.high is None:
        return interval
    if drift.low >= interval.low and drift.high <= interval.high:
        return interval
    return Interval(
        min(interval.low, drift.low),
        max(interval.high, drift.high),
        interval.level,
        f"{interval.method}, widened to the drift between windows (t, {drift.df} df)",
        interval.units,
    )


def between_runs(interval: Interval | None, fallback: Interval | None) -> Interval | None:
    """A comparison with a baseline report (candidate / baseline) that holds the drift
    between the two runs, as measured by the fallback's own change between them (the same
    metric of the same non-speculative runner: an A/A of the machine and engine across the
    runs): the hull of the interval as measured and the interval divided by the fallback's
    ([low / fallback.high, high / fallback.low]), so neither "the machine drifted" nor "it
    did not" is assumed. `interval` itself without the fallback's (None: not measured)."""
    if interval is None or fallback is None or fallback.low <= 0 or not math.isfinite(fallback.high):
        return interval
    low, high = min(interval.low, interval.low / fallback.high), max(interval.high, interval.high / fallback.low)
    return Interval(
        low,
        high,
        interval.level,
        f"{interval.method}, widened by the fallback's change between the runs",
        interval.units,
    )


def exceedance(u: UnitSet, threshold: float, comparison: str, quantile: float, level: float) -> Exceedance:
    """Bound the share of samples beyond `threshold` for a percentile rule.

    comparison "<=" / "<" (a ceiling): counts samples above the threshold, allowed share
    1 - quantile. ">=" / ">" (a floor): counts samples below it, allowed share quantile.
    Clopper-Pearson bounds at `level` (two-sided) on n_eff = n / deff samples. With no
    sample beyond the threshold (or all of them) the design effect cannot be estimated and
    is taken as 1, as MLPerf's early stopping treats every query as independent."""
    ceiling = comparison in ("<=", "<")
    beyond = [
        (v > threshold)
        if comparison == "<="
        else (v >= threshold)
        if comparison == "<"
        else (v < threshold)
        if comparison == ">="
        else (v <= threshold)
        for v in u.values
    ]
    k_i = np.array([b.sum() for b in beyond], dtype=float)
    n_i = np.array([len(b) for b in beyond], dtype=float)
    k, n, m = k_i.sum(), n_i.sum(), len(n_i)
    share = k / n if n else float("nan")
    deff = 1.0
    if m > 1 and 0 < k < n and n > m:  # ratio-estimator variance over clusters vs the binomial variance
        # (one sample per unit: nothing is clustered, the design effect is 1 by definition)
        cluster_var = m / (m - 1) * float(((k_i - share * n_i) ** 2).sum()) / n**2
        deff = max(1.0, cluster_var / (share * (1 - share) / n))
    n_eff = n / deff
    k_eff = share * n_eff
    alpha = 1 - level
    low = float(stats.beta.ppf(alpha / 2, k_eff, n_eff - k_eff + 1)) if k_eff > 0 else 0.0
    high = float(stats.beta.ppf(1 - alpha / 2, k_eff + 1, n_eff - k_eff)) if k_eff < n_eff else 1.0
    allowed = 1 - quantile if ceiling else quantile
    return Exceedance(int(k), int(n), m, deff, share, low, high, allowed, level)


def decide_exceedance(e: Exceedance) -> Status:
    """pass when the share's whole interval is within the allowed share, fail when it is all beyond."""
    if e.n == 0:
        return INCONCLUSIVE
    if e.high <= e.allowed:
        return PASS
    if e.low > e.allowed:
        return FAIL
    return INCONCLUSIVE


def decide(interval: Interval, comparison: str, threshold: float) -> Status:
    """pass / fail / inconclusive for `value <comparison> threshold` over the interval."""
    ops: dict[str, Callable[[float, float], bool]] = {
        ">=": lambda x, t: x >= t,
        ">": lambda x, t: x > t,
        "<=": lambda x, t: x <= t,
        "<": lambda x, t: x < t,
    }
    ok = ops[comparison]
    if ok(interval.low, threshold) and ok(interval.high, threshold):
        return PASS
    if not ok(interval.low, threshold) and not ok(interval.high, threshold):
        return FAIL
    return INCONCLUSIVE


def min_samples_to_pass(quantile: float, level: float, ceiling: bool = True) -> int:
    """The fewest samples with which a percentile rule can pass at all: with no sample
    beyond the threshold, the Clopper-Pearson upper bound 1 - (alpha/2)^(1/n) must reach
    the allowed share (1 - quantile for a ceiling, quantile for a floor)."""
    allowed = 1 - quantile if ceiling else quantile
    alpha = 1 - level
    return math.ceil(math.log(alpha / 2) / math.log(1 - allowed))


QUANTILES = {"p10": 0.1, "p90": 0.9, "p95": 0.95, "p99": 0.99, "median": 0.5}
