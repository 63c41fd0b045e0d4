"""Policy -> plan: the matrix of (draft x law x max_new_tokens x prompt x repetition) to run.

Requests are interleaved by default (measurement.interleave): for every (repetition, law,
max_new_tokens, prompt) the fallback runs first, then every draft in policy order, so slow
drift of the machine hits all alike and each draft request has a paired fallback request
run moments before it. The fallback runs first because its continuation is the one overlap
is measured along. Without interleaving each runner's requests form one block.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable

from gate.law import Law
from gate.records import FALLBACK


@dataclass(frozen=True)
class PlannedPrompt:
    """A prompt with its token ids (chat template applied when the policy says so).
    `context_length`: the length (tokens) a context-sweep prompt was built to, else None."""

    id: str
    category: str
    token_ids: tuple[int, ...]
    context_length: int | None = None


@dataclass(frozen=True)
class Request:
    """One request to run: which runner (a draft name or 'fallback'), law, prompt, length."""

    draft: str
    law: Law
    prompt: PlannedPrompt
    max_new_tokens: int
    repetition: int
    seed: int  # shared by the fallback and every draft for the same cell


def request_seed(seed: int, prompt_id: str, law: str, max_new_tokens: int, repetition: int) -> int:
    """A stable 63-bit seed per cell, derived from the policy seed (no global RNG state)."""
    key = f"{seed}|{prompt_id}|{law}|{max_new_tokens}|{repetition}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1


def plan_requests(drafts: list[str], laws: list[Law], prompts: list[PlannedPrompt], max_new_tokens: list[int],
                  repetitions: range | int, seed: int, interleave: bool = True) -> list[Request]:
    """Every request in run order (see the module docstring for the interleaving).
    `repetitions`: a count, or the range of repetition indices to run (extra repetitions)."""
    reps = range(repetitions) if isinstance(repetitions, int) else repetitions
    out: list[Request] = []
    for rep in reps:
        for law in laws:
            for mnt in max_new_tokens:
                for prompt in prompts:
                    s = request_seed(seed, prompt.id, law.name, mnt, rep)
                    for runner in [FALLBACK, *drafts]:
                        out.append(Request(runner, law, prompt, mnt, rep, s))
    if not interleave:
        order = {name: i for i, name in enumerate([FALLBACK, *drafts])}
        out.sort(key=lambda r: order[r.draft])  # stable: each runner's block keeps the cell order
    return out


@dataclass
class ExactnessPlan:
    """Which (draft, law) pairs exactness rules need, and how many speculative first tokens
    to draw per prompt for the next-token test (0: PIT or greedy equality only)."""

    pairs: set[tuple[str, str]] = field(default_factory=set)
    next_token_samples: dict[tuple[str, str], int] = field(default_factory=dict)
    next_token_prompts: int = 1


def plan_exactness(rules: Iterable[Any], drafts: list[str], laws: list[str]) -> ExactnessPlan:
    """The exactness measurements every rule of kind 'exactness' (level not off) needs."""
    plan = ExactnessPlan()
    for rule in rules:
        if rule.kind != "exactness" or rule.level == "off":
            continue
        for d in rule.scope.drafts or drafts:
            for law in rule.scope.laws or laws:
                plan.pairs.add((d, law))
                n = plan.next_token_samples.get((d, law), 0)
                plan.next_token_samples[(d, law)] = max(n, rule.next_token_samples)
        plan.next_token_prompts = max(plan.next_token_prompts, rule.next_token_prompts)
    return plan
