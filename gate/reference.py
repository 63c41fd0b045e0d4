"""A batched, seeded reference speculative sampler (Leviathan et al. 2023, Algorithm 1;
Chen et al. 2023) with faults that can be injected for testing the exactness tests
(mutation testing). Never used to measure a draft.

The target and the draft are given as logit functions (LogitFn): the raw logits of the
token at given output positions, given every output token before it (and a fixed prompt).
`table_logits` wraps explicit position-dependent tables [positions, V] (the law is then
independent of the prefix); `model_logits` wraps a causal LM and a prompt (the law depends
on the whole prefix, as in real decoding).
"""

from __future__ import annotations

from enum import Enum
from typing import Callable

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


LogitFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(tokens [B, W] output tokens so far, right-padded with anything; at [B, k] output
positions) -> raw logits [B, k, V] of the token at each position given tokens[:, :at]."""


def table_logits(table: torch.Tensor) -> LogitFn:
    """Position-dependent logits that ignore the prefix: row t of `table` [T, V] at position t."""
    return lambda tokens, at: table[at.clamp(max=table.shape[0] - 1)]


def model_logits(model: torch.nn.Module, prompt: list[int]) -> LogitFn:
    """A causal LM's logits after `prompt` + the output prefix. One forward over the batch
    per call; right padding is harmless since position i only attends to tokens <= i."""
    head = torch.tensor(prompt, dtype=torch.long)

    @torch.no_grad()
    def fn(tokens: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        width = int(at.max())
        ids = torch.cat([head.expand(tokens.shape[0], -1), tokens[:, :width]], dim=1)
        logits = model(input_ids=ids).logits.float()  # [B, P + width, V]
        rows = len(prompt) + at - 1  # the row predicting output position `at`
        return logits[torch.arange(tokens.shape[0])[:, None], rows]

    return fn


def speculative_sample(target_logits: torch.Tensor | LogitFn, draft_logits: torch.Tensor | LogitFn, law: Law,
                       num_draft_tokens: int, batch: int, length: int, generator: torch.Generator,
                       fault: Fault = Fault.NONE) -> torch.Tensor:
    """Generate `batch` sequences of `length` tokens by speculative sampling: [batch, length].

    target_logits, draft_logits: tables [length + num_draft_tokens + 1, V] (position
    dependent) or LogitFns. The draft proposes num_draft_tokens tokens one at a time, the
    target scores them and the bonus position together, then the rejection rule accepts a
    prefix and draws the correction or bonus token. With fault NONE or BONUS_SKIPPED the
    token at every position follows law(target logits given the prefix) exactly.
    """
    gamma = num_draft_tokens
    target = table_logits(target_logits) if isinstance(target_logits, torch.Tensor) else target_logits
    draft = table_logits(draft_logits) if isinstance(draft_logits, torch.Tensor) else draft_logits
    width = length + gamma + 1
    buf = torch.zeros((batch, width + 1), dtype=torch.long)  # committed tokens, then the current proposals
    out = torch.full((batch, length), -1, dtype=torch.long)
    pos = torch.zeros(batch, dtype=torch.long)
    rows = torch.arange(batch)
    while bool((pos < length).any()):
        base = pos.clamp(max=length - 1)  # finished rows compute alongside, their results unused
        at = base[:, None] + torch.arange(gamma + 1)  # [B, gamma + 1]: proposals, then the bonus position
        q_all, q_raw, x = [], [], []
        for j in range(gamma):
            lg = draft(buf, at[:, j:j + 1])[:, 0]
            q_all.append(law_probs(lg, law))
            q_raw.append(law_probs(lg, _RAW))
            xj = _categorical(q_raw[-1] if fault is Fault.LAW_ONLY_IN_RATIO else q_all[-1], generator)
            buf[rows, at[:, j]] = xj
            x.append(xj)
        xs = torch.stack(x, dim=1)  # [B, gamma]
        lg_p = target(buf, at)  # [B, gamma + 1, V]
        p_all, p_raw = law_probs(lg_p, law), law_probs(lg_p, _RAW)
        q_v_all, q_v_raw = torch.stack(q_all, dim=1), torch.stack(q_raw, dim=1)
        if fault is Fault.LAW_NOT_IN_RATIO:
            p_v, q_v = p_raw[:, :gamma], q_v_raw
        elif fault is Fault.WRONG_POSITION:
            p_v, q_v = p_all[:, 1:], q_v_all
        else:
            p_v, q_v = p_all[:, :gamma], q_v_all
        px = p_v.gather(-1, xs[..., None]).squeeze(-1)
        qx = q_v.gather(-1, xs[..., None]).squeeze(-1)
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
        if fault is Fault.BONUS_FROM_DRAFT:
            bonus_law = law_probs(draft(buf, at[:, gamma:])[:, 0], law)
        else:
            bonus_law = p_all[:, gamma]
        bonus = _categorical(bonus_law, generator)
        # commit: the accepted proposals, then the correction (after a rejection) or the bonus
        block = torch.cat([xs, torch.zeros(batch, 1, dtype=torch.long)], dim=1)  # [B, gamma + 1]
        block[rows, n_acc] = torch.where(full, bonus, fix)
        count = n_acc + (~full | (fault is not Fault.BONUS_SKIPPED)).long()
        count = torch.minimum(count, (length - pos).clamp_min(0))  # finished rows commit nothing
        for j in range(gamma + 1):
            take = j < count
            out[rows[take], pos[take] + j] = block[take, j]
            buf[rows[take], pos[take] + j] = block[take, j]
        pos = pos + count
    return out
