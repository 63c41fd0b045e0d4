"""What a runner is asked to run: a planned prompt (token ids, its constraint) and a request
(runner name, law, prompt, length, repetition, seed). Below the plan and the runners, so
both import it (gate.plan.matrix builds them, gate.runners serve them)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gate.constraints.interface import ResponseFormat
from gate.core.law import Law


@dataclass(frozen=True)
class PlannedPrompt:
    """A prompt with its token ids (chat template applied when the policy says so).
    `context_length`: the length (tokens) a context-sweep prompt was built to, else None.
    `response_format`: the grammar constraint its output runs under (None: unconstrained);
    `constraint`: the label of the workload.constraints entry it was planned for ('none',
    'prompt' or the entry's name), None without workload.constraints. Each entry makes its
    own request of a prompt: its id is '<prompt id>#<label>' (after '@<length>' in a context
    sweep), so seeds, overlap continuations and records keep the variants apart."""

    id: str
    category: str
    token_ids: tuple[int, ...]
    context_length: int | None = None
    response_format: ResponseFormat | None = None
    constraint: str | None = None


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
