"""A batched, seeded reference speculative sampler (Leviathan et al. 2023, Algorithm 1;
Chen et al. 2023) with faults that can be injected for testing the exactness tests
(mutation testing). Never used to measure a draft.

The target and the draft are given as logit functions (LogitFn): the raw logits of the
token at given output positions, given every output token before it (and a fixed prompt).
`table_logits` wraps explicit position-dependent tables [positions, V] (the raw logits are
then independent of the prefix); `model_logits` wraps a causal LM and a prompt (the law
depends on the whole prefix, as in real decoding).

The whole declared law applies to p and q (gate.core.law.process, vLLM's order by default):
with penalties, each position's law is processed with that sequence's history, the
`prompt` given to speculative_sample plus the output so far, the proposals before the
position included (as vLLM's rejection sampler appends the draft tokens to the output
before it penalises the target's logits); with a `grammar` (GrammarFn), the tokens it
allows after that output prefix. `position_law` computes that law for any batch of
prefixes, so a test can judge samples against the exact target law at every position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from enum import Enum

import torch

from gate.core.law import Law, process


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
    PENALTY_DRAFT_ONLY = "penalty_draft_only"  # penalties applied to q; the verifier's p is unpenalised
    PENALTY_STALE_HISTORY = "penalty_stale_history"  # p penalised on the prefix committed before the block
    MIN_P_DRAFT_ONLY = "min_p_draft_only"  # min-p applied to q; the verifier's p has none
    GRAMMAR_DRAFT_ONLY = "grammar_draft_only"  # grammar mask applied to q; the verifier's p is unmasked
    ACCEPT_ALL = "accept_all"  # every proposal accepted (a relaxed, synthetic acceptance): the output follows q


LAW_PRESERVING = {Fault.NONE, Fault.BONUS_SKIPPED}
"""Faults that keep the output law exact (BONUS_SKIPPED only loses throughput)."""

LAW_PART_FAULTS: dict[Fault, str] = {
    Fault.PENALTY_DRAFT_ONLY: "a penalty",
    Fault.PENALTY_STALE_HISTORY: "a penalty",
    Fault.MIN_P_DRAFT_ONLY: "min_p",
    Fault.GRAMMAR_DRAFT_ONLY: "a grammar",
}
"""Faults in one part of the declared law, and the part: speculative_sample refuses them
under a law (or without a grammar) that lacks it, where they would change nothing. Each
removes its part from the verifier's p only, and the output follows p, so each changes the
output law wherever that part changes p (PENALTY_STALE_HISTORY: at the positions after the
first of a block whose history the earlier proposals change; never at the first output
position, which always starts a block)."""

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

GrammarFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(tokens [B, W], at [B, k], as for LogitFn) -> bool [B, k, V]: the tokens a grammar allows
at each output position given the output tokens[:, :at] before it."""


def table_logits(table: torch.Tensor) -> LogitFn:
    """Position-dependent logits that ignore the prefix: row t of `table` [T, V] at position t."""
    return lambda tokens, at: table[at.clamp(max=table.shape[0] - 1)]


def model_logits(model: torch.nn.Module, prompt: list[int]) -> LogitFn:
    """A causal LM's logits after `prompt` + the output prefix. One forward over the batch
    per call; right padding is harmless since position i only attends to tokens <= i.
    (For a law with a penalty, give speculative_sample the same prompt.)"""
    head = torch.tensor(prompt, dtype=torch.long)

    @torch.no_grad()
    def fn(tokens: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        width = int(at.max())
        ids = torch.cat([head.expand(tokens.shape[0], -1), tokens[:, :width]], dim=1)
        logits = model(input_ids=ids).logits.float()  # [B, P + width, V]
        rows = len(prompt) + at - 1  # the row predicting output position `at`
        return logits[torch.arange(tokens.shape[0])[:, None], rows]

    return fn


def history(
    tokens: torch.Tensor, at: torch.Tensor, prompt: Sequence[int] | torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The penalties' history of each output position: (seen bool [B, k, V], the token
    occurs in `prompt` or in tokens[b, :at[b, j]]; output_counts float32 [B, k, V], its
    occurrences in tokens[b, :at[b, j]]), for tokens [B, W] and at [B, k] as for LogitFn.
    One scatter_add over the batch; ids outside the vocabulary are ignored."""
    B, W = tokens.shape
    before = (torch.arange(W) < at[..., None]) & (tokens[:, None, :] >= 0) & (tokens[:, None, :] < vocab_size)
    index = tokens.clamp(0, vocab_size - 1)[:, None, :].expand(B, at.shape[1], W)
    counts = torch.zeros(B, at.shape[1], vocab_size).scatter_add_(-1, index, before.float())
    seen = counts > 0
    head = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
    head = head[(head >= 0) & (head < vocab_size)]
    if head.numel():
        in_prompt = torch.zeros(vocab_size, dtype=torch.bool)
        in_prompt[head] = True
        seen = seen | in_prompt
    return seen, counts


def position_law(
    logits: torch.Tensor,
    law: Law,
    tokens: torch.Tensor,
    at: torch.Tensor,
    prompt: Sequence[int] | torch.Tensor = (),
    grammar: GrammarFn | None = None,
    history_at: torch.Tensor | None = None,
) -> torch.Tensor:
    """`law` at output positions at [B, k] of the sequences tokens [B, W] (after `prompt`):
    probabilities [B, k, V] from the raw logits [B, k, V] there, each row processed with
    its own history (gate.core.law.process) and masked by `grammar` after its output prefix.
    `history_at` (default `at`) is where the history ends: earlier only for a fault."""
    seen = counts = allowed = None
    if law.needs_history:
        seen, counts = history(tokens, at if history_at is None else history_at, prompt, logits.shape[-1])
    if grammar is not None:
        allowed = grammar(tokens, at)
    return process(logits, law, seen, counts, allowed)


def fault_applies(fault: Fault, law: Law, grammar: GrammarFn | None = None) -> bool:
    """False for a fault in a part of the law (LAW_PART_FAULTS) that `law` and `grammar` lack,
    where it would change nothing; True for every other fault."""
    part = LAW_PART_FAULTS.get(fault)
    present = {
        "a penalty": law.needs_history,
        "min_p": bool(law.min_p) and not law.greedy,
        "a grammar": grammar is not None,
    }
    return part is None or present[part]


def speculative_sample(
    target_logits: torch.Tensor | LogitFn,
    draft_logits: torch.Tensor | LogitFn,
    law: Law,
    num_draft_tokens: int,
    batch: int,
    length: int,
    generator: torch.Generator,
    fault: Fault = Fault.NONE,
    prompt: Sequence[int] | torch.Tensor = (),
    grammar: GrammarFn | None = None,
) -> torch.Tensor:
    """Generate `batch` sequences of `length` tokens by speculative sampling: [batch, length].

    target_logits, draft_logits: tables [length + num_draft_tokens + 1, V] (position
    dependent) or LogitFns. `prompt`: the ids before the output, for the repetition
    penalty's history (a LogitFn conditions on its own prompt). `grammar`: a mask on the
    output (None: unconstrained). The draft proposes num_draft_tokens tokens one at a time,
    each under the law with its history; the target scores them and the bonus position
    together, each row with the history up to it (the proposals before it included), then
    the rejection rule accepts a prefix and draws the correction or bonus token. With fault
    NONE or BONUS_SKIPPED the token at every position follows the law of the target's
    logits given the prefix exactly. Raises ValueError for a fault in a part of the law
    (LAW_PART_FAULTS) that the law lacks.
    """
    if not fault_applies(fault, law, grammar):
        raise ValueError(
            f"fault {fault.value} needs {LAW_PART_FAULTS[fault]} in the law; law {law.name!r} has none, "
            "so it would change nothing"
        )
    gamma = num_draft_tokens
    target = table_logits(target_logits) if isinstance(target_logits, torch.Tensor) else target_logits
    draft = table_logits(draft_logits) if isinstance(draft_logits, torch.Tensor) else draft_logits
    # the verifier's law and the parts of it that a fault takes away from p
    p_law = law
    if fault is Fault.PENALTY_DRAFT_ONLY:
        p_law = replace(law, repetition_penalty=None, presence_penalty=None, frequency_penalty=None)
    elif fault is Fault.MIN_P_DRAFT_ONLY:
        p_law = replace(law, min_p=None)
    p_grammar = None if fault is Fault.GRAMMAR_DRAFT_ONLY else grammar

    def q_law(tokens: torch.Tensor, at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q under the law, raw q) at positions at [B, k]."""
        lg = draft(tokens, at)
        return position_law(lg, law, tokens, at, prompt, grammar), process(lg, _RAW)

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
            qj, qj_raw = q_law(buf, at[:, j : j + 1])
            q_all.append(qj[:, 0])
            q_raw.append(qj_raw[:, 0])
            xj = _categorical(q_raw[-1] if fault is Fault.LAW_ONLY_IN_RATIO else q_all[-1], generator)
            buf[rows, at[:, j]] = xj
            x.append(xj)
        xs = torch.stack(x, dim=1)  # [B, gamma]
        lg_p = target(buf, at)  # [B, gamma + 1, V]
        stale = base[:, None].expand_as(at) if fault is Fault.PENALTY_STALE_HISTORY else None
        p_all, p_raw = position_law(lg_p, p_law, buf, at, prompt, p_grammar, stale), process(lg_p, _RAW)
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
        elif fault is Fault.ACCEPT_ALL:
            accept = torch.ones_like(px, dtype=torch.bool)
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
            bonus_law = q_law(buf, at[:, gamma:])[0][:, 0]
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


def toy_grammar(vocab_size: int) -> GrammarFn:
    """A synthetic grammar whose mask depends on the output prefix, for mutation tests:
    the output starts with an even id; after token a, the ids a + 1 and a + 2 (mod V) are
    forbidden; the last id V - 1 is allowed only after an odd number of 0s in the output so
    far. At least two ids stay allowed at every position for V >= 4 (half the ids at the
    first, V - 3 or more later), so the law under it is never trivial."""
    if vocab_size < 4:
        raise ValueError(f"toy_grammar needs a vocabulary of at least 4 ids, got {vocab_size}")
    ids = torch.arange(vocab_size)

    def allowed(tokens: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        prev = tokens.gather(1, (at - 1).clamp(min=0))[..., None]  # [B, k, 1]
        step = (ids - prev) % vocab_size
        mask = torch.where((at == 0)[..., None], ids % 2 == 0, (step != 1) & (step != 2))
        zeros = ((torch.arange(tokens.shape[1]) < at[..., None]) & (tokens[:, None, :] == 0)).sum(-1)  # [B, k]
        mask[..., vocab_size - 1] &= zeros % 2 == 1
        return mask

    return allowed
