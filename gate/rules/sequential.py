"""Group-sequential looks: the confidence level a verdict is decided at, look by look.

A sequential run (measurement.sequential, gate.plan.rounds) measures in rounds and decides
after each; a cell (runner and law) is measured again only while one of its error-level
verdicts is undecided. Deciding at every look at the policy's confidence would inflate the
error rate: with 4 looks at 95%, a speedup of exactly 1.0x would "pass" or "fail" up to
about 13% of the time (Armitage, McPherson & Rowe 1969). So each look spends a part of the
error budget alpha = 1 - confidence, by an alpha-spending function (Lan & DeMets 1983,
Biometrika 70(3), eq. 2), here the power family alpha * t**RHO (Kim & DeMets 1987;
Jennison & Turnbull 2000, "Group Sequential Methods", section 7.3), with t = n_k / n_max the
information fraction of look k (its units over the budget's):

    alpha_k = alpha * (t_k**RHO - t_{k-1}**RHO),   level at look k = 1 - alpha_k.

The looks' shares are allotted by Bonferroni's inequality, not by the joint law of the
looks' statistics: P(some look errs) <= sum_k alpha_k = alpha whatever their dependence,
whatever drives the stopping (another verdict of the cell, contention, the wall-time
budget), and for every interval gate makes (bootstrap, exceedance bounds), which exact
group-sequential boundaries (they need a normal statistic with independent increments)
would not cover. The price is some width: RHO = 2 keeps most of alpha for the last looks,
where close verdicts are decided (the last of 4 doubling looks spends 75% of alpha), and
spends 1.6% of it at the first, where only plain verdicts are.
"""

from __future__ import annotations

from dataclasses import dataclass

from gate.plan.rounds import sample_share
from gate.records import Measurements

# The power of the spending function alpha * t**RHO (module docstring).
RHO = 2.0


def spent(alpha: float, t: float) -> float:
    """The error budget spent by information fraction `t` (0..1): alpha * t**RHO (Kim & DeMets 1987)."""
    return float(alpha * min(max(t, 0.0), 1.0) ** RHO)


def look_level(confidence: float, schedule: list[int], look: int) -> float:
    """The two-sided confidence level at `look` (1-based) of `schedule` (units per runner and
    law at each look, increasing; the last is the budget): 1 - alpha_k (module docstring).
    Raises ValueError for a look outside the schedule."""
    if not 1 <= look <= len(schedule):
        raise ValueError(f"look {look} outside a schedule of {len(schedule)} looks")
    alpha, n_max = 1.0 - confidence, schedule[-1]
    before = schedule[look - 2] / n_max if look > 1 else 0.0
    return 1.0 - (spent(alpha, schedule[look - 1] / n_max) - spent(alpha, before))


def sample_level(alpha: float, look: int) -> float:
    """The significance (family-wise, before Holm) an exactness family is decided at after
    sample look `look` (1-based) of gate.plan.rounds.SAMPLE_LOOKS: alpha times the look's
    share (sample_share, the power family with rho SAMPLE_RHO). Summed over the looks it is
    alpha, so the chance that some look fails a correct sampler is at most alpha
    (Bonferroni), whatever stops the looks. Raises ValueError for a look outside SAMPLE_LOOKS."""
    return alpha * sample_share(look)


def shown_level(level: float) -> str:
    """A confidence level as messages show it: '95%' when whole, else to two decimals ('99.92%')."""
    pct = level * 100
    return f"{pct:.0f}%" if abs(pct - round(pct)) < 1e-9 else f"{pct:.2f}%"


@dataclass(frozen=True)
class Look:
    """Where a verdict stands in a sequential run: its cell's `look` of `looks` (1-based) and
    the `level` it is decided at (look_level)."""

    look: int
    looks: int
    level: float

    def describe(self) -> str:
        """'look 2 of 4', for verdict messages."""
        return f"look {self.look} of {self.looks}"


def look_of(m: Measurements, confidence: float, runner: str, law: str) -> Look | None:
    """The look `runner` (a draft or the fallback) under `law` is at in `m`'s sequential run
    (m.looks; None: a fixed plan, decided at `confidence`). A verdict that reads the fallback
    too is at its runner's look: the fallback ran beside it in every round the runner ran
    (and in others, which such a verdict does not read: it pairs, or compares like with like)."""
    rec = m.looks
    if rec is None:
        return None
    taken = min(rec.taken.get(f"{runner}/{law}", 1), len(rec.schedule))
    return Look(taken, len(rec.schedule), look_level(confidence, rec.schedule, taken))
