"""A batched, seeded reference speculative sampler (Leviathan et al. 2023, Algorithm 1;
Chen et al. 2023) over explicit position-dependent distributions, with faults that can be
injected for testing the exactness tests (mutation testing). Never used to measure a draft.

The target's logits at absolute output position t are `target_logits[t]` [V] and the
draft's `draft_logits[t]`; both laws are independent of the prefix, so under the null the
tokens at different positions are independent draws from law(target_logits[t]).
"""

from __future__ import annotations

from enum import Enum

import torch

from gate.law import Law, law_probs


class Fault(str, Enum):
    """Known implementation faults (PRIMER, "Testing exactness against the target law")."""

    NONE = "none"
    LAW_NOT_IN_RATIO = "law_not_in_ratio"  # draft samples under the law, verifier uses raw p/q
    LAW_ONLY_IN_RATIO = "law_only_in_ratio"  # draft samples raw q, verifier uses the law
    RESIDUAL_NOT_NORMALIZED = "residual_not_normalized"  # inverse-CDF on max(0, p - q) without 1/Z
    RESIDUAL_IS_P = "residual_is_p"  # resample from p instead of norm(max(0, p - q))
    BONUS_FROM_DRAFT = "bonus_from_draft"  # bonus token drawn from q instead of p
    BONUS_SKIPPED = "bonus_skipped"  # no bonus token: exact law, only lost throughput
    WRONG_POSITION = "wrong_position"  # draft token i judged by the target law of position i + 1
    DETERMINISTIC_ACCEPTANCE = "deterministic_acceptance"  # accept iff p(x) >= q(x)
    REUSED_UNIFORM = "reused_uniform"  # the acceptance uniform also drives residual resampling
    TYPICAL_ACCEPTANCE = "typical_acceptance"  # lossy: accept if p(x) > min(eps, delta exp(-H(p)))


LAW_PRESERVING = {Fault.NONE, Fault.BONUS_SKIPPED}
_RAW = Law("raw", 1.0)


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids [B] whose cumulative weight first exceeds u [B] (weights [B, V], not
    renormalised: mass missing from the total lands on the last token)."""
    cdf = torch.cumsum(weights, dim=-1)
    idx = torch.searchsorted(cdf, u[:, None], right=True).squeeze(-1)
    return idx.clamp(max=weights.shape[-1] - 1)


def _categorical(probs: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=g).squeeze(-1)


def speculative_sample(target_logits: torch.Tensor, draft_logits: torch.Tensor, law: Law, num_draft_tokens: int,
                       batch: int, length: int, generator: torch.Generator, fault: Fault = Fault.NONE) -> torch.Tensor:
    """Generate `batch` sequences of `length` tokens by speculative sampling: [batch, length].

    target_logits, draft_logits: [length + num_draft_tokens + 1, V] (position-dependent).
    With fault NONE or BONUS_SKIPPED the output at position t follows law(target_logits[t]).
    """
    gamma = num_draft_tokens
    p_all = law_probs(target_logits, law)
    q_all = law_probs(draft_logits, law)
    p_raw, q_raw = law_probs(target_logits, _RAW), law_probs(draft_logits, _RAW)
    out = torch.full((batch, length), -1, dtype=torch.long)
    pos = torch.zeros(batch, dtype=torch.long)
    rows = torch.arange(batch)
    offsets = torch.arange(gamma)
    while bool((pos < length).any()):
        at = pos[:, None] + offsets  # [B, gamma] positions of the proposals
        q = (q_raw if fault is Fault.LAW_ONLY_IN_RATIO else q_all)[at]  # what the draft samples from
        x = _categorical(q.reshape(-1, q.shape[-1]), generator).reshape(batch, gamma)
        if fault is Fault.LAW_NOT_IN_RATIO:
            p_v, q_v = p_raw[at], q_raw[at]
        elif fault is Fault.WRONG_POSITION:
            p_v, q_v = p_all[at + 1], q_all[at]
        else:
            p_v, q_v = p_all[at], q_all[at]
        px = p_v.gather(-1, x[..., None]).squeeze(-1)
        qx = q_v.gather(-1, x[..., None]).squeeze(-1)
        u = torch.rand(batch, gamma, generator=generator)
        if fault is Fault.DETERMINISTIC_ACCEPTANCE:
            accept = px >= qx
        elif fault is Fault.TYPICAL_ACCEPTANCE:
            entropy = -(p_v * torch.log(p_v.clamp_min(1e-30))).sum(-1)
            accept = px > torch.minimum(torch.full_like(px, 0.09), 0.3 * torch.exp(-entropy))
        else:
            accept = u < torch.where(qx > 0, px / qx.clamp_min(1e-30), torch.zeros_like(px)).clamp(max=1.0)
        n_acc = torch.cumprod(accept.long(), dim=-1).sum(-1)  # [B] accepted prefix length
        full = n_acc == gamma
        k = n_acc.clamp(max=gamma - 1)
        p_k, q_k = p_v[rows, k], q_v[rows, k]
        residual = (p_k - q_k).clamp_min(0.0)
        if fault is Fault.RESIDUAL_IS_P:
            fix = _categorical(p_k, generator)
        elif fault is Fault.RESIDUAL_NOT_NORMALIZED:
            fix = _inverse_cdf(residual, torch.rand(batch, generator=generator))
        elif fault is Fault.REUSED_UNIFORM:
            z = residual.sum(-1, keepdim=True).clamp_min(1e-30)
            fix = _inverse_cdf(residual / z, u[rows, k])
        elif fault is Fault.TYPICAL_ACCEPTANCE:
            fix = _categorical(p_k, generator)
        else:
            z = residual.sum(-1, keepdim=True)
            fix = _categorical(torch.where(z > 0, residual / z.clamp_min(1e-30), p_k), generator)
        bonus_at = (pos + gamma).clamp(max=p_all.shape[0] - 1)
        bonus_law = q_all[bonus_at] if fault is Fault.BONUS_FROM_DRAFT else p_all[bonus_at]
        bonus = _categorical(bonus_law, generator)
        for b in range(batch):
            if pos[b] >= length:
                continue
            n = int(n_acc[b])
            tokens = x[b, :n].tolist()
            if not bool(full[b]):
                tokens.append(int(fix[b]))
            elif fault is not Fault.BONUS_SKIPPED:
                tokens.append(int(bonus[b]))
            start = int(pos[b])
            tokens = tokens[: length - start]
            out[b, start:start + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            pos[b] = start + len(tokens)
    return out
