"""Rule kind 'metric' (the default): a Lighthouse CI-style assertion on one metric of
gate.metrics.catalogue: metric, aggregation, comparison, threshold, optionally relative to the
fallback or the baseline, decided per draft and law (and per value of `per`).

Every verdict is decided on a confidence interval (gate.rules.confidence): pass when the
whole interval satisfies the rule, fail (warn at level warn) when the whole interval
violates it, inconclusive otherwise; error: the measurement failed or produced no sample;
skipped: level off. Messages read like "committed_tokens_per_s (pooled, relative to
fallback): 1.07x (24 paired requests, 95% CI 1.02x-1.12x) vs >= 1.10x: inconclusive".
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from typing import Any

from gate.core.quantiles import order_statistic
from gate.core.units import Dimension, format_value, parse_quantity
from gate.measure.client_check import describe_delayed, is_client_delayed
from gate.measure.contention import describe, is_contended, pooled_stall_share
from gate.metrics.catalogue import (
    ACCEPTANCE_RATE,
    COMPUTED_ONCE,
    FALLBACK_RATIOS,
    METRICS,
    RATIO_NOT_SHARE,
    RESAMPLED,
    SERVER_HEADERS_MS,
    TIMED,
    compares_with_fallback,
)
from gate.records import FALLBACK, Failure, FailureStage, Measurements, RequestRecord, describe_failures
from gate.rules.confidence import (
    MIN_UNITS,
    QUANTILES,
    Estimand,
    Interval,
    between_runs,
    between_windows,
    bootstrap_interval,
    decide,
    decide_exceedance,
    estimand,
    exceedance,
    peer_selections,
    ratio,
    widened,
)
from gate.rules.kinds.interface import RuleKind, Settings, shown_threshold
from gate.rules.outcome import Outcome
from gate.rules.resampling import UnitSet
from gate.rules.samples import (
    POSITION_METRICS,
    WINDOW_ONLY,
    Selection,
    device_memory_unmeasured,
    pooled,
    position_denominator,
    position_parts,
    samples,
    value,
)
from gate.rules.scope import (
    LOAD_AXES,
    inapplicable_points,
    not_applicable_reason,
    other_axis,
    point_name,
    scope_key,
    scoped_points,
)
from gate.rules.sequential import look_of, shown_level
from gate.rules.status import Status

_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


_EXAMPLE = {
    "bytes": "2 GiB",
    "ms": "120 ms",
    "tokens/s": "25 tokens/s",
    "requests/s": "2 requests/s",
    "tokens": "3 tokens",
}


@dataclass(frozen=True)
class MetricRule:
    """A metric rule as evaluation reads it (a gate.policy.model.RuleSpec whose metric,
    comparison and threshold are present: MetricRules.spec_problem checked them). threshold:
    as written (for messages); threshold_value: in the metric's base units (a ratio when
    relative_to is set); the scope's categories, load points and constraints as tuples
    (None: all)."""

    id: str
    metric: str
    aggregation: str
    comparison: str
    threshold: str | float
    threshold_value: float
    relative_to: str | None
    line: str | None
    per: str | None
    level: str
    confidence: float | None
    categories: tuple[str, ...] | None
    concurrency: tuple[int, ...] | None
    request_rate: tuple[float, ...] | None
    constraints: tuple[str, ...] | None
    position: int | None = None

    @classmethod
    def of(cls, rule: Any) -> MetricRule:
        """The view of a policy rule (rule: a gate.policy.model.RuleSpec). Raises ValueError when
        its metric, comparison or threshold is missing."""
        if rule.metric is None or rule.comparison is None or rule.threshold is None:
            raise ValueError(f"rule {rule.id!r}: a metric rule needs metric, comparison and threshold")
        scope = rule.scope

        def listed(key: str) -> tuple[Any, ...] | None:
            values = getattr(scope, key, None)
            return tuple(values) if values else None

        return cls(
            rule.id,
            rule.metric,
            rule.aggregation,
            rule.comparison,
            rule.threshold,
            rule.threshold_value,
            rule.relative_to,
            rule.line,
            rule.per,
            rule.level,
            rule.confidence,
            listed("categories"),
            listed("concurrency"),
            listed("request_rate"),
            listed("constraints"),
            rule.position,
        )


class MetricRules(RuleKind):
    """A metric rule needs metric, comparison and threshold; its threshold is in the metric's
    dimension (a ratio when relative_to is set)."""

    name = "metric"
    keys = (
        "kind",
        "metric",
        "line",
        "position",
        "aggregation",
        "comparison",
        "threshold",
        "relative_to",
        "scope",
        "level",
    )
    reads_metric = True

    def spec_problem(self, rule: Any) -> tuple[str, str] | None:
        for key in ("metric", "comparison", "threshold"):
            if getattr(rule, key) is None:
                return key, "required key is missing (a metric rule needs metric, comparison and threshold)"
        metric = METRICS[rule.metric]
        if rule.per and rule.metric in COMPUTED_ONCE:
            return "per", f"metric {rule.metric} is computed once per draft; it has no breakdown by {rule.per}"
        if metric.takes_line != (rule.line is not None):
            lined = " and ".join(name for name, m in METRICS.items() if m.takes_line)
            return "line", f"{lined} needs a line (e.g. 'draft KV cache'), and only it takes one"
        if metric.takes_position != (rule.position is not None):
            positioned = " and ".join(name for name, m in METRICS.items() if m.takes_position)
            return "position", f"{positioned} need a position (1: the first proposed token), and only they take one"
        if rule.aggregation not in metric.aggregations:
            if "aggregation" not in rule.model_fields_set:
                return "aggregation", (
                    f"metric {rule.metric} needs aggregation {' or '.join(metric.aggregations)} (the default, "
                    f"{rule.aggregation}, does not apply to it)"
                )
            return "aggregation", (
                f"metric {rule.metric} takes aggregation {' or '.join(metric.aggregations)}, not {rule.aggregation!r}"
            )
        if rule.relative_to == "fallback" and not metric.fallback_has_it:
            return "relative_to", f"metric {rule.metric} has no fallback value; relative_to: fallback does not apply"
        return _threshold_problem(MetricRule.of(rule), metric.dimension)

    def evaluate(
        self, rule: Any, m: Measurements, drafts: list[str], laws: list[str], settings: Settings
    ) -> list[Outcome]:
        out: list[Outcome] = []
        view = MetricRule.of(rule)
        for draft in drafts:
            for law in laws:
                out += [_one(view, m, where, settings) for where in _cells(view, m, draft, law, settings.load_points)]
                out += [_not_applicable(view, where) for where in _gaps(view, draft, law, settings.load_points)]
        return out


KIND = MetricRules()


def _threshold_problem(rule: MetricRule, dimension: Dimension) -> tuple[str, str] | None:
    """A threshold in the wrong dimension: a percentage where a ratio is meant, no unit, or another unit."""
    q = parse_quantity(rule.threshold)
    expected = Dimension.RATIO if rule.relative_to else dimension
    shown = shown_threshold(rule.threshold)
    if (
        isinstance(rule.threshold, str)
        and rule.threshold.strip().endswith("%")
        and (rule.relative_to or rule.metric in RATIO_NOT_SHARE)
    ):
        n = q.value * 100
        counts = METRICS[rule.metric].counts if rule.metric in METRICS else None
        what = (
            f"{rule.metric} is a count of {counts}"
            if counts
            else f"{rule.metric}{' relative to the ' + rule.relative_to if rule.relative_to else ''} is a ratio "
            "(1.0x: equal)"
        )
        hint = (
            "write a number, e.g. 2"
            if counts
            else f"write the ratio, e.g. '{1 + q.value:g}x' ({n:g}% above) or '{1 - q.value:g}x' ({n:g}% below)"
            if n < 50
            else f"write the ratio, e.g. '{q.value:g}x' ({n:g}% of it)"
        )
        return "threshold", f"threshold {shown} is a percentage, but {what}: it would read as {q.value:g}x; {hint}"
    if q.dimension is None and expected is not Dimension.RATIO:
        example = _EXAMPLE.get(expected.value, expected.value)
        return "threshold", (
            f"threshold {shown} has no unit; {rule.metric} is in {expected.value} "
            f"(write it with a unit, e.g. '{example}')"
        )
    if q.dimension is not None and q.dimension is not expected:
        what = "a ratio to the fallback" if rule.relative_to else f"in {expected.value}"
        return "threshold", f"threshold {shown} is in {q.dimension.value} but {rule.metric} is {what}"
    known = METRICS.get(rule.metric)
    if known is not None and known.share and not rule.relative_to and q.value > 1.0:
        return "threshold", f"threshold {shown} is above 1 (100%), but {rule.metric} is a share: it is at most 1"
    return None


def _cells(
    rule: MetricRule, m: Measurements, draft: str, law: str, declared: dict[str, tuple[float, ...]] | None = None
) -> list[Selection]:
    """The selections a rule is decided on for one draft and law: one, or one per value of `rule.per`."""
    base = Selection(
        draft,
        law,
        rule.categories,
        concurrency=rule.concurrency,
        request_rate=rule.request_rate,
        constraints=rule.constraints,
        position=rule.position,
    )
    if not rule.per:
        return [base]
    if rule.per in LOAD_AXES and declared and any(declared.values()):
        other = other_axis(rule.per)
        # only the points of the rule's own axis: those of the other axis get a "does not apply" outcome (_gaps)
        return [
            replace(base, **_axis(rule.per, (v,), other))
            for v in scoped_points(base.concurrency, base.request_rate, declared, rule.per)
        ]
    records = [r for r in m.requests if base.takes(r)] + [o for o in m.overlaps if base.takes(o)]
    values: list[Any] = sorted(
        {getattr(r, rule.per, None) for r in records} - {None}, key=lambda v: (isinstance(v, str), v)
    )
    if not values:
        return [base]  # nothing measured: one outcome says so
    if rule.per == "category":
        return [replace(base, categories=(v,)) for v in values]
    if rule.per == "constraint":  # in the workload's order ('none' before the constraints, as declared)
        order = list(getattr(m.workload, "constraints", None) or []) if m.workload is not None else []
        values = sorted(values, key=lambda v: (order.index(v) if v in order else len(order), v))
        return [replace(base, constraints=(v,)) for v in values]
    if rule.per in ("concurrency", "request_rate"):  # one load point each (an open loop's points have no concurrency)
        return [replace(base, **_axis(rule.per, (v,), other_axis(rule.per))) for v in values]
    return [replace(base, **_axis(rule.per, v)) for v in values]


def _axis(key: str, value: Any, cleared: str | None = None) -> dict[str, Any]:
    """Selection fields to replace: `key` set to `value` (a `per:` axis), `cleared` set to None."""
    return {key: value, **({cleared: None} if cleared else {})}


def _gaps(rule: MetricRule, draft: str, law: str, declared: dict[str, tuple[float, ...]]) -> list[Selection]:
    """The load points in the rule's scope that its `per:` gives no verdict at (one selection each)."""
    if not declared:
        return []
    gap = inapplicable_points(rule.per, rule.concurrency, rule.request_rate, declared)
    if gap is None:
        return []
    axis, points = gap
    return [
        replace(
            Selection(draft, law, rule.categories, constraints=rule.constraints, position=rule.position),
            **_axis(axis, (v,)),
        )
        for v in points
    ]


def _not_applicable(rule: MetricRule, where: Selection) -> Outcome:
    """The outcome of a rule at a load point its `per:` cannot apply to: skipped, saying why."""
    axis = "concurrency" if where.concurrency is not None else "request_rate"
    (value,) = getattr(where, axis)
    what = (
        f"{rule.metric}"
        + (f" '{rule.line}'" if rule.line else "")
        + (f" at position {rule.position}" if rule.position else "")
        + f" ({rule.aggregation}"
        + (f", relative to {rule.relative_to})" if rule.relative_to else ")")
    )
    return Outcome(
        rule_id=rule.id,
        scope=scope_key(where, rule.per),
        draft=where.runner,
        law=where.law,
        metric=rule.metric,
        aggregation=rule.aggregation,
        comparison=rule.comparison,
        threshold=rule.threshold_value,
        relative_to=rule.relative_to,
        level=rule.level,
        status=Status.SKIPPED,
        measured=None,
        samples=0,
        fallback_value=None,
        message=f"{what}: per: {rule.per} does not apply at {point_name(axis, value)}: "
        f"{not_applicable_reason(axis)}; not evaluated (a rule with per: {axis} decides it)",
    )


def _one(rule: MetricRule, m: Measurements, where: Selection, s: Settings) -> Outcome:
    metric = METRICS[rule.metric]
    draft, law = where.runner, where.law
    scope = scope_key(where, rule.per)
    threshold = rule.threshold_value
    base: dict[str, Any] = dict(
        rule_id=rule.id,
        scope=scope,
        draft=draft,
        law=law,
        metric=rule.metric,
        aggregation=rule.aggregation,
        comparison=rule.comparison,
        threshold=threshold,
        relative_to=rule.relative_to,
        level=rule.level,
    )
    dim = Dimension.RATIO if rule.relative_to else metric.dimension
    # a pooled ratio to the fallback (speedup) is written as one; a mean of per-request ratios is not
    x = "x" if rule.relative_to or (metric.ratio_to_fallback and metric.sampling == "pooled") else ""
    bound = f"{rule.comparison} {format_value(threshold, dim)}{x}"
    what = (
        f"{rule.metric}"
        + (f" '{rule.line}'" if rule.line else "")
        + (f" at position {rule.position}" if rule.position else "")
        + f" ({rule.aggregation}"
        + (f", relative to {rule.relative_to})" if rule.relative_to else ")")
    )
    if rule.level == "off":
        return Outcome(
            **base,
            status=Status.SKIPPED,
            measured=None,
            samples=0,
            fallback_value=None,
            message=f"{what}: level off, not evaluated",
        )
    other = s.baseline_drafts.get(draft, draft)
    failed = [f for f in _failures(rule, m, draft, law) if _at_load(f, where)]
    if rule.relative_to == "baseline" and s.baseline is not None:
        failed += _failures(rule, s.baseline, other, law)
    if rule.relative_to == "baseline" and s.baseline is None:
        return Outcome(
            **base,
            status=Status.ERROR,
            measured=None,
            samples=0,
            fallback_value=None,
            message=f"{what}: no baseline report was loaded vs threshold {bound}",
        )
    if rule.metric not in RESAMPLED:
        return _computed(rule, m, where, s, base, what, bound, dim, failed, other)
    est, reference = _estimands(rule, m, s.baseline, where, other)
    checked = rule.metric in TIMED and (s.max_cpu_stall is not None or s.max_client_lag_ms is not None)
    cleaned = _without_busy(m, s) if checked else (m, [])  # the run without its contended and client-delayed requests
    busy = _contention(rule, m, cleaned, where, s, other, est) if checked else None
    if busy is not None and _only_slower_fails(rule) and not (busy.delayed and METRICS[rule.metric].between_tokens):
        # Contention only slows: a latency ceiling (or throughput floor) met with the contended
        # requests in is met without them. Anything else is decided on the clean requests. A
        # client's delay is not only slower: stamps held back and then taken together shrink the
        # gaps after them, so a gap ceiling is decided without the delayed requests.
        everything = _one(rule, m, where, replace(s, max_cpu_stall=None, max_client_lag_ms=None))
        if everything.status == Status.PASS:
            everything.message += f" ({busy.describe(_unit_word(busy.all, rule))}: slowed, and passed nonetheless)"
            return everything
    if busy is not None and not busy.whole:  # decided on the clean requests only
        est, reference = busy.est, busy.reference
    n = est.units if est is not None and all(g for g in est.groups) else 0
    point = est.point() if est is not None and n else float("nan")
    look = look_of(m, rule.confidence or s.confidence, draft, law)  # a sequential run: the look's share of alpha
    if busy is not None and busy.too_many and not failed:
        return Outcome(
            **base,
            status=Status.INCONCLUSIVE,
            measured=None if math.isnan(point) else point,
            samples=n,
            fallback_value=None,
            message=f"{what}: {busy.describe(_unit_word(busy.all, rule))} ({busy.kept} clean: "
            + ("a window's rate counts every request of it; " if busy.whole else "")
            + (
                f"an interval needs at least {MIN_UNITS}"
                if busy.kept < MIN_UNITS and not busy.whole
                else f"at most {s.max_contended:.0%} may be left out"
            )
            + (f"; {look.describe()}" if look is not None else "")
            + f") vs threshold {bound}: inconclusive",
        )
    if est is None or failed or n == 0 or math.isnan(point):
        return Outcome(
            **base,
            status=Status.ERROR,
            measured=None if math.isnan(point) else point,
            samples=n,
            fallback_value=None,
            message=f"{what}: {_missing(rule, m, where, failed)} vs threshold {bound}",
        )
    level = look.level if look is not None else rule.confidence or s.confidence
    ref_value = reference.point() if reference is not None else None
    unit_word = _unit_word(est, rule)
    shown = format_value(point, dim) + x
    if rule.relative_to and ref_value is not None:
        reference_shown = format_value(ref_value, metric.dimension)
        shown += f" ({format_value(point * ref_value, metric.dimension)} vs {rule.relative_to} {reference_shown})"
    exc, interval = None, None
    if rule.aggregation in QUANTILES and not rule.relative_to:  # decided by counting, no bootstrap
        u = est.groups[0][0]
        exc = exceedance(u, threshold, rule.comparison, QUANTILES[rule.aggregation], level)
        status = decide_exceedance(exc)
        side = "above" if rule.comparison in ("<=", "<") else "below"
        detail = (
            f"{shown} over {u.samples} samples in {u.n} {u.unit}s; {exc.count} {side} "
            f"{format_value(threshold, dim)} ({exc.share:.2%}; {shown_level(level)} CI {exc.low:.2%}-{exc.high:.2%}"
            + (f", design effect {exc.design_effect:.2f}" if exc.design_effect > 1 else "")
            + f"; at most {exc.allowed:.0%} allowed"
            + (f"; {look.describe()}" if look is not None else "")
            + ")"
        )
    elif rule.aggregation in ("min", "max"):
        status = Status.PASS if _OPS[rule.comparison](point, threshold) else Status.FAIL
        detail = (
            f"{shown} ({rule.aggregation} of {est.groups[0][0].samples} samples in {n} {unit_word}: an extreme, "
            "no interval)"
        )
    else:
        interval = bootstrap_interval(est, level, s.resamples, s.seed)
        drift, requests_alone, as_measured = None, interval, None
        if interval is not None and compares_with_fallback(rule.metric, rule.relative_to):
            # the drift measured on the requests the verdict keeps: contended and client-delayed ones left out
            kept = m if busy is not None and busy.whole else cleaned[0]
            peers = [_estimands(rule, kept, s.baseline, sel, other)[0] for sel in peer_selections(m, where)]
            drift = between_windows(est, peers, level)
            interval = widened(interval, drift)
        moved = None
        if interval is not None and _drifts_between_runs(rule, draft):
            # two runs drift apart at least as much as two windows: the fallback's own change between them
            kept = m if busy is None or busy.whole else cleaned[0]
            fallback = _estimands(rule, kept, s.baseline, where.of(FALLBACK), FALLBACK)[0]
            moved = bootstrap_interval(fallback, level, s.resamples, s.seed) if fallback is not None else None
            as_measured, interval = interval, between_runs(interval, moved)
        if interval is None:
            status = Status.INCONCLUSIVE
            detail = f"{shown} ({n} {unit_word}: an interval needs at least {MIN_UNITS}" + (
                f"; {look.describe()})" if look is not None else ")"
            )
        else:
            status = decide(interval, rule.comparison, threshold)
            detail = (
                f"{shown} ({n} {unit_word}, {shown_level(level)} CI {format_value(interval.low, dim)}{x}-"
                f"{format_value(interval.high, dim)}{x}"
                + (
                    f"; {drift.describe(requests_alone, interval, lambda v: format_value(v, dim) + x)}"
                    if drift and requests_alone
                    else ""
                )
                + (
                    f"; widened from {format_value(as_measured.low, dim)}{x}-{format_value(as_measured.high, dim)}{x} "
                    f"by the fallback's change between the runs ({format_value(moved.low, dim)}x-"
                    f"{format_value(moved.high, dim)}x)"
                    if moved is not None and as_measured is not None
                    else "; the drift between the runs is not in it (no fallback measured in both)"
                    if _drifts_between_runs(rule, draft)
                    else ""
                )
                + (f"; {look.describe()}" if look is not None else "")
                + ")"
            )
    note = ""
    if rule.relative_to == "baseline" and s.baseline_mismatch:
        status, note = Status.INCONCLUSIVE, f"; the baseline cannot be compared: {s.baseline_mismatch}"
    elif rule.relative_to == "baseline" and interval and _improved(interval, rule.comparison):
        note = "; a large improvement over the baseline: consider refreshing it"
    if busy is not None and busy.whole:
        note += (
            f"; {busy.describe(_unit_word(busy.all, rule))}: a window's rate cannot leave a request out "
            f"(decided on the whole windows, {busy.kept} clean requests)"
        )
    elif busy is not None:
        note += f"; {busy.describe(_unit_word(busy.all, rule))}, left out (decided on the {busy.kept} clean ones)"
    fewer = _fewer_threads(rule, m, where)
    said = (
        f"{fewer[0]} of the {fewer[3]} requests of {where.runner} ran on {fewer[1]} of the {fewer[2]} compute "
        "threads the process was given (measurement.threads auto fitted them to a busy machine)"
        if fewer is not None
        else ""
    )
    if fewer is not None and compares_with_fallback(rule.metric, rule.relative_to):
        note += f"; {said}, the fallback's and the draft's of each cell alike"  # a ratio at those threads
    elif fewer is not None and status in (Status.PASS, Status.FAIL):
        if status == Status.PASS and _only_slower_fails(rule):
            note += f"; {said}: slowed, and passed nonetheless"
        else:
            status = Status.INCONCLUSIVE
            note += f"; {said}: a slower configuration than the machine's, so not this draft's verdict"
    note += _server_headers(rule, m, where)
    if status == Status.FAIL:
        note += _low_acceptance_cause(rule, m, where)
    if status == Status.FAIL and rule.level == "warn":
        status = Status.WARN
    return Outcome(
        **base,
        status=status,
        measured=point,
        samples=est.groups[0][0].samples,
        fallback_value=ref_value,
        message=f"{what}: measured {detail} vs threshold {bound}: {status}{note}",
        interval=interval,
        exceedance=exc,
    )


def _server_headers(rule: MetricRule, m: Measurements, where: Selection) -> str:
    """ "; of it, the server's time to its response headers ..." for a served time that includes
    it (Metric.includes_server_headers), from server_headers_ms
    over the rule's cell (requests whose response headers came before their first token); ""
    where the metric includes none or no request measured it (in-process; a server that sends
    its headers with its first token)."""
    if not METRICS[rule.metric].includes_server_headers:
        return ""
    answered = samples(SERVER_HEADERS_MS.name, m, where)
    median, p99 = order_statistic(answered, 0.5), order_statistic(answered, 0.99)
    if median is None or p99 is None:
        return ""
    return (
        f"; of it, the server's time to its response headers (its accept queue, its threads, its request "
        f"handling): median {median:.1f} ms, p99 {p99:.1f} ms over {len(answered)} requests "
        "(server_headers_ms)"
    )


# Below this acceptance rate a draft accepts "almost nothing": its kind's likely cause is named (SGLang #21272: an
# EAGLE-3 checkpoint served as EAGLE-1 gives acceptance length 1.0, slower than no speculation, with no warning).
NEARLY_NOTHING_ACCEPTED = 0.02


def _low_acceptance_cause(rule: MetricRule, m: Measurements, where: Selection) -> str:
    """ "; likely cause: ..." for a failed acceptance rule (Metric.of_proposals) on a draft that
    accepted almost nothing in the rule's scope and whose kind names a likely cause
    (DraftInfo.low_acceptance_cause); "" otherwise."""
    info = m.drafts.get(where.runner)
    if not METRICS[rule.metric].of_proposals or info is None or not info.low_acceptance_cause:
        return ""
    rate, _ = pooled(ACCEPTANCE_RATE.name, m, where)
    if math.isnan(rate) or rate >= NEARLY_NOTHING_ACCEPTED:
        return ""
    return f"; it accepted {rate:.1%} of its proposals: {info.low_acceptance_cause}"


def _estimands(
    rule: MetricRule, m: Measurements, baseline: Measurements | None, where: Selection, other: str
) -> tuple[Estimand | None, Estimand | None]:
    """The rule's value as an estimand (divided by its reference when relative) and the reference."""
    est = estimand(rule.metric, rule.aggregation, m, where)
    reference = None
    if rule.relative_to == "fallback":
        reference = estimand(rule.metric, rule.aggregation, m, where.of(FALLBACK))
    elif rule.relative_to == "baseline" and baseline is not None:
        reference = estimand(rule.metric, rule.aggregation, baseline, where.of(other))
    if est is not None and reference is not None:
        est = ratio(est, reference, paired=rule.relative_to == "fallback" or _same_cells(est, reference))
    return est, reference


@dataclass
class _Busy:
    """A timing rule's units with contended requests left out: `est`/`reference` on the clean
    requests, `kept` of the `total` units of `all` (the estimand on every request), the
    stalled share of the contended requests' wall time, and whether too many were left out."""

    est: Estimand | None
    reference: Estimand | None
    all: Estimand
    total: int
    kept: int
    share: float | None
    too_many: bool
    contended: int = 0  # requests left out as contended
    delayed: int = 0  # requests left out as client delayed (not contended)
    max_client_lag_ms: float | None = None
    whole: bool = False  # a window metric: total and kept count requests, est is every window's

    def describe(self, unit: str) -> str:
        if self.whole:
            unit = "requests"
        if self.delayed and not self.contended and self.max_client_lag_ms is not None:
            return describe_delayed(self.total - self.kept, self.total, unit, self.max_client_lag_ms)
        text = describe(self.share, self.total - self.kept, self.total, unit)
        if self.delayed and self.max_client_lag_ms is not None:
            text += (
                f" (of the requests left out, {self.delayed} client delayed: schedule or event-loop lag over "
                f"{self.max_client_lag_ms:g} ms)"
            )
        return text


def _fewer_threads(rule: MetricRule, m: Measurements, where: Selection) -> tuple[int, int, int, int] | None:
    """(requests, their fewest compute threads, the threads given, the runner's requests in
    `where`) for a timing rule whose
    requests in `where` ran on fewer compute threads than the process was given (the in-process
    runner fitted them to a busy machine: Environment.threads_given); None where none did."""
    given = m.environment.threads_given
    if not given or rule.metric not in TIMED:
        return None
    mine = [r.threads for r in m.requests if where.takes(r)]
    fewer = [t for t in mine if t is not None and t < given]
    return (len(fewer), min(fewer), given, len(mine)) if fewer else None


def _drifts_between_runs(rule: MetricRule, draft: str) -> bool:
    """Whether a comparison with the baseline report moves with the machine between the two runs:
    a timing metric of a draft that is not already a ratio to the fallback of its own run."""
    return (
        rule.relative_to == "baseline"
        and rule.metric in TIMED
        and rule.metric not in FALLBACK_RATIOS
        and draft != FALLBACK
    )


def _only_slower_fails(rule: MetricRule) -> bool:
    """An absolute rule that a slower machine can only push towards failing: a ceiling on a
    time or a floor on a rate (Metric.better; not a ratio: contention may slow either side of it)."""
    if rule.relative_to or rule.metric not in TIMED or rule.metric in FALLBACK_RATIOS:
        return False
    return rule.comparison in ((">=", ">") if METRICS[rule.metric].better == "higher" else ("<=", "<"))


def _units(est: Estimand | None) -> int:
    return est.units if est is not None and all(g for g in est.groups) else 0


def _without_busy(x: Measurements, s: Settings) -> tuple[Measurements, list[RequestRecord]]:
    """`x` without its contended and client-delayed requests (x itself when there are none), and those requests."""
    cpus = x.environment.cpu_count

    def out(r: RequestRecord) -> bool:
        return is_contended(r, s.max_cpu_stall, cpus) or is_client_delayed(r, s.max_client_lag_ms)

    busy = [r for r in x.requests if out(r)]
    return (replace(x, requests=[r for r in x.requests if not out(r)]) if busy else x), busy


def _contention(
    rule: MetricRule,
    m: Measurements,
    cleaned: tuple[Measurements, list[RequestRecord]],
    where: Selection,
    s: Settings,
    other: str,
    est: Estimand | None,
) -> _Busy | None:
    """The rule decided without contended or client-delayed requests (a paired unit goes when
    either side of it is); None when none of its requests was. `cleaned`: _without_busy(m, s)."""
    here, busy = cleaned
    base, busy_base = (
        _without_busy(s.baseline, s) if rule.relative_to == "baseline" and s.baseline is not None else (None, [])
    )
    runners = {where.runner} | ({FALLBACK} if compares_with_fallback(rule.metric, rule.relative_to) else set())
    mine = [r for r in busy if any(where.of(x).takes(r) for x in runners)]
    mine += [r for r in busy_base if where.of(other).takes(r)]
    total = _units(est)
    if not mine or est is None or total == 0:
        return None
    cpus = m.environment.cpu_count
    contended = [r for r in mine if is_contended(r, s.max_cpu_stall, cpus)]
    if rule.metric in WINDOW_ONLY:
        # Tokens or requests over a window's duration: a slowed request cannot be taken out of
        # it, so the windows are decided whole, and are inconclusive when too many of their
        # requests were slowed.
        every = [r for r in m.requests if any(where.of(x).takes(r) for x in runners)]
        if rule.relative_to == "baseline" and s.baseline is not None:
            every += [r for r in s.baseline.requests if where.of(other).takes(r)]
        n_req = len(every)
        _, reference = _estimands(rule, m, s.baseline, where, other)
        return _Busy(
            est,
            reference,
            est,
            n_req,
            n_req - len(mine),
            pooled_stall_share(contended, cpus),
            len(mine) / n_req > s.max_contended,
            len(contended),
            len(mine) - len(contended),
            s.max_client_lag_ms,
            whole=True,
        )
    est_clean, ref_clean = _estimands(rule, here, base if base is not None else s.baseline, where, other)
    kept = _units(est_clean)
    if kept == total:
        return None
    return _Busy(
        est_clean,
        ref_clean,
        est,
        total,
        kept,
        pooled_stall_share(contended, cpus),
        kept < MIN_UNITS or (total - kept) / total > s.max_contended,
        len(contended),
        len(mine) - len(contended),
        s.max_client_lag_ms,
    )


def _failures(rule: MetricRule, m: Measurements, draft: str, law: str) -> list[Failure]:
    runners = {draft, "*"} | ({FALLBACK} if compares_with_fallback(rule.metric, rule.relative_to) else set())
    stage = METRICS[rule.metric].failure_stage
    # Overlap is measured along the fallback's continuations: a failed fallback request
    # leaves a hole in it too.
    return [
        f
        for f in m.failures
        if f.law in (law, "*")
        and (
            (f.draft in runners and f.stage in (stage, FailureStage.RUN))
            or (f.draft == draft and f.stage == FailureStage.VERIFICATION and METRICS[rule.metric].ratio_to_fallback)
            or (stage == FailureStage.OVERLAP and f.stage == FailureStage.REQUEST and f.draft == FALLBACK)
        )
    ]


def _at_load(f: Failure, where: Selection) -> bool:
    """Whether a failure concerns the selection's load points (a failure at no load point, or a
    selection of every load point, always does)."""
    if f.concurrency is None and f.request_rate is None:
        return True
    return where.takes_load(f.concurrency, f.request_rate)


def _same_cells(a: Estimand, b: Estimand) -> bool:
    """Two runs over the same cells (prompt, length, repetition) can be paired cell by cell."""
    return len(a.groups) == len(b.groups) == 1 and set(a.groups[0][0].keys) == set(b.groups[0][0].keys)


def _improved(interval: Interval, comparison: str) -> bool:
    """A ratio to the baseline whose whole interval is more than 10% better than the baseline
    itself (1.0x), on the side the comparison calls good: above 1.1x for >=, below 1/1.1 for <=.
    Not against the threshold: a lax threshold (>= 0.8x) is cleared by a candidate worse than
    the baseline (0.956x), which is no improvement."""
    return interval.low > 1.1 if comparison in (">=", ">") else interval.high < 1 / 1.1


def _unit_word(est: Estimand, rule: MetricRule) -> str:
    u: UnitSet = est.groups[0][0]
    if compares_with_fallback(rule.metric, rule.relative_to):
        return f"paired {u.unit}s"
    if len(est.groups) > 1:
        return f"{u.unit}s per run"
    return f"{u.unit}s" + (" pooled" if rule.aggregation == "pooled" else "")


def _computed(
    rule: MetricRule,
    m: Measurements,
    where: Selection,
    s: Settings,
    base: dict[str, Any],
    what: str,
    bound: str,
    dim: Dimension,
    failed: list[Failure],
    other: str,
) -> Outcome:
    """Bills and process peaks: computed or measured once, decided on the value itself."""
    metric = METRICS[rule.metric]
    measured, n = value(rule.metric, rule.aggregation, m, where, rule.line)
    reference = None
    if rule.relative_to and not math.isnan(measured):
        ref_m, ref_runner = (m, FALLBACK) if rule.relative_to == "fallback" else (s.baseline, other)
        if ref_m is None:  # relative_to baseline without a baseline: decided before (no baseline report)
            measured = float("nan")
        else:
            reference, ref_n = value(rule.metric, rule.aggregation, ref_m, where.of(ref_runner), rule.line)
            measured = measured / reference if reference and not math.isnan(reference) else float("nan")
            n = min(n, ref_n)
    unmeasured = device_memory_unmeasured(rule.metric, m, where.runner) if not failed and n == 0 else None
    if unmeasured is not None and unmeasured[0]:  # no accelerator: nothing to measure, and nothing fails for it
        return Outcome(
            **base,
            status=Status.SKIPPED,
            measured=None,
            samples=0,
            fallback_value=None,
            message=f"{what}: {unmeasured[1]}; not evaluated",
        )
    if failed or n == 0 or math.isnan(measured):
        missing = unmeasured[1] if unmeasured is not None else _missing(rule, m, where, failed)
        return Outcome(
            **base,
            status=Status.ERROR,
            measured=None if math.isnan(measured) else measured,
            samples=n,
            fallback_value=reference,
            message=f"{what}: {missing} vs threshold {bound}",
        )
    shown = format_value(measured, dim) + ("x" if rule.relative_to else "")
    if rule.relative_to and reference is not None:
        reference_shown = format_value(reference, metric.dimension)
        shown += f" ({format_value(measured * reference, metric.dimension)} vs {rule.relative_to} {reference_shown})"
    status = (
        Status.PASS
        if _OPS[rule.comparison](measured, rule.threshold_value)
        else Status.WARN
        if rule.level == "warn"
        else Status.FAIL
    )
    note = ""
    if rule.relative_to == "baseline" and s.baseline_mismatch:
        status, note = Status.INCONCLUSIVE, f"; the baseline cannot be compared: {s.baseline_mismatch}"
    return Outcome(
        **base,
        status=status,
        measured=measured,
        samples=n,
        fallback_value=reference,
        message=f"{what}: measured {shown} (computed once, no sampling interval) vs threshold {bound}: {status}{note}",
    )


def _missing(rule: MetricRule, m: Measurements, where: Selection, failed: list[Failure]) -> str:
    """Why a rule has no value in a scope: the failed measurements, a draft that made no
    proposal (acceptance over zero proposals is undefined), or "measurement missing" with
    what the records tell about the absence."""
    if failed:
        return f"measurement missing ({describe_failures(failed)})"
    return (
        no_proposal(rule.metric, m, where)
        or _unreached(rule.metric, m, where)
        or f"measurement missing ({_no_sample(rule, m, where.runner)})"
    )


def _unreached(metric: str, m: Measurements, where: Selection) -> str | None:
    """ "position not reached: ..." when a per-position metric has no step to divide by at its
    position (no step proposed that far, or none committed every proposal before it: the
    rate there is undefined, and an earlier position's rule says why); None otherwise."""
    if metric not in POSITION_METRICS or where.position is None:
        return None
    reqs = [r for r in m.requests if where.takes(r) and r.counters is not None]
    if not reqs:
        return None
    _, den = position_parts(metric, where.position)
    if any(den(r) > 0 for r in reqs):
        return None
    why = f"no step of {len(reqs)} requests {position_denominator(metric, where.position)}"
    return f"position not reached: {why}, so the rate there is undefined (an earlier position's rule says why)"


def no_proposal(metric: str, m: Measurements, where: Selection) -> str | None:
    """ "no proposal: ..." when an acceptance metric has nothing to measure because the draft
    made no proposal in the selection: its requests produced tokens, and every count that
    says how many tokens it proposed (gate's per-step counters, a server's per-response
    draft count, the server's spec-decode counter deltas over the measured windows) is 0.
    None otherwise (another metric, no request, or no count recorded: a true absence)."""
    if metric not in METRICS or not METRICS[metric].of_proposals or where.runner == FALLBACK:
        return None
    reqs = [r for r in m.requests if where.takes(r) and r.output_tokens > 0]
    if not reqs:
        return None
    counts = [sum(r.step_proposed) if r.step_proposed else r.server_draft_tokens for r in reqs]
    counts = [c for c in counts if c is not None]
    if where.whole_windows:
        # an engine counts proposed tokens or verification steps with a proposal (SGLang only the steps): either moving
        # means it proposed
        counts += [
            w.counters.num_draft_tokens + w.counters.num_drafts
            for w in m.runs
            if where.takes_window(w) and w.counters is not None
        ]
    if not counts or any(counts):
        return None
    info = m.drafts.get(where.runner)
    lookup = info is not None and info.kind == "prompt_lookup"
    if not any(r.concurrency is not None or r.request_rate is not None for r in reqs):  # gate's own loop
        return f"no proposal: draft {where.runner} made no proposal (0 draft tokens over {len(reqs)} requests: " + (
            "prompt lookup found no n-gram to copy)" if lookup else "it proposed nothing)"
        )
    return (
        f"no proposal: the server made no draft proposal at {_points_text(reqs)} (0 draft tokens over {len(reqs)} "
        "requests: speculation off" + (", or prompt lookup found no n-gram to copy)" if lookup else ")")
    )


def _points_text(reqs: list[RequestRecord]) -> str:
    """The load points of served requests: 'concurrency 1, 2 and request rate 4/s'."""
    conc = sorted({r.concurrency for r in reqs if r.concurrency is not None})
    rates = sorted({r.request_rate for r in reqs if r.concurrency is None and r.request_rate is not None})
    parts = ([f"concurrency {', '.join(f'{v:g}' for v in conc)}"] if conc else []) + (
        [f"request rate {', '.join(f'{v:g}' for v in rates)}/s"] if rates else []
    )
    return " and ".join(parts)


def _no_sample(rule: MetricRule, m: Measurements, draft: str) -> str:
    """Why a scope has no sample, as precisely as the records tell."""
    bills = [b for b in m.bills if b.draft == draft]
    metric = METRICS[rule.metric]
    if metric.needs == "resources.capacity" and bills and all(b.budget is None for b in bills):
        return "no budget: set resources.capacity in the policy"
    if metric.takes_line and bills:
        return f"the bill has no line {rule.line!r}; its lines: {', '.join(x.name for x in bills[0].lines)}"
    return "no sample was measured for this scope"
