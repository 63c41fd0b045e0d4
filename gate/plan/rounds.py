"""The rounds of a sequential run (measurement.sequential): which units each look measures.

A unit is what one look counts per runner and law (gate.records.LooksRecord): in gate's own
loop a prompt (one request per max_new_tokens), at load points a window (a repetition of the
whole workload). The looks double (doubling): in gate's own loop the first measures a
third of the fixed plan (at least 8 prompts, so the first look has the 5 units an interval
needs with room for contended ones; at most the plan); at load points the first is the
fixed plan's windows (a served run measures few, and a num_draft_tokens sweep needs its
repetitions to agree); the last is the budget.

In gate's own loop the prompts are taken in an order drawn from the workload's seed, the
categories taken in turn, each category's prompts shuffled: any look's prompts are then a
random sample of the workload spread over its categories, so an early look's interval is
about the whole workload, not its first category. Past the workload's size the order starts
again at the next repetition (request seeds differ per repetition, gate.core.requests).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.core.requests import PlannedPrompt
from gate.records import LooksRecord, Measurements

# The fewest prompts the first look of gate's own loop measures (when the plan has as many).
FIRST_LOOK_PROMPTS = 8

# Served sampled exactness draws its samples in looks at these fractions of its plan (the
# samples per prompt and runner gate.exactness.sampled plans, or next_token_samples), and its
# verdict is decided after each (gate.rules.sequential.sample_level): a fault fails at the
# first look whose evidence rejects it, a sampler passes at the first look whose claim tests
# reach the rule's power at detect_tv.
SAMPLE_LOOKS = (0.125, 0.25, 0.5, 1.0)
# The spending power of the sample looks (alpha * t**SAMPLE_RHO, gate.rules.sequential). The
# plan is sized so that its claim tests reach their power at the plan's size, so a pass comes
# at the last look; the early looks are there to fail gross faults, whose p-values (a fault of
# TV 0.4 over a hundred samples: below 1e-10) clear any share. rho 4 spends alpha/4096 at the
# first look and keeps 15/16 of alpha for the last (an O'Brien-Fleming-like boundary, Jennison
# & Turnbull 2000, section 7.3), so a correct sampler's pass costs about what the fixed plan
# cost (the plan is sized at that level).
SAMPLE_RHO = 4.0


def sample_share(look: int) -> float:
    """The share of an exactness rule's significance spent at sample look `look` (1-based) of
    SAMPLE_LOOKS: t_k**SAMPLE_RHO - t_{k-1}**SAMPLE_RHO, t_k = SAMPLE_LOOKS[k - 1] (the power
    family of Kim & DeMets 1987 in Lan & DeMets 1983, eq. 2); the shares sum to 1. Raises
    ValueError for a look outside SAMPLE_LOOKS."""
    if not 1 <= look <= len(SAMPLE_LOOKS):
        raise ValueError(f"sample look {look} outside {len(SAMPLE_LOOKS)} looks")
    before = SAMPLE_LOOKS[look - 2] if look > 1 else 0.0
    return float(SAMPLE_LOOKS[look - 1] ** SAMPLE_RHO - before**SAMPLE_RHO)


# (runner, law) cells whose error-level verdicts more requests could still settle: the command
# wires it from the rules (gate.commands.check); the loop never reads a rule.
Undecided = Callable[[Measurements], set[tuple[str, str]]]

# What one look adds: (repetition, prompts) runs in order (no prompt: the whole workload).
Units = list[tuple[int, list[PlannedPrompt]]]


@dataclass(frozen=True)
class Sequential:
    """What a sequential run may spend (measurement.budget.requests: timed requests per
    runner, law and load point; "auto": the first doubling at or beyond twice the fixed plan)
    and which cells are still undecided after a look (`undecided`) and after a look of the
    served exactness samples (`samples`: the (runner, law) cells whose exactness verdict more
    samples could settle; None: the samples' plan is drawn at once)."""

    budget: int | str
    undecided: Undecided
    samples: Undecided | None = None


@dataclass(frozen=True)
class Rounds:
    """The looks of one run: `looks` (gate.records.LooksRecord: unit, schedule, fixed plan),
    `order`: the prompts in the order units take them (gate's own loop; empty at load points)."""

    looks: LooksRecord
    order: tuple[PlannedPrompt, ...]

    def units(self, look: int) -> Units:
        """What look `look` (1-based) adds, as (repetition, prompts) runs in order; at load
        points, one repetition per window (every prompt)."""
        lo = self.looks.schedule[look - 2] if look > 1 else 0
        hi = self.looks.schedule[look - 1]
        if not self.order:
            return [(rep, []) for rep in range(lo, hi)]
        out: Units = []
        n = len(self.order)
        for u in range(lo, hi):
            rep, prompt = divmod(u, n)
            if out and out[-1][0] == rep:
                out[-1][1].append(self.order[prompt])
            else:
                out.append((rep, [self.order[prompt]]))
        return out


def plan_rounds(
    prompts: list[PlannedPrompt],
    lengths: int,
    repetitions: int,
    budget: int | str,
    windows: bool,
    seed: int,
) -> Rounds:
    """The looks of a sequential run over `prompts` (each run at `lengths` max_new_tokens),
    whose fixed plan is `repetitions`; `budget`: timed requests per runner, law and load point,
    or "auto" (twice the fixed plan, rounded up to a look); `windows`: the runner measures at
    load points (units are windows). A budget below the first look is that look. The looks
    double from the first, and the fixed plan's size is a look too when the budget reaches it."""
    per_unit = lengths * (len(prompts) if windows else 1)
    fixed = repetitions if windows else len(prompts) * repetitions
    first = fixed if windows else min(fixed, max(FIRST_LOOK_PROMPTS, -(-fixed // 3)))
    if budget == "auto":
        most = first
        while most < 2 * fixed:
            most *= 2
    else:
        most = max(first, int(budget) // per_unit)
    # the fixed plan is a look when the budget reaches it: exactness cells are measured that far
    schedule = sorted({*doubling(first, most), *([fixed] if fixed <= most else [])})
    looks = LooksRecord("window" if windows else "prompt", schedule, fixed, per_unit)
    return Rounds(looks, () if windows else tuple(prompt_order(prompts, seed)))


def doubling(first: int, budget: int) -> list[int]:
    """The looks of a sequential run: `first` units, doubling after each look, the last at
    `budget` (units per runner and law). Raises ValueError unless 1 <= first <= budget."""
    if not 1 <= first <= budget:
        raise ValueError(f"a first look of {first} units does not fit a budget of {budget}")
    out, n = [], first
    while n < budget:
        out.append(n)
        n *= 2
    return [*out, budget]


def prompt_order(prompts: list[PlannedPrompt], seed: int) -> list[PlannedPrompt]:
    """`prompts` in the order a sequential run takes them (module docstring): the categories
    in turn (in a shuffled order), each category's prompts shuffled, all from `seed`."""
    rng = random.Random(f"gate-rounds-{seed}")
    by: dict[str, list[PlannedPrompt]] = {}
    for p in prompts:
        by.setdefault(p.category or "", []).append(p)
    groups = list(by.values())
    for g in groups:
        rng.shuffle(g)
    rng.shuffle(groups)
    out: list[PlannedPrompt] = []
    for i in range(max(len(g) for g in groups) if groups else 0):
        out += [g[i] for g in groups if i < len(g)]
    return out


def planned_looks(plan: Any) -> str | None:
    """What a validated plan's sequential run (gate.plan.matrix.Plan) may spend, before any
    model is loaded: its looks, the timed requests of the first look and of the budget, and
    the fixed plan's, over every runner, law and load point (None: a fixed plan). Served
    runners are counted at their load points (their looks are windows)."""
    from gate.load.points import load_points

    policy = plan.policy
    ms = policy.measurement
    if not ms.sequential:
        return None
    windows = not policy.runner.runs_models_here
    lengths = len(policy.workload.max_new_tokens_list)
    rounds = plan_rounds(
        plan.workload.prompts, lengths, ms.repetitions, ms.budget.requests, windows, policy.workload.seed
    )
    looks = rounds.looks
    points = len(load_points(policy)) if windows else 1
    per = (1 + len(policy.drafts)) * len(plan.laws) * points * looks.requests_per_unit
    prompts = len(plan.workload.prompts)
    again = (
        f" (past the workload's {prompts}, its prompts again, one more repetition each time)"
        if not windows and looks.schedule[-1] > prompts
        else ""
    )
    return (
        f"sequential: looks at {', '.join(map(str, looks.schedule))} {looks.unit}s per runner and law{again}; "
        f"{per * looks.schedule[0]} timed requests at the first look, at most {per * looks.schedule[-1]} "
        f"(measurement.budget), against the fixed plan's {per * looks.fixed_plan}"
    )
