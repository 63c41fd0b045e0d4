"""Is the plan big enough for the confidence the policy asks? Checked before running
(`gate validate`, `gate check`), from the number of planned cells alone.

- A percentile rule against an absolute threshold can pass only when even zero samples
  beyond it bound the share below the allowed one: n >= log(alpha/2) / log(1 - allowed)
  (gate.rules.confidence.min_samples_to_pass); 367 samples for p99 at 95%.
- A bootstrap interval needs at least 5 resampling units (gate.rules.confidence.MIN_UNITS)
  and is unreliable with fewer than 10 (it undercovers: Efron & Tibshirani 1993, An Introduction to the Bootstrap, ch.
  14).
- A comparison of runners at load points needs 2 repetitions for the drift between their
  windows to be measured (gate.rules.confidence.between_windows).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from gate.metrics.catalogue import METRICS, PER_REQUEST, PER_TOKEN, RESAMPLED, compares_with_fallback
from gate.rules.confidence import MIN_UNITS, QUANTILES, min_samples_to_pass
from gate.rules.kinds import registry as rule_kinds
from gate.rules.samples import WINDOW_ONLY
from gate.rules.scope import declared_load_points

if TYPE_CHECKING:
    from gate.policy.model import Policy

# PER_REQUEST: metrics with one sample per request; PER_TOKEN: one per token or step (at most
# max_new_tokens per request); both derived from the declarations in gate.metrics.catalogue.
RELIABLE_UNITS = 10


class Shortfall(NamedTuple):
    """A warning about a rule's planned size: where (YAML path), what, and whether the rule can
    never pass on the plan (`undecidable`: no interval formed, a percentile that even zero
    exceedances cannot bound, too few windows) rather than decide on an unreliable interval."""

    path: str
    message: str
    undecidable: bool
    rule: int  # the rule's index in policy.rules


def underpowered(policy: Policy, categories: list[str], budget_scale: float | None = None) -> list[Shortfall]:
    """A Shortfall for every metric rule the planned run cannot decide with the requested
    confidence. `categories`: the category of every prompt the workload selects.
    Counts the cells of the rule's own scope (its categories; one value of `per`), at
    measurement.repetitions (the fixed plan). `budget_scale`: a sequential run's most units
    per runner and law over the fixed plan's (its budget's last look, gate.plan.rounds; None:
    a fixed plan). A percentile rule that the fixed plan cannot pass but the budget can is
    warned of, not called undecidable: its cell stays undecided, so the looks measure it further."""
    w, ms = policy.workload, policy.measurement
    lengths = len(w.context_lengths or []) or 1
    labels = w.constraint_labels  # each prompt runs under every workload.constraints entry
    out: list[Shortfall] = []
    for i, rule in enumerate(policy.rules):
        if not rule_kinds.reads_metric(rule) or rule.level == "off" or rule.metric not in METRICS:
            continue
        scoped = [c for c in categories if not rule.scope.categories or c in rule.scope.categories]
        if rule.per == "category":
            prompts = min((scoped.count(c) for c in set(scoped)), default=0)
        else:
            prompts = len(scoped)
        if labels and rule.per != "constraint":
            prompts *= len([c for c in labels if not rule.scope.constraints or c in rule.scope.constraints])
        cells = (
            prompts
            * (1 if rule.per == "context_length" else lengths)
            * ms.repetitions
            * (1 if rule.per == "max_new_tokens" else len(w.max_new_tokens_list))
        )
        if METRICS[rule.metric].sampling == "position":  # one continuation per prompt, measured once
            cells = prompts * (1 if rule.per == "context_length" else lengths)
        where = (
            f" in its {'smallest category' if rule.per == 'category' else 'scope'}"
            if rule.per or rule.scope.categories
            else ""
        )
        level = rule.confidence or ms.confidence
        if rule.aggregation in QUANTILES and not rule.relative_to and rule.metric in PER_REQUEST | PER_TOKEN:
            need = min_samples_to_pass(QUANTILES[rule.aggregation], level, rule.comparison in ("<=", "<"))
            most = cells * (max(w.max_new_tokens_list) if rule.metric in PER_TOKEN else 1)
            if most < need:
                what = "tokens" if rule.metric in PER_TOKEN else "requests"
                needs = (
                    f"{level:.0%} confidence: even with no sample beyond the threshold it needs at least {need} "
                    f"samples, and the fixed plan has at most {most} {what} per draft and law{where}"
                )
                # only an error-level verdict extends a run (a warn-level one is decided on what was measured)
                budget = int(most * budget_scale) if budget_scale and rule.level == "error" else None
                if budget is not None and budget >= need:
                    message = (
                        f"{rule.aggregation} of {rule.metric} cannot pass on the fixed plan at {needs}: its cell "
                        f"stays undecided, so the sequential looks measure it further, up to {budget} {what} at "
                        "the budget's last look (each look decides at a stricter level, which needs more)"
                    )
                else:
                    message = (
                        f"{rule.aggregation} of {rule.metric} can never pass at {needs}"
                        + (f", {budget} at the budget's last look" if budget is not None else "")
                        + " (add prompts or measurement.repetitions"
                        + (", or raise measurement.budget" if budget is not None else "")
                        + ")"
                    )
                out.append(Shortfall(f"rules[{i}].aggregation", message, budget is None or budget < need, i))
        elif rule.metric in WINDOW_ONLY:  # decided over windows: one per repetition and load point
            points = _load_points(policy)
            if ms.repetitions < MIN_UNITS:
                out.append(
                    Shortfall(
                        f"rules[{i}].metric",
                        f"{rule.metric} is decided over measured windows, one per "
                        f"repetition at each load point: an interval needs at least {MIN_UNITS} repetitions and "
                        f"the plan has {ms.repetitions}, so the verdict will be inconclusive (raise "
                        "measurement.repetitions)",
                        True,
                        i,
                    )
                )
            if points > 1 and not rule.per and not (rule.scope.concurrency or rule.scope.request_rate):
                out.append(
                    Shortfall(
                        f"rules[{i}].per",
                        f"{rule.metric} pools the windows of all {points} load points into "
                        "one figure; add per: concurrency (or request_rate) or a load scope to decide it at "
                        "each load",
                        False,
                        i,
                    )
                )
        elif rule.metric in RESAMPLED and rule.aggregation not in ("min", "max") and cells < RELIABLE_UNITS:
            units = "continuations" if METRICS[rule.metric].sampling == "position" else "requests"
            out.append(
                Shortfall(
                    f"rules[{i}].metric",
                    f"the plan has {cells} {units} per draft and law{where}; a bootstrap "
                    f"interval from fewer than {RELIABLE_UNITS} is unreliable (too narrow) and from fewer than "
                    f"{MIN_UNITS} not formed: the verdict is then inconclusive (add prompts"
                    + ("" if units == "continuations" else " or measurement.repetitions")
                    + ")",
                    cells < MIN_UNITS,
                    i,
                )
            )
        if (
            declared_load_points(policy)
            and ms.repetitions < 2
            and rule.metric in RESAMPLED
            and rule.aggregation not in ("min", "max")
            and rule.metric not in WINDOW_ONLY
            and compares_with_fallback(rule.metric, rule.relative_to)
        ):
            out.append(
                Shortfall(
                    f"rules[{i}].metric",
                    f"{rule.metric} compares runners timed one window after another at "
                    "each load point; with 1 repetition nothing measures how far the machine drifts between "
                    "windows, and the interval leaves it out (set measurement.repetitions >= 2)",
                    False,
                    i,
                )
            )
    return out


def _load_points(policy: Policy) -> int:
    """How many load points a served run has (1 in-process)."""
    load = getattr(policy, "load", None)
    if load is None:
        return 1
    return max(1, len(load.concurrency or []) + len(load.request_rate or []))
