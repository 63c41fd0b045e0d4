"""Rule kind 'best_num_draft_tokens': a metric rule that a draft must meet with some K of its
num_draft_tokens_sweep ("the draft pays at the planned load with its best K").

The rule reads like a metric rule (metric, aggregation, comparison, threshold, relative_to,
scope, per) and is decided by the metric kind (gate.rules.kinds.metric) on the runner of each
swept K (K > 0: the declared draft and its '<draft>.k<K>' runners), each at the confidence
level 1 - (1 - level) / m for the m Ks tried: a Bonferroni correction (Dunn 1961), so that
"some K meets it" is claimed at the rule's own level although the K was chosen after seeing
every K. It passes where some K passes, fails (warns at level warn) where every K fails, is an
error where no K passes and a K's measurement is missing, and inconclusive otherwise. The
message names the K that passes (the one with the best measured value among those that
pass); the report's K schedule (gate.analysis.schedule: the best stable K by median speedup)
need not choose the same.
"""

from __future__ import annotations

from typing import Any

from gate.metrics.catalogue import ACCEPTANCE_RATE
from gate.records import Measurements
from gate.rules.kinds import metric
from gate.rules.kinds.interface import RuleKind, Settings
from gate.rules.outcome import Outcome
from gate.rules.selection import Selection, swept_runners
from gate.rules.status import Status


class BestNumDraftTokensRules(RuleKind):
    """A best_num_draft_tokens rule takes a metric rule's keys; its scope names swept drafts."""

    name = "best_num_draft_tokens"
    keys = metric.KIND.keys
    reads_metric = True

    def spec_problem(self, rule: Any) -> tuple[str, str] | None:
        return metric.KIND.spec_problem(rule)

    def policy_problem(self, rule: Any, policy: Any) -> tuple[str, str] | None:
        drafts = rule.scope.drafts or policy.declared_drafts  # an unknown name is reported at the scope already
        if not any(d not in policy.drafts or policy.drafts[d].num_draft_tokens_sweep for d in drafts):
            return "kind", (
                "a best_num_draft_tokens rule needs a draft with num_draft_tokens_sweep in its scope (the Ks "
                f"it chooses among); {', '.join(drafts) or 'no draft'} sweeps none"
            )
        return None

    def evaluate(
        self, rule: Any, m: Measurements, drafts: list[str], laws: list[str], settings: Settings
    ) -> list[Outcome]:
        level = rule.confidence or settings.confidence
        sweeps = swept_runners(m)
        out: list[Outcome] = []
        for draft in drafts:
            declared = m.drafts.get(draft)
            swept = {
                k: r for k, r in sweeps.get(draft, {declared.num_draft_tokens if declared else 0: draft}).items() if k
            }
            for law in laws:
                # a K whose runner never proposed ran no speculation: it is no candidate (and not counted by Bonferroni)
                silent = {
                    k: why
                    for k, r in swept.items()
                    if (why := metric.no_proposal(ACCEPTANCE_RATE.name, m, Selection(r, law, None)))
                }
                ks = {k: r for k, r in swept.items() if k not in silent}
                if not ks:
                    out.append(
                        Outcome(
                            rule_id=rule.id,
                            scope=f"{draft}/{law}",
                            draft=draft,
                            law=law,
                            metric=rule.metric,
                            aggregation=rule.aggregation,
                            comparison=rule.comparison,
                            threshold=rule.threshold_value,
                            relative_to=rule.relative_to,
                            level=rule.level,
                            status=Status.SKIPPED if rule.level == "off" else Status.ERROR,
                            measured=None,
                            samples=0,
                            fallback_value=None,
                            message="no K made a proposal, so none ran "
                            "speculation: " + "; ".join(f"K={k}: {why}" for k, why in silent.items()),
                        )
                    )
                    continue
                adjusted = 1 - (1 - level) / len(ks)
                as_metric = rule.model_copy(update={"kind": "metric", "confidence": adjusted})
                by_k = {k: metric.KIND.evaluate(as_metric, m, [runner], [law], settings) for k, runner in ks.items()}
                cells = len(next(iter(by_k.values()), []))
                for i in range(cells):
                    o = _combine(
                        rule, draft, law, {k: outs[i] for k, outs in by_k.items() if i < len(outs)}, ks, level, adjusted
                    )
                    if silent:
                        o.message += "; not candidates, their runner made no proposal: " + "; ".join(
                            f"K={k}: {why}" for k, why in silent.items()
                        )
                    out.append(o)
        return out


KIND = BestNumDraftTokensRules()


def _combine(
    rule: Any, draft: str, law: str, by_k: dict[int, Outcome], ks: dict[int, str], level: float, adjusted: float
) -> Outcome:
    """One cell's outcome from every K's metric outcome there."""
    first = next(iter(by_k.values()))
    runner = ks[next(iter(by_k))]
    scope = draft + first.scope[len(runner) :] if first.scope.startswith(runner) else first.scope
    correction = (
        f"{len(by_k)} Ks ({', '.join(f'K={k}' for k in by_k)}), each at {adjusted:.2%} confidence "
        f"(Bonferroni for {level:.0%} over the Ks)"
    )
    passing = [k for k, o in by_k.items() if o.status == Status.PASS]
    failing = [k for k, o in by_k.items() if o.status in (Status.FAIL, Status.WARN)]
    floor = rule.comparison in (">=", ">")
    best = max(passing, key=lambda k: (by_k[k].measured or 0) * (1 if floor else -1)) if passing else None
    if rule.level == "off":
        status, why = Status.SKIPPED, "level off, not evaluated"
    elif all(o.status == Status.SKIPPED for o in by_k.values()):
        status, why = Status.SKIPPED, first.message  # e.g. per: concurrency at a request-rate point: does not apply
    elif best is not None:
        status, why = Status.PASS, f"K={best} meets it: {by_k[best].message}"
    elif len(failing) == len(by_k):
        status = Status.WARN if rule.level == "warn" else Status.FAIL
        why = "no K meets it: " + "; ".join(f"K={k}: {o.message}" for k, o in by_k.items())
    elif any(o.status == Status.ERROR for o in by_k.values()):
        status = Status.ERROR
        why = "no K meets it and a K's measurement is missing: " + "; ".join(
            f"K={k}: {o.message}" for k, o in by_k.items() if o.status != Status.PASS
        )
    else:
        status = Status.INCONCLUSIVE
        why = "no K meets it, and not every K fails: " + "; ".join(f"K={k}: {o.message}" for k, o in by_k.items())
    chosen = by_k[best] if best is not None else None
    return Outcome(
        rule_id=rule.id,
        scope=scope,
        draft=draft,
        law=law,
        metric=rule.metric,
        aggregation=rule.aggregation,
        comparison=rule.comparison,
        threshold=rule.threshold_value,
        relative_to=rule.relative_to,
        level=rule.level,
        status=status,
        measured=chosen.measured if chosen else None,
        samples=chosen.samples if chosen else first.samples,
        fallback_value=chosen.fallback_value if chosen else None,
        message=f"with its best num_draft_tokens over {correction}: {why}",
        interval=chosen.interval if chosen else None,
    )
