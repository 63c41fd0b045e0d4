"""num_draft_tokens per load: the best K of each swept draft at each load point, and the
schedule (K by load) it implies. Never runs a model; reads requests only.

A draft with `num_draft_tokens_sweep` runs once per K as its own runner ('<draft>.k<K>',
the declared K under the draft's own name, K = 0 being the fallback). At each law and load
point (in-process: the one sequential point) every K gets a score: the median over the
repetitions of its speedup in that repetition (pooled committed tokens/s over the
fallback's on the same prompts, paired, contended and client-delayed requests left out:
the `speedup` metric). The median is robust to one bad repetition. A K is stable when its
per-repetition speedups spread (max - min) by at most `max_spread` of their median (vLLM's
`bench sweep` likewise repeats each setting and distrusts settings whose runs disagree);
an unstable K is shown, never chosen. The best K is the stable K of highest score, K = 0
(score 1.0) included, so a draft whose stable Ks all lose to the fallback is scheduled off
(K = 0) there; where no K > 0 is stable no K is chosen (speculation off is not shown better
by Ks nobody could measure).

The pooled speedup of each K over all repetitions, with its bootstrap interval
(gate.rules.confidence), is shown beside it; a rule that requires the draft to pay with its
best K (rule kind best_num_draft_tokens) decides on those intervals with a Bonferroni
correction over the Ks tried, not on the scores that chose it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

from gate.measure.client_check import is_client_delayed
from gate.measure.contention import is_contended
from gate.metrics.catalogue import ACCEPTANCE_RATE, SPEEDUP
from gate.records import FALLBACK, Measurements
from gate.rules.confidence import estimand, speedup_interval
from gate.rules.kinds.metric import no_proposal
from gate.rules.selection import Selection, swept_runners


@dataclass
class KCell:
    """One K of a swept draft at one law and load point: the `runner` that ran it
    ("fallback" for K = 0), its per-repetition speedups (x; None where a repetition has no
    clean paired request), `score` (their median, x; None: none measured), `spread`
    ((max - min) / median, None with fewer than two), `stable` and the pooled `speedup` with
    its interval over every repetition (x; None: fewer than 5 paired requests)."""

    k: int
    runner: str
    per_repetition: list[float | None] = field(default_factory=list)
    score: float | None = None
    spread: float | None = None
    stable: bool = False
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    no_proposal: str | None = (
        None  # the K's runner made no proposal here (gate.rules.kinds.metric.no_proposal): never chosen
    )


@dataclass
class KChoice:
    """A swept `draft` under `law` at one load point (`kind` "concurrency", "request_rate" or
    "sequential", `value` its load; sequential: 1): every K's cell, the `best_k` chosen (None:
    no K > 0 is stable), the `declared_k` (the draft's num_draft_tokens) and `message`."""

    draft: str
    law: str
    kind: str
    value: float
    declared_k: int
    cells: list[KCell]
    best_k: int | None
    message: str

    @property
    def label(self) -> str:
        """'c=4', '2 req/s' or 'sequential'."""
        return {"concurrency": f"c={self.value:g}", "request_rate": f"{self.value:g} req/s"}.get(
            self.kind, "sequential"
        )

    def cell(self, k: int) -> KCell | None:
        """The cell of num_draft_tokens `k` (None: not swept)."""
        return next((c for c in self.cells if c.k == k), None)


def _load_points(m: Measurements, runners: set[str]) -> list[tuple[str, float]]:
    points: set[tuple[str, float]] = set()
    for r in m.requests:
        if r.draft in runners:
            points.add(
                ("concurrency", float(r.concurrency))
                if r.concurrency is not None
                else ("request_rate", float(r.request_rate))
                if r.request_rate is not None
                else ("sequential", 1.0)
            )
    return sorted(points)


def _selection(runner: str, law: str, kind: str, value: float) -> Selection:
    if kind == "concurrency":
        return Selection(runner, law, None, concurrency=(int(value),))
    if kind == "request_rate":
        return Selection(runner, law, None, request_rate=(value,))
    return Selection(runner, law, None)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _cell(
    m: Measurements,
    k: int,
    runner: str,
    law: str,
    kind: str,
    value: float,
    max_spread: float,
    confidence: float,
    resamples: int,
    seed: int,
) -> KCell:
    cell = KCell(k, runner)
    if runner != FALLBACK:
        cell.no_proposal = no_proposal(ACCEPTANCE_RATE.name, m, _selection(runner, law, kind, value))
    if runner == FALLBACK:
        cell.per_repetition, cell.score, cell.spread, cell.stable = [1.0], 1.0, 0.0, True
        cell.speedup = cell.speedup_low = cell.speedup_high = 1.0
        return cell
    sel = _selection(runner, law, kind, value)
    reps = sorted({r.repetition for r in m.requests if sel.takes(r)})
    for rep in reps:
        one = replace(m, requests=[r for r in m.requests if r.repetition == rep])
        est = estimand(SPEEDUP.name, "pooled", one, sel)
        cell.per_repetition.append(
            _finite(est.point()) if est is not None and all(g[0].n for g in est.groups) else None
        )
    values = [v for v in cell.per_repetition if v is not None]
    if values:
        cell.score = statistics.median(values)
    if len(values) >= 2 and cell.score:
        cell.spread = (max(values) - min(values)) / cell.score
        cell.stable = (
            cell.spread <= max_spread and cell.no_proposal is None
        )  # a K that never proposed is not speculation
    cell.speedup, cell.speedup_low, cell.speedup_high = speedup_interval(m, sel, confidence, resamples, seed)
    return cell


def clean(m: Measurements, max_cpu_stall: float | None, max_client_lag_ms: float | None) -> Measurements:
    """`m` without its contended and client-delayed requests (gate.measure: their times
    measure the machine or the client, not the runner)."""
    cpus = m.environment.cpu_count
    kept = [
        r for r in m.requests if not (is_contended(r, max_cpu_stall, cpus) or is_client_delayed(r, max_client_lag_ms))
    ]
    return m if len(kept) == len(m.requests) else replace(m, requests=kept)


def schedule(
    m: Measurements, max_spread: float = 0.2, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> list[KChoice]:
    """The best K of every swept draft (gate.policy: num_draft_tokens_sweep) at every law and
    load point it was measured at, in (draft, law, load) order; [] without a sweep. Pass the
    measurements through clean() first to leave contended requests out."""
    out: list[KChoice] = []
    for draft, ks in swept_runners(m).items():
        declared = m.drafts[draft].num_draft_tokens if draft in m.drafts else None
        for law in m.laws:
            for kind, value in _load_points(m, set(ks.values()) - {FALLBACK}):
                cells = [
                    _cell(m, k, runner, law, kind, value, max_spread, confidence, resamples, seed)
                    for k, runner in ks.items()
                ]
                if all(c.score is None for c in cells if c.k):
                    continue  # nothing of this draft measured here under this law
                stable = [c for c in cells if c.stable and c.score is not None]
                # K=0 wins only against a stable K > 0: with none, nothing says speculation off is better
                best = max(stable, key=lambda c: (c.score, -c.k)) if any(c.k for c in stable) else None
                choice = KChoice(draft, law, kind, value, declared or 0, cells, best.k if best else None, "")
                choice.message = _message(choice, max_spread)
                out.append(choice)
    return out


def _message(c: KChoice, max_spread: float) -> str:
    where = {"concurrency": f"concurrency {c.value:g}", "request_rate": f"request rate {c.value:g}/s"}.get(
        c.kind, "one request at a time"
    )
    head = f"{c.draft} under {c.law} at {where}"
    silent = [f"K={x.k}" for x in c.cells if x.k and x.no_proposal is not None]
    unstable = [
        f"K={x.k} (spread {x.spread:.0%})"
        for x in c.cells
        if x.k and x.spread is not None and not x.stable and x.no_proposal is None
    ]
    unmeasured = [f"K={x.k}" for x in c.cells if x.k and x.spread is None and x.no_proposal is None]
    tail = ""
    if silent:
        tail += f"; not chosen, made no proposal (speculation never ran): {', '.join(silent)}"
    if unstable:
        tail += f"; not chosen, repetitions disagree by more than {max_spread:.0%}: {', '.join(unstable)}"
    if unmeasured:
        tail += f"; not chosen, fewer than 2 repetitions with a speedup: {', '.join(unmeasured)}"
    if c.best_k is None:
        return f"{head}: no K chosen, no K > 0 is stable{tail}"
    best = c.cell(c.best_k)
    assert best is not None and best.score is not None
    if c.best_k == 0:
        return f"{head}: best K=0 (speculation off): no stable K beats the fallback{tail}"
    declared = c.cell(c.declared_k)
    vs = ""
    if c.declared_k != c.best_k and declared is not None and declared.score is not None:
        vs = f", against {declared.score:.2f}x at the declared K={c.declared_k}"
    elif c.declared_k == c.best_k:
        vs = " (the declared K)"
    return f"{head}: best K={c.best_k}, median speedup {best.score:.2f}x over repetitions{vs}{tail}"


def schedule_lines(choices: list[KChoice]) -> list[str]:
    """The K schedule per draft and law, one line each: 'lookup under greedy: K by load
    c=1: 4, c=4: 2 (declared 4)'."""
    lines = []
    for key in dict.fromkeys((c.draft, c.law) for c in choices):
        mine = [c for c in choices if (c.draft, c.law) == key]
        ks = ", ".join(f"{c.label}: {'?' if c.best_k is None else c.best_k}" for c in mine)
        lines.append(f"{key[0]} under {key[1]}: K by load {ks} (declared {mine[0].declared_k})")
    return lines
