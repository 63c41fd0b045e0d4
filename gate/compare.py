"""`gate compare BASE.json CANDIDATE.json`: a candidate draft against the released one, from
two saved reports (e.g. the audit of a quantized draft swap). Never runs a model.

Each figure is the candidate's over the baseline's with a bootstrap interval over the
units of both runs (paired cell by cell when both ran the same cells, else resampled
independently). A line is "regressed" when its whole interval is worse than the tolerance,
"improved" when its whole interval is better by more than it (a stale baseline is worth
refreshing), "unchanged" when the whole interval is within it, else "inconclusive". Runs on
different environments (device, torch, transformers, target weights) are not compared
silently: every verdict is inconclusive and the differences are named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gate.errors import InputError, Problem
from gate.records import Environment, Measurements
from gate.report.document import Report
from gate.rules.confidence import MIN_UNITS, Interval, bootstrap_interval, estimand, ratio
from gate.rules.samples import Selection, value
from gate.rules.status import Change, Status

HIGHER_IS_BETTER = ("overlap", "mean_acceptance_length", "speedup")


@dataclass
class Comparison:
    """One figure of one draft under one law: candidate / baseline."""

    draft: str  # the candidate's name
    baseline_draft: str
    law: str
    figure: str  # "overlap[coding]", "mean_acceptance_length", "speedup", "memory: draft weights", "exactness: exact"
    baseline: float | str | None
    candidate: float | str | None
    ratio: float | None
    interval: Interval | None
    verdict: Change  # regressed, improved, unchanged, inconclusive, missing
    note: str = ""


@dataclass
class CompareResult:
    """Every comparison, the environment and workload differences, and the exit code (0 no
    regression, 1 a regression, 3 not comparable, nothing to compare, or a figure missing
    on one side)."""

    baseline_file: str
    candidate_file: str
    tolerance: float
    environment_differences: list[str]
    comparisons: list[Comparison] = field(default_factory=list)
    exit_code: int = 0


def environment_differences(base: Environment, cand: Environment) -> list[str]:
    """What makes numbers from two runs incomparable: device, versions, the target's weights."""
    out = [f"{key}: {getattr(base, key)!r} vs {getattr(cand, key)!r}" for key in ("device", "device_name", "torch", "transformers")
           if getattr(base, key) != getattr(cand, key)]
    targets = [{m.fingerprint for m in env.models if m.role == "target"} for env in (base, cand)]
    if targets[0] != targets[1]:
        out.append(f"target fingerprint: {', '.join(sorted(targets[0])) or 'none'} vs {', '.join(sorted(targets[1])) or 'none'}")
    return out


def workload_differences(base: Measurements, cand: Measurements) -> list[str]:
    """What makes two runs measure different things: prompts, output lengths, laws."""
    out = []
    for what, get in (("prompts", lambda m: {r.prompt_id for r in m.requests}),
                      ("max_new_tokens", lambda m: {r.max_new_tokens for r in m.requests}),
                      ("laws", lambda m: set(m.laws))):
        a, b = get(base), get(cand)
        if a != b:
            only_a, only_b = sorted(map(str, a - b)), sorted(map(str, b - a))
            out.append(f"{what} differ (only in the baseline: {', '.join(only_a[:5]) or 'none'}"
                       f"{' ...' if len(only_a) > 5 else ''}; only in the candidate: {', '.join(only_b[:5]) or 'none'}"
                       f"{' ...' if len(only_b) > 5 else ''})")
    return out


def _verdict(interval: Interval | None, higher_is_better: bool, tolerance: float) -> Change:
    if interval is None:
        return Change.INCONCLUSIVE
    low, high = (interval.low, interval.high) if higher_is_better else (1 / interval.high, 1 / interval.low)
    if high < 1 - tolerance:
        return Change.REGRESSED
    if low > 1 + tolerance:
        return Change.IMPROVED
    if low >= 1 - tolerance and high <= 1 + tolerance:
        return Change.UNCHANGED
    return Change.INCONCLUSIVE


def _sampled(figure: str, metric: str, aggregation: str, base: Measurements, cand: Measurements, bd: str, cd: str, law: str,
             cats: tuple[str, ...] | None, tolerance: float, confidence: float, resamples: int) -> Comparison | None:
    def side(m: Measurements, runner: str):  # type: ignore[no-untyped-def]
        e = estimand(metric, aggregation, m, Selection(runner, law, cats))
        return e if e is not None and e.units else None

    b, c = side(base, bd), side(cand, cd)
    if b is None and c is None:
        return None
    if b is None or c is None or not b.units or not c.units:
        return Comparison(cd, bd, law, figure, None if b is None else b.point(), None if c is None else c.point(), None, None,
                          Change.MISSING, "not measured in " + ("the baseline" if b is None else "the candidate"))
    same = len(b.groups) == len(c.groups) == 1 and set(b.groups[0][0].keys) == set(c.groups[0][0].keys)
    est = ratio(c, b, paired=same)
    interval = bootstrap_interval(est, confidence, resamples, 0)
    note = "paired by cell" if same else "independent runs"
    if interval is None:
        note += f"; fewer than {MIN_UNITS} units on a side: no interval"
    return Comparison(cd, bd, law, figure, b.point(), c.point(), est.point(), interval,
                      _verdict(interval, metric in HIGHER_IS_BETTER, tolerance), note)


def compare(base: Report, cand: Report, drafts: dict[str, str] | None = None, tolerance: float = 0.05,
            confidence: float = 0.95, resamples: int = 2000, base_file: str = "", cand_file: str = "") -> CompareResult:
    """Compare every draft of the candidate report that the baseline also has (or maps to
    through `drafts`, candidate name -> baseline name) under every law both ran: overlap
    overall and per category, mean acceptance length, speedup, each bill line, and every
    exactness outcome. Raises InputError (exit 2) for a mapping naming an unknown draft."""
    bm, cm = base.measurements, cand.measurements
    drafts = drafts or {}
    unknown = [f"{c}={b}" for c, b in drafts.items() if c not in cm.drafts or b not in bm.drafts]
    if unknown:
        raise InputError([Problem("--draft", "", None, f"{', '.join(unknown)}: the candidate's drafts are "
                                  f"{', '.join(cm.drafts)}; the baseline's are {', '.join(bm.drafts)}")])
    result = CompareResult(base_file, cand_file, tolerance, environment_differences(bm.environment, cm.environment)
                           + workload_differences(bm, cm))
    pairs = [(cd, drafts.get(cd, cd)) for cd in cm.drafts if drafts.get(cd, cd) in bm.drafts]
    laws = [law for law in cm.laws if law in bm.laws]
    for cd, bd in pairs:
        for law in laws:
            cats = sorted({o.category for o in cm.overlaps if o.draft == cd and o.law == law}
                          | {o.category for o in bm.overlaps if o.draft == bd and o.law == law})
            for figure, metric, agg, sel in ([("overlap", "overlap", "mean", None)]
                                             + [(f"overlap[{c}]", "overlap", "mean", (c,)) for c in cats]
                                             + [("mean_acceptance_length", "mean_acceptance_length", "pooled", None),
                                                ("speedup", "speedup", "pooled", None)]):
                row = _sampled(figure, metric, agg, bm, cm, bd, cd, law, sel, tolerance, confidence, resamples)
                if row is not None:
                    result.comparisons.append(row)
            for o in cand.outcomes:
                if o.metric == "exactness" and o.draft == cd and o.law == law:
                    old = next((b for b in base.outcomes if b.rule_id == o.rule_id and b.draft == bd and b.law == law), None)
                    verdict = (Change.REGRESSED if o.status == Status.FAIL and (old is None or old.status != Status.FAIL) else
                               Change.IMPROVED if old is not None and old.status == Status.FAIL and o.status == Status.PASS else
                               Change.UNCHANGED if old is not None and old.status == o.status else Change.INCONCLUSIVE)
                    result.comparisons.append(Comparison(cd, bd, law, f"exactness: {o.rule_id}", old.status if old else None,
                                                         o.status, None, None, verdict))
        for line in _bill_lines(cm, cd):
            old_bytes, _ = value("memory_line_bytes", "max", bm, Selection(bd, "", None), line)
            new_bytes, _ = value("memory_line_bytes", "max", cm, Selection(cd, "", None), line)
            if math.isnan(old_bytes) and math.isnan(new_bytes):
                continue
            r = new_bytes / old_bytes if old_bytes and not math.isnan(old_bytes) else None
            verdict = (Change.MISSING if math.isnan(old_bytes) or math.isnan(new_bytes) else
                       Change.UNCHANGED if r is None or abs(r - 1) <= tolerance else Change.REGRESSED if r > 1 else Change.IMPROVED)
            result.comparisons.append(Comparison(cd, bd, "*", f"memory: {line}", None if math.isnan(old_bytes) else old_bytes,
                                                 None if math.isnan(new_bytes) else new_bytes, r,
                                                 None, verdict, "computed, no interval"))
    if result.environment_differences:
        for row in result.comparisons:
            if row.verdict in (Change.REGRESSED, Change.IMPROVED, Change.UNCHANGED):  # bill lines too: another config or dtype moves them
                row.note = "not comparable: " + "; ".join(result.environment_differences)
                row.verdict = Change.INCONCLUSIVE
    if any(r.verdict == Change.REGRESSED for r in result.comparisons):
        result.exit_code = 1
    elif result.environment_differences or not result.comparisons or any(r.verdict == Change.MISSING for r in result.comparisons):
        result.exit_code = 3
    return result


def _bill_lines(m: Measurements, draft: str) -> list[str]:
    return [x.name for b in m.bills if b.draft == draft for x in b.lines]
