"""Rule kind 'envelope': a runner's SLO load (load.search, gate.load.search) against a floor:
an absolute load ("the draft sustains concurrency 8 within the SLOs") or, relative_to
fallback, the fallback's SLO load ("the draft sustains at least the fallback's load").

The search gives an interval, not a point: every SLO held at `lower`, something failed at
`upper` (EnvelopeRecord.bounds: the least and the greatest load the search allows). The verdict
is decided on the whole interval: pass when its least value meets the floor, fail when even
its greatest does not, inconclusive in between (the interval straddles the floor: a finer or
repeated search decides). Relative to the fallback, the ratio's interval is
[least(draft) / greatest(fallback), greatest(draft) / least(fallback)].
"""

from __future__ import annotations

import math
from typing import Any

from gate.core.units import Dimension, parse_quantity
from gate.records import FALLBACK, EnvelopeRecord, Measurements
from gate.rules.kinds.interface import RuleKind, Settings, shown_threshold
from gate.rules.outcome import Outcome
from gate.rules.status import Status


class EnvelopeRules(RuleKind):
    """An envelope rule takes comparison (>= or >), threshold (a load in the search's units, or
    a ratio with relative_to: fallback) and a scope of drafts and laws."""

    name = "envelope"
    keys = ("kind", "comparison", "threshold", "relative_to", "scope", "level")

    def spec_problem(self, rule: Any) -> tuple[str, str] | None:
        for key in ("metric", "line", "position"):
            if getattr(rule, key) is not None:
                return key, f"an envelope rule takes no {key}: it decides the SLO load that load.search finds"
        for key in ("aggregation", "confidence"):
            if key in rule.model_fields_set:
                return key, (
                    f"an envelope rule takes no {key}: it decides on the interval the search found, "
                    "[lower, upper), never on an aggregate of samples"
                )
        if rule.comparison is None or rule.threshold is None:
            return ("comparison" if rule.comparison is None else "threshold"), (
                "required key is missing (an envelope rule needs comparison and threshold: the least SLO load)"
            )
        if rule.comparison not in (">=", ">"):
            return "comparison", "an envelope rule sets a floor on the SLO load: comparison >= or >"
        if rule.relative_to == "baseline":
            return "relative_to", "an envelope rule compares with the fallback (relative_to: fallback) or a load"
        if (
            rule.scope.categories
            or rule.scope.constraints
            or rule.scope.concurrency
            or rule.scope.request_rate
            or rule.per
        ):
            return ("per" if rule.per else "scope"), (
                "an envelope rule covers the whole workload at every load the "
                "search probes; scope it by drafts and laws"
            )
        return None

    def policy_problem(self, rule: Any, policy: Any) -> tuple[str, str] | None:
        if policy.load is None or policy.load.search is None:
            return "kind", "an envelope rule needs load.search (the search for each runner's SLO load)"
        for j, name in enumerate(rule.scope.drafts or []):
            if name in policy.sweep:
                return f"scope.drafts[{j}]", (
                    f"{name} is a num_draft_tokens_sweep runner: the envelope search runs for "
                    f"the declared drafts only (scope {policy.sweep[name][0]!r})"
                )
        search = policy.load.search
        q = parse_quantity(rule.threshold)
        shown = shown_threshold(rule.threshold)
        percent = isinstance(rule.threshold, str) and rule.threshold.strip().endswith("%")
        if rule.relative_to == "fallback":
            if percent or q.dimension not in (None, Dimension.RATIO):
                return (
                    "threshold",
                    f"threshold {shown}: relative to the fallback it is a ratio of SLO loads, bare or '1.1x'",
                )
            return None
        allowed = (None,) if search.over == "concurrency" else (None, Dimension.REQUEST_RATE)
        if percent or q.dimension not in allowed:
            unit = (
                "a bare number of requests in flight"
                if search.over == "concurrency"
                else "requests/s (or a bare number)"
            )
            return "threshold", f"threshold {shown}: the SLO load of a {search.over.replace('_', ' ')} search is {unit}"
        if q.value > search.max:
            return "threshold", (
                f"threshold {shown} is above load.search.max ({search.max:g}): the search never probes "
                "that far, so the rule could never pass"
            )
        return None

    def evaluate(
        self, rule: Any, m: Measurements, drafts: list[str], laws: list[str], settings: Settings
    ) -> list[Outcome]:
        found = {(e.runner, e.law): e for e in m.envelopes}
        return [_one(rule, found.get((d, law)), found.get((FALLBACK, law)), d, law) for d in drafts for law in laws]


def _one(rule: Any, mine: EnvelopeRecord | None, fallback: EnvelopeRecord | None, draft: str, law: str) -> Outcome:
    threshold = rule.threshold_value
    relative = rule.relative_to == "fallback"
    base = dict(
        rule_id=rule.id,
        scope=f"{draft}/{law}",
        draft=draft,
        law=law,
        metric=KIND.name,  # the outcome of an envelope rule names its kind: it decides no catalogue metric
        aggregation="interval",
        comparison=rule.comparison,
        threshold=threshold,
        relative_to=rule.relative_to,
        level=rule.level,
    )
    bound = f"{rule.comparison} {threshold:g}" + ("x the fallback's" if relative else "")
    if rule.level == "off":
        return Outcome(
            **base,
            status=Status.SKIPPED,
            measured=None,
            samples=0,
            fallback_value=None,
            message="envelope: level off, not evaluated",
        )
    missing = [who for who, e in ((draft, mine), *([(FALLBACK, fallback)] if relative else [])) if e is None]
    if missing:
        return Outcome(
            **base,
            status=Status.ERROR,
            measured=None,
            samples=0,
            fallback_value=None,
            message=f"envelope: no search of {', '.join(dict.fromkeys(missing))} under {law} was recorded "
            "(not measured)",
        )
    assert mine is not None
    details = [_details(mine)] + ([_details(fallback)] if relative and fallback is not None else [])
    searches = [mine, fallback] if relative and fallback is not None else [mine]
    # a search whose requests failed or that a signal stopped is a measurement that failed: an error, never a verdict
    failed = [e for e in searches if e.stop in ("failed", "interrupted")]
    if failed:
        e = failed[0]
        return Outcome(
            **base,
            status=Status.ERROR,
            measured=None,
            samples=0,
            fallback_value=None,
            details=details,
            message=f"envelope: the search of {e.runner} {'failed' if e.stop == 'failed' else 'was interrupted'} "
            f"at {e.over.replace('_', ' ')} {e.probes[-1].load:g} ({_last_why(e)}); SLO load so far {e.shown()}",
        )
    broken = [e for e in searches if e.lower is None and (e.stop == "inconclusive" or e.upper is None)]
    if broken:  # nothing held and nothing failed: nothing known
        e = broken[0]
        return Outcome(
            **base,
            status=Status.ERROR,
            measured=None,
            samples=0,
            fallback_value=None,
            details=details,
            message=f"envelope: the search of {e.runner} decided nothing ({e.stop}: {_last_why(e)})",
        )
    least, greatest = mine.bounds()
    fb_value = None
    if relative:
        assert fallback is not None
        f_least, f_greatest = fallback.bounds()
        fb_value = fallback.lower
        if f_greatest == 0:  # the fallback met the SLOs at no load probed: no ratio to take
            return Outcome(
                **base,
                status=Status.INCONCLUSIVE,
                measured=None,
                samples=sum(p.requests for p in mine.probes),
                fallback_value=None,
                details=details,
                message=f"envelope: the fallback met the SLOs at no load probed ({fallback.shown()}: "
                f"{_last_why(fallback)}), so there is no ratio to take; {draft}'s SLO load {mine.shown()} "
                "(lower load.search.start, or SLOs the fallback meets)",
            )
        least, greatest = (least / f_greatest, greatest / f_least if f_least > 0 else math.inf)

    def meets(v: float) -> bool:
        return bool(v >= threshold) if rule.comparison == ">=" else bool(v > threshold)

    if meets(least):
        status = Status.PASS
    elif not meets(greatest):
        status = Status.FAIL if rule.level == "error" else Status.WARN
    else:
        status = Status.INCONCLUSIVE
    shown = f"[{least:.3g}, {greatest:.3g}]" + ("x" if relative else "")
    what = (
        f"SLO load {mine.shown()} against the fallback's {fallback.shown()}: ratio in {shown}"
        if relative and fallback
        else f"SLO load {mine.shown()}: in {shown}"
    )
    at_max = [e.runner for e in searches if e.stop == "max"]
    straddles = (
        f"the interval straddles the floor: {' and '.join(at_max)} held every SLO up to load.search.max (raise it)"
        if at_max
        else "the interval straddles the floor (a finer search, load.search.tolerance, or more repetitions decide)"
    )
    tail = {Status.PASS: "met on the whole interval", Status.INCONCLUSIVE: straddles}.get(
        status, "missed on the whole interval"
    )
    early = mine.stop in ("budget", "inconclusive")
    stopped = f"; the search stopped: {mine.stop}" + (f" ({_last_why(mine)})" if early else "")
    return Outcome(
        **base,
        status=status,
        measured=least if math.isfinite(least) else None,
        samples=sum(p.requests for p in mine.probes),
        fallback_value=fb_value,
        details=details,
        message=f"envelope: {what} vs {bound}: {tail}{stopped}",
    )


def _last_why(e: EnvelopeRecord) -> str:
    return e.probes[-1].why if e.probes else "no probe ran"


def _details(e: EnvelopeRecord) -> dict[str, Any]:
    """The search of one runner as `gate explain` lists it: its interval, why it stopped, its probes."""
    return {
        "name": e.runner,
        "kind": e.over,
        "lower": e.lower,
        "upper": e.upper,
        "verdict": e.stop,
        "n": len(e.probes),
        "probes": ", ".join(f"{p.load:g} {p.verdict}" for p in e.probes),
    }


KIND = EnvelopeRules()
