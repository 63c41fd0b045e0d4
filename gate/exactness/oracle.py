"""The target oracle: the target model run locally to score tokens by teacher forcing.

Overlap, exactness (greedy divergences, PIT, next-token laws) and `gate exactness` on
recorded samples need the target's logits at given positions, whatever runner produced
the tokens. The oracle is the target loaded in this process (for the in-process
transformers runner, the very model the runner serves: no second copy). It is optional
where the user has no local copy of the target: the checks that need it then cannot be
made (nothing more is built for that case yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gate.constraints import bind
from gate.constraints.interface import GrammarEngine, ResponseFormat
from gate.core.law import AnyLaw, Law, RequestLaw, law_probs
from gate.models.cache import forward


class TargetOracle:
    """Teacher-forced logits of a transformers causal LM (`model`, on `device`), and the
    declared law bound to a request the way every exactness path binds it (`grammars`: the
    engine that compiles a request's response format on the target's tokenizer; None: a
    constrained request cannot be scored)."""

    def __init__(self, model: Any, device: torch.device, grammars: GrammarEngine | None = None) -> None:
        self.model = model  # a transformers causal LM
        self.device = device
        self.grammars = grammars
        head = model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)

    def bind(self, law: Law, prompt_len: int, fmt: ResponseFormat | None = None) -> RequestLaw:
        """`law` bound to one request: its prompt length (penalties) and a fresh matcher of its
        response format `fmt`, if any (grammar; gate.constraints.bind). Raises ValueError when
        the format does not compile, or there is no grammar engine for it."""
        bound: RequestLaw = bind(law, prompt_len, fmt, self.grammars)
        return bound

    def next_token_law(
        self, prompt_ids: Sequence[int], prefix: Sequence[int], law: Law, fmt: ResponseFormat | None = None
    ) -> torch.Tensor:
        """The target's law [V] (float32, on the oracle's device) of the output token after
        `prompt_ids` + `prefix` (the output so far), under `law` bound to the prompt
        (bind): the one-sample reference of every next-token test, whatever produced the
        samples. Raises ValueError as bind does."""
        ids = list(prompt_ids) + list(prefix)
        # teacher forcing scores the tokens after a prefix: a placeholder last token makes the
        # row of the position after the output (its value is never read)
        probs = self.target_probs(ids + [0], len(prompt_ids), self.bind(law, len(prompt_ids), fmt))
        return probs[-1]

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
