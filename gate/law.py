"""The declared sampling law, applied to logits exactly as the verifier applies it.

The same function processes the target's logits (p) and the draft's logits (q): overlap
and exactness are only meaningful under the law the verifier actually applies to both
(PRIMER, "Formulas"). Order and tie handling follow Hugging Face's logits warpers:
temperature, then top-k (ties at the k-th value kept), then top-p (the smallest set of
most likely tokens whose probability reaches top_p; at least one token kept).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Law:
    """A target sampling law. temperature 0 means greedy (argmax, ties to the lowest id)."""

    name: str
    temperature: float
    top_k: int | None = None
    top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def law_probs(logits: torch.Tensor, law: Law) -> torch.Tensor:
    """Probabilities under `law` for logits of shape [..., V]; returns float32 [..., V].

    Greedy gives a one-hot vector at the argmax. The computation is done in float32
    whatever the logits' dtype, as samplers do (the wider dtype counted in the bill).
    """
    x = logits.float()
    if law.greedy:
        return torch.nn.functional.one_hot(x.argmax(dim=-1), x.shape[-1]).float()
    x = x / law.temperature
    if law.top_k is not None and law.top_k < x.shape[-1]:
        kth = torch.topk(x, law.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if law.top_p is not None and law.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=False)
        cumulative = sorted_x.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1.0 - law.top_p)
        drop_sorted[..., -1] = False  # keep at least the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x.softmax(dim=-1)
