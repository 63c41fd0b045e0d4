"""The target oracle: the target model run locally to score tokens by teacher forcing.

Overlap, exactness (greedy divergences, PIT, next-token laws) and `gate exactness` on
recorded samples need the target's logits at given positions, whatever runner produced
the tokens. The oracle is the target loaded in this process (for the in-process
transformers runner, the very model the runner serves: no second copy). It is optional
where the user has no local copy of the target: the checks that need it then cannot be
made (nothing more is built for that case yet).
"""

from __future__ import annotations

from typing import Any

import torch

from gate.core.law import AnyLaw, law_probs
from gate.models.cache import forward


class TargetOracle:
    """Teacher-forced logits of a transformers causal LM (`model`, on `device`)."""

    def __init__(self, model: Any, device: torch.device) -> None:  # a transformers causal LM
        self.model = model
        self.device = device
        head = model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)

    @torch.inference_mode()
    def target_logits(self, ids: list[int], start: int) -> torch.Tensor:
        """Teacher-forced raw target logits at positions start..len(ids)-1: [len(ids) - start, V]
        (row i: the logits of ids[start + i] given ids[:start + i]). Raises ValueError for start < 1."""
        if start < 1:
            raise ValueError("teacher forcing needs at least one token of prefix (start >= 1)")
        logits: torch.Tensor = forward(self.model, torch.tensor([ids[:-1]], device=self.device))
        return logits[0, start - 1 :]

    def target_probs(self, ids: list[int], start: int, law: AnyLaw) -> torch.Tensor:
        """Teacher-forced target law at positions start..len(ids)-1: float32 [len(ids) - start, V],
        row i under the law's penalties and grammar given ids[:start + i] (a RequestLaw,
        gate.core.law.Law.bind, where the law has them)."""
        return law_probs(self.target_logits(ids, start), law, ids, start)
