"""`gate explain`: how a verdict in a saved report was reached, from its raw records.

Saved reports are read by gate.policy.saved (load_report here is its read_report, kept for callers).
"""

from __future__ import annotations

import difflib
from typing import Any

from gate.core.units import Dimension, format_value
from gate.measure.client_check import DEFAULT_MAX_CLIENT_LAG_MS, client_delay_ms, is_client_delayed
from gate.measure.contention import DEFAULT_MAX_CPU_STALL, is_contended, pooled_stall_share, stall_share
from gate.metrics.catalogue import METRICS, TIMED
from gate.policy.saved import read_report as load_report
from gate.report.document import Report
from gate.rules.kinds import registry as rule_kinds
from gate.rules.samples import FALLBACK, samples
from gate.rules.scope import parse_scope
from gate.rules.sequential import shown_level
from gate.rules.status import Status

__all__ = ["explain_rule", "load_report"]


def explain_rule(report: Report, rule_id: str, scope: str | None, max_values: int) -> str:
    """Text explaining every outcome of `rule_id` (or only `scope`). Raises KeyError when absent."""
    outcomes = [o for o in report.outcomes if o.rule_id == rule_id and (scope is None or o.scope == scope)]
    if not outcomes:
        scopes = sorted({o.scope for o in report.outcomes if o.rule_id == rule_id})
        if scope is not None and scopes:  # the rule is there, the scope is not: name its scopes
            close = difflib.get_close_matches(scope, scopes, n=1)
            raise KeyError(
                f"no outcome for rule {rule_id!r} in scope {scope!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; its scopes: {', '.join(scopes)}"
            )
        known = sorted({o.rule_id for o in report.outcomes})
        close = difflib.get_close_matches(rule_id, known, n=1)
        raise KeyError(
            f"no outcome for rule {rule_id!r}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; rules: {', '.join(known)}"
        )
    policy_rule: dict[str, Any] = next((r for r in report.policy.get("rules", []) if r.get("id") == rule_id), {})
    keys = rule_kinds.get(policy_rule.get("kind") or rule_kinds.names()[0]).keys
    shown_rule = dict(policy_rule, scope={k: v for k, v in (policy_rule.get("scope") or {}).items() if v})
    lines = [
        f"rule {rule_id}: " + ", ".join(f"{k}={shown_rule[k]}" for k in keys if shown_rule.get(k) not in (None, {}, []))
    ]
    m = report.measurements
    for o in outcomes:
        lines += ["", f"{o.name}: {o.status.upper()} (level {o.level})", f"  {o.message}"]
        if o.metric not in METRICS:  # a rule kind that decides no metric (exactness): its details explain it
            for d in o.details:
                keys = (
                    "name",
                    "kind",
                    "role",
                    "n",
                    "statistic",
                    "pvalue",
                    "adjusted_pvalue",
                    "detectable",
                    "samples_needed",
                    "verdict",
                    "prompt_id",
                    "repetition",
                    "concurrency",
                    "request_rate",
                    "position",
                    "draft_token",
                    "target_token",
                    "fallback_token",
                    "gap_logits",
                    "near_tie",
                    "within_server_numerics",
                    "lower",
                    "upper",
                    "probes",
                )
                lines.append(
                    "  - "
                    + ", ".join(
                        f"{k}={_number(d[k])}" for k in keys if k in d and (d[k] is not None or k not in _WHERE)
                    )
                )
            continue
        metric = METRICS[o.metric]
        # speedup: pooled tokens/s of the draft over the fallback's, so the fallback's requests are shown too
        pooled_ratio = metric.ratio_to_fallback and metric.sampling == "pooled"
        where = parse_scope(o.scope)
        line = policy_rule.get("line")
        for runner in [o.draft] + ([FALLBACK] if o.relative_to == "fallback" or pooled_ratio else []):
            if o.metric in TIMED:
                lines += _contended(report, where.of(runner))
            if o.aggregation == "pooled":
                lines.append(
                    f"  {runner}: pooled over {o.samples} requests (counters and totals are summed, never ratios "
                    "averaged)"
                )
                continue
            xs = samples(o.metric, m, where.of(runner), line)
            shown = ", ".join(format_value(x, metric.dimension) for x in xs[:max_values])
            more = f" ... ({len(xs) - max_values} more)" if len(xs) > max_values else ""
            lines.append(f"  {runner}: {len(xs)} samples ({metric.sample}), {o.aggregation} taken: {shown}{more}")
        if o.measured is not None:
            dim = Dimension.RATIO if o.relative_to or pooled_ratio else metric.dimension
            how = (
                f"{o.aggregation}(draft) / {o.aggregation}({o.relative_to})"
                if o.relative_to
                else "pooled tokens/s of the draft / of the fallback on the same cells"
                if pooled_ratio
                else o.aggregation
            )
            lines.append(
                f"  value: {how} = {format_value(o.measured, dim)}; threshold: {o.comparison} "
                f"{format_value(o.threshold, dim)}"
            )
        if o.interval is not None:
            i = o.interval
            lines.append(
                f"  interval: {shown_level(i.level)} CI {format_value(i.low, dim)} to {format_value(i.high, dim)} "
                f"({i.method}, "
                f"resampling {i.units} units: whole requests, so tokens of one request stay together)"
            )
        if o.exceedance is not None:
            e = o.exceedance
            lines.append(
                f"  decided by counting: {e.count} of {e.n} samples beyond the threshold ({e.share:.3%}); design "
                "effect "
                f"{e.design_effect:.2f} over {e.units} requests -> effective n {e.n / e.design_effect:.0f}; "
                "Clopper-Pearson "
                f"{shown_level(e.level)} CI of the share {e.low:.3%} to {e.high:.3%} vs at most {e.allowed:.0%} allowed"
            )
        rule_text = {
            Status.PASS: "the whole interval satisfies the rule",
            Status.FAIL: "the whole interval violates the rule",
            Status.WARN: "the whole interval violates the rule (level warn)",
            Status.INCONCLUSIVE: f"the interval straddles the threshold (counts as {o.inconclusive_as})",
        }
        if o.status in rule_text and (o.interval is not None or o.exceedance is not None):
            lines.append(f"  decision: {o.status}: {rule_text[o.status]}")
        if o.waiver:
            lines.append(
                f"  waiver: {o.waiver}" + (f" (status without it: {o.waived_status})" if o.waived_status else "")
            )
    return "\n".join(lines)


def _contended(report: Report, where: Any) -> list[str]:
    """Which of a runner's requests were contended or client delayed (timing verdicts leave them out)."""
    limit = (report.policy.get("measurement") or {}).get("max_cpu_stall", DEFAULT_MAX_CPU_STALL)
    cpus = report.measurements.environment.cpu_count
    reqs = [r for r in report.measurements.requests if where.takes(r)]
    busy = sorted(
        (r for r in reqs if is_contended(r, limit, cpus)), key=lambda r: stall_share(r, cpus) or 0.0, reverse=True
    )
    out = []
    if busy:
        ids = ", ".join(f"{r.prompt_id} ({stall_share(r, cpus):.0%})" for r in busy[:8]) + (
            " ..." if len(busy) > 8 else ""
        )
        pooled = pooled_stall_share(busy, cpus)
        out.append(
            f"  {where.runner}: {len(busy)} of {len(reqs)} requests contended (over {limit:.0%} of wall time without "
            f"CPU; {pooled or 0.0:.0%} of theirs pooled, weighted by wall time), the most first: {ids}"
        )
    bound = (report.policy.get("measurement") or {}).get("max_client_lag_ms", DEFAULT_MAX_CLIENT_LAG_MS)
    delayed = [r for r in reqs if is_client_delayed(r, bound)]
    if delayed:
        ids = ", ".join(f"{r.prompt_id} ({client_delay_ms(r):.1f} ms)" for r in delayed[:8]) + (
            " ..." if len(delayed) > 8 else ""
        )
        out.append(
            f"  {where.runner}: {len(delayed)} of {len(reqs)} requests client delayed (schedule or event-loop lag "
            f"over {bound:g} ms): {ids}"
        )
    return out


_WHERE = ("repetition", "concurrency", "request_rate")  # a divergence's request: shown where known


def _number(x: object) -> object:
    """A statistic as people read it: 4 significant digits, not a float's 16."""
    return f"{x:.4g}" if isinstance(x, float) else x
