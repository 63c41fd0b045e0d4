"""Rule evaluation: one outcome per rule, draft and law in scope. Never runs a model.

Statuses: pass; fail (an error-level rule violated); warn (a warn-level rule violated);
error (its measurement failed or produced no sample: neither a pass nor a failure);
skipped (level off). Messages read "measured X (aggregation) vs threshold Y".
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Iterable

from gate.metrics import METRICS
from gate.records import FALLBACK, Measurements
from gate.rules.samples import Selection, value
from gate.units import Dimension, format_value

_STAGE = {"overlap": "overlap", "top1_agreement": "overlap", "memory_bill_bytes": "bill", "memory_line_bytes": "bill",
          "memory_headroom_bytes": "bill", "extra_sequences": "bill", "process_peak_rss_bytes": "run"}
_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


@dataclass
class Outcome:
    """The verdict of one rule for one scope (draft / law [/ categories])."""

    rule_id: str
    scope: str  # "draft/law" or "draft/law/cat1,cat2"
    draft: str
    law: str
    metric: str
    aggregation: str
    comparison: str
    threshold: float  # base units (bytes, ms, tokens/s, tokens, 1)
    relative_to: str | None
    level: str
    status: str
    measured: float | None
    samples: int
    fallback_value: float | None
    message: str
    details: list[dict[str, Any]] = field(default_factory=list)  # e.g. exactness tests, divergences

    @property
    def name(self) -> str:
        return f"{self.rule_id}[{self.scope}]"


def evaluate(rules: Iterable[Any], m: Measurements) -> list[Outcome]:
    """Outcomes for every rule (gate.policy.model.RuleSpec) over the drafts and laws in its scope."""
    from gate.rules.exactness import evaluate_exactness

    out: list[Outcome] = []
    for rule in rules:
        drafts = rule.scope.drafts or list(m.drafts)
        laws = rule.scope.laws or m.laws
        if getattr(rule, "kind", "metric") == "exactness":
            out += evaluate_exactness(rule, m, drafts, laws)
            continue
        cats = tuple(rule.scope.categories) if rule.scope.categories else None
        for draft in drafts:
            for law in laws:
                out.append(_one(rule, m, draft, law, cats))
    return out


def _one(rule: Any, m: Measurements, draft: str, law: str, cats: tuple[str, ...] | None) -> Outcome:
    metric = METRICS[rule.metric]
    scope = f"{draft}/{law}" + (f"/{','.join(cats)}" if cats else "")
    threshold = rule.threshold_value
    base = dict(rule_id=rule.id, scope=scope, draft=draft, law=law, metric=rule.metric, aggregation=rule.aggregation,
                comparison=rule.comparison, threshold=threshold, relative_to=rule.relative_to, level=rule.level)
    dim = Dimension.RATIO if rule.relative_to else metric.dimension
    bound = f"{rule.comparison} {format_value(threshold, dim)}" + ("x" if rule.relative_to else "")
    what = f"{rule.metric}" + (f" '{rule.line}'" if rule.line else "") + f" ({rule.aggregation}" + (
        ", relative to fallback)" if rule.relative_to else ")")
    if rule.level == "off":
        return Outcome(**base, status="skipped", measured=None, samples=0, fallback_value=None,
                       message=f"{what}: level off, not evaluated")
    runners = {draft, "*"} | ({FALLBACK} if rule.relative_to else set())
    stage = _STAGE.get(rule.metric, "request")
    # Overlap is measured along the fallback's continuations: a failed fallback request
    # leaves a hole in it too.
    failed = [f for f in m.failures if f.law in (law, "*") and (
        (f.draft in runners and f.stage in (stage, "run"))
        or (stage == "overlap" and f.stage == "request" and f.draft == FALLBACK))]
    sel = Selection(draft, law, cats)
    measured, n = value(rule.metric, rule.aggregation, m, sel, rule.line)
    fallback = None
    if rule.relative_to and not math.isnan(measured):
        fb, fb_n = value(rule.metric, rule.aggregation, m, Selection(FALLBACK, law, cats), rule.line)
        fallback = fb
        measured = measured / fb if fb and not math.isnan(fb) else float("nan")
        n = min(n, fb_n)
    if failed or n == 0 or math.isnan(measured):
        why = "; ".join(f"{f.what}: {f.message}" for f in failed[:3]) or _no_sample(rule, m, draft)
        return Outcome(**base, status="error", measured=None if math.isnan(measured) else measured, samples=n,
                       fallback_value=fallback, message=f"{what}: measurement missing ({why}) vs threshold {bound}")
    shown = format_value(measured, dim) + ("x" if rule.relative_to else "")
    if rule.relative_to:
        shown += f" ({format_value(measured * fallback, metric.dimension)} vs fallback {format_value(fallback, metric.dimension)})"
    ok = _OPS[rule.comparison](measured, threshold)
    status = "pass" if ok else ("warn" if rule.level == "warn" else "fail")
    unit = "requests" if rule.aggregation == "pooled" else "samples"
    message = f"{what}: measured {shown} over {n} {unit} vs threshold {bound}: {status}"
    return Outcome(**base, status=status, measured=measured, samples=n, fallback_value=fallback, message=message)


def _no_sample(rule: Any, m: Measurements, draft: str) -> str:
    """Why a scope has no sample, as precisely as the records tell."""
    bills = [b for b in m.bills if b.draft == draft]
    if rule.metric in ("memory_headroom_bytes", "extra_sequences") and bills and all(b.budget is None for b in bills):
        return "no budget: set resources.capacity in the policy"
    if rule.metric == "memory_line_bytes" and bills:
        return f"the bill has no line {rule.line!r}; its lines: {', '.join(x.name for x in bills[0].lines)}"
    return "no sample was measured for this scope"


def exit_code(outcomes: list[Outcome], m: Measurements, fail_on_warn: bool = False) -> int:
    """1 when an error-level rule failed (or a warn one with fail_on_warn), else 3 when a
    rule's measurement is missing, an error-level exactness verdict is inconclusive (too
    few samples for the required power) or any measurement failed, else 0. A definite
    failure outranks a missing measurement."""
    if any(o.status == "fail" or (fail_on_warn and o.status == "warn") for o in outcomes):
        return 1
    if m.failures or any(o.status == "error" or (o.status == "inconclusive" and o.level == "error") for o in outcomes):
        return 3
    return 0
