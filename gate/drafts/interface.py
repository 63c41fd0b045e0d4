"""What every proposal mechanism gives the engine.

A draft states its probability information, because overlap and the correctness
argument depend on it:
- "distribution": a full q per position; exact under rejection sampling
  (Leviathan et al. 2023, Thm 1).
- "point_mass": a deterministic proposal x, i.e. q = one-hot(x); accepted with
  probability p(x), and the residual is p with x removed, renormalised.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

import torch

from gate.law import Law

ProbabilityInfo = Literal["distribution", "point_mass"]


@dataclass
class Proposal:
    """`tokens` [n] proposed after the context, with `q` [n, V] float32 (one-hot for point masses)."""

    tokens: torch.Tensor
    q: torch.Tensor


class Draft(ABC):
    """A proposal mechanism. One instance serves one request at a time (start() resets it)."""

    name: str
    kind: str
    probability_info: ProbabilityInfo
    num_draft_tokens: int

    def start(self) -> None:
        """Forget any state of a previous request (caches)."""

    @abstractmethod
    def propose(self, context: list[int], n: int, law: Law, generator: torch.Generator | None) -> Proposal:
        """Up to `n` proposals following `context` (prompt + committed tokens), drawn under `law`."""

    @abstractmethod
    def teacher_forced(self, ids: list[int], start: int, law: Law, vocab_size: int) -> torch.Tensor:
        """q at every position i >= start of `ids`, given ids[:i]: float32 [len(ids) - start, V].

        A point-mass draft returns one-hot rows, and all-zero rows where it proposes nothing."""

    def cache_bytes(self) -> int:
        """Measured bytes of the draft's own KV cache tensors now (0 when it has none)."""
        return 0

    def modules(self) -> list[torch.nn.Module]:
        """The modules whose weights the draft keeps resident (for the bill)."""
        return []
