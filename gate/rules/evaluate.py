"""Rule evaluation: one outcome per rule, draft and law in scope, each rule decided by its
kind (gate.rules.kinds); waivers and what an inconclusive verdict counts as apply to every
kind alike. Never runs a model.

waived: a live waiver in the policy covers an outcome (the status it would have had is
kept); an expired one only adds a note.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gate.records import DID_NOT_SPECULATE, FALLBACK, Measurements, SpeculationStatus
from gate.rules.kinds import registry as rule_kinds
from gate.rules.kinds.interface import Settings
from gate.rules.outcome import Outcome
from gate.rules.scope import declared_load_points, inapplicable_points, not_applicable_reason, parse_scope
from gate.rules.selection import Selection
from gate.rules.status import Status

if TYPE_CHECKING:
    from gate.policy.model import Policy, RuleSpec

# Settings and the load-point helpers of gate.rules.scope are re-exported for gate.plan.validate and the tests.
__all__ = [
    "Settings",
    "declared_load_points",
    "evaluate",
    "exit_code",
    "inapplicable_points",
    "not_applicable_reason",
    "settings_for",
]


def settings_for(
    policy: Policy,
    baseline: Measurements | None = None,
    baseline_mismatch: str | None = None,
    waivers: bool = True,
    today: dt.date | None = None,
) -> Settings:
    """Settings from a validated policy (waivers=False: --no-waivers)."""
    ms = policy.measurement
    points = declared_load_points(policy)
    return Settings(
        ms.confidence,
        ms.bootstrap_resamples,
        policy.workload.seed,
        ms.inconclusive,
        baseline,
        dict(policy.baseline.drafts) if policy.baseline else {},
        baseline_mismatch,
        list(policy.waivers) if waivers else [],
        today or dt.date.today(),
        ms.max_cpu_stall,
        ms.max_contended,
        ms.max_client_lag_ms,
        points,
    )


def evaluate(rules: Iterable[RuleSpec], m: Measurements, settings: Settings | None = None) -> list[Outcome]:
    """Outcomes for every rule (gate.policy.model.RuleSpec) over the drafts and laws in its scope."""
    s = settings or Settings()
    out: list[Outcome] = []
    for rule in rules:
        drafts = rule.scope.drafts or [
            n for n, d in m.drafts.items() if getattr(d, "sweep_of", None) is None
        ]  # a sweep's runners: by name
        laws = rule.scope.laws or m.laws
        out += rule_kinds.get(rule.kind).evaluate(rule, m, drafts, laws, s)
    for o in out:
        _apply_speculation(o, m)
        o.inconclusive_as = s.inconclusive if o.level == "error" else "warn"
        _apply_waivers(o, s)
    return out


def _apply_speculation(o: Outcome, m: Measurements) -> None:
    """An outcome of a draft runner at a cell where its speculation did not run as declared
    (m.speculation: off, barely, or off for some requests; gate.measure.speculation) is an
    error naming the cause, whatever it measured: a speedup or an exactness verdict on a
    draft that did not speculate says nothing about the draft. Where the draft had nothing to
    propose, a decided outcome keeps its status and says so."""
    if o.status == Status.SKIPPED or o.draft in ("*", FALLBACK) or not m.speculation:
        return
    where = parse_scope(o.scope) if "/" in o.scope else Selection(o.draft, o.law, None)
    cells = [
        rec
        for rec in m.speculation
        if rec.runner == o.draft
        and (o.law not in m.laws or rec.law == o.law)
        and where.takes_load(rec.concurrency, rec.request_rate)
    ]
    off = [rec for rec in cells if rec.status in DID_NOT_SPECULATE]
    if off:
        o.message = (
            f"{'; '.join(rec.describe() for rec in off[:3])}: no verdict rests on a draft runner that did not "
            f"speculate (the endpoint may serve without speculation, or the engine turned it off); measured "
            f"otherwise: {o.message}"
        )
        o.status = Status.ERROR
        return
    idle = [rec for rec in cells if rec.status == SpeculationStatus.NOTHING_TO_PROPOSE]
    if idle and o.status != Status.ERROR:
        o.message += "; " + "; ".join(rec.describe() for rec in idle[:3])


def _apply_waivers(o: Outcome, s: Settings) -> None:
    """A live waiver turns a non-passing outcome into "waived"; an expired one only adds a note (fails closed)."""
    for w in s.waivers:
        if (
            w.rule != o.rule_id
            or not fnmatch.fnmatchcase(o.scope, w.scope)
            or o.status in (Status.PASS, Status.SKIPPED)
        ):
            continue
        if w.expires >= s.today:
            o.waived_status, o.status = o.status, Status.WAIVED
            o.waiver = f"waived by {w.owner} until {w.expires.isoformat()}: {w.reason}"
            o.message = f"{o.waiver} (status {o.waived_status}: {o.message})"
        else:
            o.waiver = f"waiver by {w.owner} expired on {w.expires.isoformat()}: not applied"
            o.message += f" ({o.waiver})"
        return


def exit_code(
    outcomes: list[Outcome], m: Measurements, fail_on_warn: bool = False, fail_on_inconclusive: bool = False
) -> int:
    """0 pass; 1 an error-level rule failed (or a warn-level one with fail_on_warn, or an
    inconclusive one with measurement.inconclusive: fail or fail_on_inconclusive); 3 a rule's
    measurement is missing, any measurement failed, or an error-level verdict is
    inconclusive with measurement.inconclusive: error (the default). A definite failure
    outranks a missing measurement. Waived and skipped outcomes never change it."""
    inconclusive = [o for o in outcomes if o.status == Status.INCONCLUSIVE]
    if any(o.status == Status.FAIL or (fail_on_warn and o.status == Status.WARN) for o in outcomes) or any(
        o.inconclusive_as == "fail" or fail_on_inconclusive for o in inconclusive
    ):
        return 1
    if (
        m.failures
        or any(o.status == Status.ERROR for o in outcomes)
        or any(o.inconclusive_as == "error" for o in inconclusive)
    ):
        return 3
    return 0
