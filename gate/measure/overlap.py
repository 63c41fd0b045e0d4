"""Proposal overlap sum_x min(p(x), q(x)) along continuations the target generated.

beta = sum_x min(p(x), q(x)) = 1 - TV(p, q) is the probability that speculative sampling
accepts a proposal at that position (Leviathan et al. 2023, Sec. 3.1, "beta"); its mean
over positions is the acceptance rate alpha. Both p and q are processed by the declared
law exactly as the verifier does (gate.core.law.law_probs). For a point mass at x it is p(x).
"""

from __future__ import annotations

import torch

from gate.core.law import argmax


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_x min(p, q) over the last axis: [..., V] x [..., V] -> [...]. 1 for equal laws, 0 for disjoint ones."""
    return torch.minimum(p, q).sum(dim=-1)


def position_overlaps(p: torch.Tensor, q: torch.Tensor) -> tuple[list[float | None], list[bool | None]]:
    """Per-position overlap and top-1 agreement for target p [T, V] and draft q [T, V].

    A q row that is all zeros means the draft proposed nothing there (prompt lookup
    without a match): both entries are None. For one-hot q (a point mass at x), the
    overlap is p(x), the acceptance probability of x.
    """
    values = overlap(p, q)
    proposed = q.sum(dim=-1) > 0
    agree = argmax(p) == argmax(q)
    ov: list[float | None] = []
    top1: list[bool | None] = []
    for v, has, a in zip(values.tolist(), proposed.tolist(), agree.tolist(), strict=False):
        ov.append(min(1.0, max(0.0, v)) if has else None)
        top1.append(bool(a) if has else None)
    return ov, top1
