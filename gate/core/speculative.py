"""Speculative sampling's verification step (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023).

Pure tensor math: given the target's processed distributions at n+1 positions and the
draft's n proposals with their distributions q, decide how many proposals are accepted
and which token follows. The output law equals p exactly (Leviathan et al. 2023, Thm 1).
A point-mass proposal (prompt lookup) is a one-hot q: accepted with probability p(x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification step: `accepted` proposals (0..n), then `next_token`
    (the residual correction when a proposal was rejected, else the bonus token)."""

    accepted: int
    next_token: int


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a probability vector [V] (already processed by the law)."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def verify(
    p: torch.Tensor,
    q: torch.Tensor,
    proposals: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Accept or reject `proposals` [n] drawn from `q` [n, V] against target `p` [n+1, V].

    p[i] is the target's law at the position of proposals[i]; p[n] is the bonus position.
    Proposal i is accepted with probability min(1, p_i(x) / q_i(x)); at the first
    rejection the next token is drawn from norm(max(0, p_i - q_i)) with a fresh uniform;
    if all are accepted, a bonus token is drawn from p[n] (Leviathan et al. 2023, Alg. 1).
    With one-hot p and q (greedy law) this is: accept while x equals argmax p.
    A residual that rounds to all zeros (p == q up to float error) falls back to p_i.
    """
    n = int(proposals.shape[0])
    if n:
        idx = torch.arange(n, device=p.device)
        px = p[idx, proposals]
        qx = q[idx, proposals]
        ratio = torch.where(qx > 0, px / qx.clamp_min(1e-30), torch.zeros_like(px)).clamp(max=1.0)
        u = torch.rand(n, generator=generator, device=p.device)
        rejected = (u >= ratio).nonzero()
        if rejected.numel():
            i = int(rejected[0].item())
            residual = (p[i] - q[i]).clamp_min(0.0)
            total = residual.sum()
            residual = residual / total if total > 0 else p[i]
            return Verdict(i, sample(residual, generator))
    return Verdict(n, sample(p[n], generator))
