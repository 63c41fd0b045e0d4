"""A draft that is a language model: a separate model, the target's weights at another
dtype or quantization, or (via early_exit.py) a truncated view of the target."""

from __future__ import annotations

from typing import Any

import torch

from gate.drafts.interface import Draft, Proposal
from gate.law import Law, law_probs
from gate.models.cache import cache_tensor_bytes, crop_to, forward, new_cache
from gate.speculative import sample


class ModelDraft(Draft):
    """Autoregressive proposals from a causal LM with its own KV cache.

    q at each proposal is the draft's next-token distribution processed by the declared
    law (the same processing the verifier applies to p)."""

    probability_info = "distribution"

    def __init__(self, name: str, kind: str, model: torch.nn.Module, num_draft_tokens: int, device: torch.device,
                 vocab_size: int | None = None):
        self.name = name
        self.kind = kind
        self.model = model
        self.num_draft_tokens = num_draft_tokens
        self.device = device
        self.vocab_size = vocab_size  # the target's logits width; None: the draft's own
        self._cache: Any = None
        self._fed: list[int] = []

    def start(self) -> None:
        self._cache = new_cache(self.model.config)
        self._fed = []

    def propose(self, context: list[int], n: int, law: Law, generator: torch.Generator | None) -> Proposal:
        if self._cache is None:
            self.start()
        keep = _common_prefix(self._fed, context)
        keep = min(keep, len(context) - 1)  # at least one token to feed for fresh logits
        if keep < len(self._fed):
            crop_to(self._cache, keep)
            self._fed = self._fed[:keep]
        new = context[keep:]
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for _ in range(n):
            logits = forward(self.model, torch.tensor([new], device=self.device), self._cache, 1)
            self._fed += new
            q = law_probs(self._aligned(logits[0, -1]), law)
            x = sample(q, generator)
            tokens.append(x)
            qs.append(q)
            new = [x]
        return Proposal(torch.tensor(tokens, device=self.device, dtype=torch.long), torch.stack(qs) if qs else torch.empty(0))

    def teacher_forced(self, ids: list[int], start: int, law: Law, vocab_size: int) -> torch.Tensor:
        logits = forward(self.model, torch.tensor([ids[:-1]], device=self.device))[0]
        return law_probs(self._aligned(logits[start - 1:]), law)

    def _aligned(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [..., V_draft] on the target's vocabulary [..., V_target]: padded ids a
        model has beyond the shared tokenizer are dropped, missing ones get -inf (q = 0)."""
        v = self.vocab_size
        if v is None or logits.shape[-1] == v:
            return logits
        if logits.shape[-1] > v:
            return logits[..., :v]
        pad = torch.full((*logits.shape[:-1], v - logits.shape[-1]), float("-inf"), dtype=logits.dtype, device=logits.device)
        return torch.cat([logits, pad], dim=-1)

    def cache_bytes(self) -> int:
        return cache_tensor_bytes(self._cache)

    def modules(self) -> list[torch.nn.Module]:
        return [self.model]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
