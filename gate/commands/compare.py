"""`gate compare BASE.json CANDIDATE.json`: a candidate draft against the released one, from
two saved reports (e.g. the audit of a quantized draft swap). Never runs a model.

Each figure is the candidate's over the baseline's with a bootstrap interval over the
units of both runs (paired cell by cell when both ran the same cells, else resampled
independently). A line is "regressed" when its whole interval is worse than the tolerance,
"improved" when its whole interval is better by more than it (a stale baseline is worth
refreshing), "unchanged" when the whole interval is within it, else "inconclusive". Runs on
different environments (device, torch, transformers, target weights) are not compared
silently: every verdict is inconclusive and the differences are named.

Every draft of either report is accounted for: paired by `--draft CANDIDATE=BASE`, else by
name, else (one draft in each report) with each other; a draft left without a partner is
listed as unmatched and, unless allowed, the comparison is not decided (exit 3). The exit
code follows `gate check`'s: 1 a regression, 3 not decided (not comparable, nothing to
compare, a figure missing on one side, an unmatched draft, an inconclusive figure), else 0.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gate.core.errors import InputError, Problem
from gate.metrics.catalogue import MEAN_ACCEPTANCE_LENGTH, MEMORY_LINE_BYTES, METRICS, OVERLAP, POOLED, SPEEDUP
from gate.records import DID_NOT_SPECULATE, Environment, Measurements
from gate.report.document import Report
from gate.rules.confidence import MIN_UNITS, Interval, bootstrap_interval, estimand, ratio
from gate.rules.samples import Selection, value
from gate.rules.status import Change, Status

# what a draft runner that did not speculate leaves undecided
SPECULATIVE_FIGURES = (MEAN_ACCEPTANCE_LENGTH.name, SPEEDUP.name)


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
    """Every comparison, the environment and workload differences, how the drafts were paired
    (`pairs`: "candidate=baseline (by name)" ...), the drafts left unmatched (`unmatched`:
    "candidate int8", "baseline released"; `unmatched_allowed`: the user said they may be) and
    the exit code (module docstring)."""

    baseline_file: str
    candidate_file: str
    tolerance: float
    environment_differences: list[str]
    comparisons: list[Comparison] = field(default_factory=list)
    exit_code: int = 0
    pairs: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    unmatched_allowed: bool = False
    inconclusive: str = "error"  # what an inconclusive figure does: error (exit 3), fail (exit 1) or warn

    def counts(self) -> dict[str, int]:
        """Figures per verdict ("regressed": 1, ...), in the order of gate.rules.status.Change."""
        return {str(v): n for v in Change if (n := sum(1 for c in self.comparisons if c.verdict == v))}

    def summary(self) -> str:
        """The closing line: 'gate compare: 1 regressed, 12 unchanged; unmatched: candidate int8; exit code 1'."""
        counts = ", ".join(f"{n} {v}" for v, n in self.counts().items()) or "nothing compared"
        unmatched = (
            f"; unmatched{' (allowed)' if self.unmatched_allowed else ''}: {', '.join(self.unmatched)}"
            if self.unmatched
            else ""
        )
        return f"gate compare: {counts}{unmatched}; exit code {self.exit_code}"


def environment_differences(base: Environment, cand: Environment) -> list[str]:
    """What makes numbers from two runs incomparable: device, versions, the target's weights."""
    out = [
        f"{key}: {getattr(base, key)!r} vs {getattr(cand, key)!r}"
        for key in ("device", "device_name", "torch", "transformers")
        if getattr(base, key) != getattr(cand, key)
    ]
    targets = [{m.fingerprint for m in env.models if m.role == "target"} for env in (base, cand)]
    if targets[0] != targets[1]:
        out.append(
            f"target fingerprint: {', '.join(sorted(targets[0])) or 'none'} vs "
            f"{', '.join(sorted(targets[1])) or 'none'}"
        )
    return out


def workload_differences(base: Measurements, cand: Measurements, laws: bool = True) -> list[str]:
    """What makes two runs measure different things: prompts, output lengths, laws (with
    `laws`; gate check's baseline pairs cells law by law, so a law one run lacks leaves only
    its own cells without a partner). Prompts are the workload's selected ones
    (WorkloadInfo.prompt_ids) where both reports record them, so two sequential runs that
    stopped at different looks of one workload compare; else the prompts their requests ran."""
    planned = all(m.workload is not None and m.workload.prompt_ids for m in (base, cand))

    def prompts(m: Measurements) -> set[Any]:
        return set(m.workload.prompt_ids) if planned and m.workload is not None else {r.prompt_id for r in m.requests}

    out = []
    getters: list[tuple[str, Callable[[Measurements], set[Any]]]] = [
        ("prompts", prompts),
        ("max_new_tokens", lambda m: {r.max_new_tokens for r in m.requests}),
        *([("laws", lambda m: set(m.laws))] if laws else []),
    ]
    for what, get in getters:
        a, b = get(base), get(cand)
        if a != b:
            only_a, only_b = sorted(map(str, a - b)), sorted(map(str, b - a))
            out.append(
                f"{what} differ (only in the baseline: {', '.join(only_a[:5]) or 'none'}"
                f"{' ...' if len(only_a) > 5 else ''}; only in the candidate: {', '.join(only_b[:5]) or 'none'}"
                f"{' ...' if len(only_b) > 5 else ''})"
            )
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


def _sampled(
    figure: str,
    metric: str,
    aggregation: str,
    base: Measurements,
    cand: Measurements,
    bd: str,
    cd: str,
    law: str,
    cats: tuple[str, ...] | None,
    tolerance: float,
    confidence: float,
    resamples: int,
) -> Comparison | None:
    def side(m: Measurements, runner: str):  # type: ignore[no-untyped-def]
        e = estimand(metric, aggregation, m, Selection(runner, law, cats))
        return e if e is not None and e.units else None

    b, c = side(base, bd), side(cand, cd)
    if b is None and c is None:
        return None
    if b is None or c is None or not b.units or not c.units:
        return Comparison(
            cd,
            bd,
            law,
            figure,
            None if b is None else b.point(),
            None if c is None else c.point(),
            None,
            None,
            Change.MISSING,
            "not measured in " + ("the baseline" if b is None else "the candidate"),
        )
    same = len(b.groups) == len(c.groups) == 1 and set(b.groups[0][0].keys) == set(c.groups[0][0].keys)
    est = ratio(c, b, paired=same)
    interval = bootstrap_interval(est, confidence, resamples, 0)
    note = "paired by cell" if same else "independent runs"
    if interval is None:
        note += f"; fewer than {MIN_UNITS} units on a side: no interval"
    return Comparison(
        cd,
        bd,
        law,
        figure,
        b.point(),
        c.point(),
        est.point(),
        interval,
        _verdict(interval, METRICS[metric].better == "higher", tolerance),
        note,
    )


def pair_drafts(
    base: list[str], cand: list[str], mapping: dict[str, str]
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Pair the candidate report's drafts with the baseline's: `mapping` (candidate ->
    baseline) first, then equal names, then, when each report holds exactly one draft, those
    two. Returns ([(candidate, baseline, how)], unmatched: "candidate NAME" / "baseline NAME").
    Raises InputError (exit 2) for a mapping naming a draft a report does not hold, with the
    closest name."""
    problems = []
    for c, b in mapping.items():
        for name, side, names in ((c, "candidate", cand), (b, "baseline", base)):
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(
                    f"{c}={b}: the {side} report has no draft {name!r}{hint}; its drafts: {', '.join(names) or 'none'}"
                )
    if problems:
        raise InputError([Problem("--draft", "", None, p) for p in problems])
    pairs = [(c, b, "--draft") for c, b in mapping.items()]
    used_c, used_b = set(mapping), set(mapping.values())
    pairs += [(c, c, "by name") for c in cand if c not in used_c and c in base]  # a baseline draft may partner two
    used_c |= {c for c, _, _ in pairs}
    used_b |= {b for _, b, _ in pairs}
    if len(cand) == len(base) == 1 and not pairs:
        pairs.append((cand[0], base[0], "the only draft of each report"))
        used_c.add(cand[0])
        used_b.add(base[0])
    unmatched = [f"candidate {c}" for c in cand if c not in used_c] + [f"baseline {b}" for b in base if b not in used_b]
    return pairs, unmatched


def compare(
    base: Report,
    cand: Report,
    drafts: dict[str, str] | None = None,
    tolerance: float = 0.05,
    confidence: float = 0.95,
    resamples: int = 2000,
    base_file: str = "",
    cand_file: str = "",
    allow_unmatched: bool = False,
    inconclusive: str = "error",
) -> CompareResult:
    """Compare every draft of the candidate report with its partner in the baseline
    (pair_drafts: `drafts` maps candidate name -> baseline name) under every law both ran:
    overlap overall and per category, mean acceptance length, speedup, each bill line, and
    every exactness outcome. A draft without a partner is unmatched: exit 3 unless
    `allow_unmatched`. `inconclusive` says what an inconclusive figure does to the exit code
    (error: 3, fail: 1, warn: nothing). Raises InputError (exit 2) for a mapping naming an
    unknown draft."""
    bm, cm = base.measurements, cand.measurements
    pairs, unmatched = pair_drafts(list(bm.drafts), list(cm.drafts), drafts or {})
    result = CompareResult(
        base_file,
        cand_file,
        tolerance,
        environment_differences(bm.environment, cm.environment) + workload_differences(bm, cm),
        pairs=[f"{c}={b} ({how})" for c, b, how in pairs],
        unmatched=unmatched,
        unmatched_allowed=allow_unmatched,
        inconclusive=inconclusive,
    )
    laws = [law for law in cm.laws if law in bm.laws]
    for cd, bd, _ in pairs:
        for law in laws:
            cats = sorted(
                {o.category for o in cm.overlaps if o.draft == cd and o.law == law}
                | {o.category for o in bm.overlaps if o.draft == bd and o.law == law}
            )
            for figure, metric, agg, sel in (
                [(OVERLAP.name, OVERLAP.name, "mean", None)]
                + [(f"{OVERLAP.name}[{c}]", OVERLAP.name, "mean", (c,)) for c in cats]
                + [(m.name, m.name, POOLED, None) for m in (MEAN_ACCEPTANCE_LENGTH, SPEEDUP)]
            ):
                row = _sampled(figure, metric, agg, bm, cm, bd, cd, law, sel, tolerance, confidence, resamples)
                if row is not None:
                    result.comparisons.append(row)
            for o in cand.outcomes:
                if o.tests_law and o.draft == cd and o.law == law:
                    old = next(
                        (b for b in base.outcomes if b.rule_id == o.rule_id and b.draft == bd and b.law == law), None
                    )
                    verdict = (
                        Change.REGRESSED
                        if o.status == Status.FAIL and (old is None or old.status != Status.FAIL)
                        else Change.IMPROVED
                        if old is not None and old.status == Status.FAIL and o.status == Status.PASS
                        else Change.UNCHANGED
                        if old is not None and old.status == o.status
                        else Change.INCONCLUSIVE
                    )
                    result.comparisons.append(
                        Comparison(
                            cd,
                            bd,
                            law,
                            f"exactness: {o.rule_id}",
                            old.status if old else None,
                            o.status,
                            None,
                            None,
                            verdict,
                        )
                    )
        for line in _bill_lines(cm, cd):
            old_bytes, _ = value(MEMORY_LINE_BYTES.name, "max", bm, Selection(bd, "", None), line)
            new_bytes, _ = value(MEMORY_LINE_BYTES.name, "max", cm, Selection(cd, "", None), line)
            if math.isnan(old_bytes) and math.isnan(new_bytes):
                continue
            r = new_bytes / old_bytes if old_bytes and not math.isnan(old_bytes) else None
            verdict = (
                Change.MISSING
                if math.isnan(old_bytes) or math.isnan(new_bytes)
                else Change.UNCHANGED
                if r is None or abs(r - 1) <= tolerance
                else Change.REGRESSED
                if r > 1
                else Change.IMPROVED
            )
            result.comparisons.append(
                Comparison(
                    cd,
                    bd,
                    "*",
                    f"memory: {line}",
                    None if math.isnan(old_bytes) else old_bytes,
                    None if math.isnan(new_bytes) else new_bytes,
                    r,
                    None,
                    verdict,
                    "computed, no interval",
                )
            )
    for (
        row
    ) in result.comparisons:  # a draft that did not speculate in either run: its speculative figures decide nothing
        silent = [
            side
            for side, m, d in (("baseline", bm, row.baseline_draft), ("candidate", cm, row.draft))
            if any(s.runner == d and s.status in DID_NOT_SPECULATE and row.law in ("*", s.law) for s in m.speculation)
        ]
        if silent and (row.figure in SPECULATIVE_FIGURES or row.figure.startswith("exactness")):
            row.verdict = Change.INCONCLUSIVE
            row.note = f"did not speculate in the {' and '.join(silent)} run (measurements.speculation): not compared"
    if result.environment_differences:
        for row in result.comparisons:
            if row.verdict in (
                Change.REGRESSED,
                Change.IMPROVED,
                Change.UNCHANGED,
            ):  # bill lines too: another config or dtype moves them
                row.note = "not comparable: " + "; ".join(result.environment_differences)
                row.verdict = Change.INCONCLUSIVE
    result.exit_code = _exit_code(result)
    return result


def _exit_code(result: CompareResult) -> int:
    """1 a regression (or an inconclusive figure with inconclusive: fail); 3 not decided: not
    comparable, nothing compared, a figure missing on one side, an unmatched draft (unless
    allowed), an inconclusive figure (inconclusive: error); else 0."""
    verdicts = {r.verdict for r in result.comparisons}
    if Change.REGRESSED in verdicts or (Change.INCONCLUSIVE in verdicts and result.inconclusive == "fail"):
        return 1
    if (
        result.environment_differences
        or not result.comparisons
        or Change.MISSING in verdicts
        or (result.unmatched and not result.unmatched_allowed)
        or (Change.INCONCLUSIVE in verdicts and result.inconclusive == "error")
    ):
        return 3
    return 0


def _bill_lines(m: Measurements, draft: str) -> list[str]:
    return [x.name for b in m.bills if b.draft == draft for x in b.lines]
