"""Raw material for the exactness tests, computed from tensors and records: randomized PIT
values, greedy divergences, the contexts worth a next-token test and the next-token counts
there. No verdicts: the tests, Holm's correction and decisions are in
gate.exactness.stats (and gate.exactness.verdict for the rules).

- Whole sequences: the randomized probability integral transform (PIT). With tokens
  ordered by target probability (descending, ties by id), a sampled token x gets
  u = F(x-) + V * p(x), V ~ U(0, 1). Under the null every u, across all positions, is
  i.i.d. U(0, 1) (Diebold, Gunther & Tay 1998; Czado, Gneiting & Held 2009 for the
  discrete case).
- One position sampled many times: counts of the sampled next tokens over the law's
  likeliest tokens, with the mass outside kept apart (sparse_counts).
"""

from __future__ import annotations

import torch

from gate.records import Divergence, NextTokenCounts


def randomized_pit(probs: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """PIT values u [T] of `tokens` [T] under target laws `probs` [T, V].

    Tokens are ranked by descending probability (ties by ascending id); u = F(x-) + V p(x)
    with V ~ U(0, 1) from `generator`. A token outside the support (p(x) = 0) yields u = NaN:
    it is impossible under the law and must be reported as such (see gate.exactness.stats.pit_test)."""
    probs = probs.float()
    px = probs.gather(-1, tokens[:, None])  # [T, 1]
    ids = torch.arange(probs.shape[-1], device=probs.device)
    # F(x-): the mass of tokens ranked before x (more likely, or as likely with a lower id);
    # the same order as a stable descending sort, without sorting the vocabulary
    before = (probs > px) | ((probs == px) & (ids < tokens[:, None]))
    f_before = (probs * before).sum(-1)
    px = px.squeeze(-1)
    v = torch.rand(tokens.shape[0], generator=generator, device=probs.device)
    u = (f_before + v * px).clamp(0.0, 1.0)
    return torch.where(px > 0, u, torch.full_like(u, float("nan")))


def greedy_divergences(
    logits: torch.Tensor, tokens: list[int], prompt_id: str, repetition: int | None = None
) -> list[Divergence]:
    """Every position where `tokens` [T] is not the argmax of teacher-forced target `logits`
    [T, V] (row i given the prefix before token i), with how far below the top logit the
    committed token is; `repetition`: the request's, kept on each divergence."""
    logits = logits.float()
    top, argmax = logits.max(dim=-1)
    chosen = logits.gather(-1, torch.tensor(tokens, device=logits.device)[:, None]).squeeze(-1)
    out = []
    for i in (argmax.cpu() != torch.tensor(tokens)).nonzero().flatten().tolist():
        out.append(Divergence(prompt_id, i, int(argmax[i]), tokens[i], float(top[i] - chosen[i]), repetition))
    return out


def contexts(
    outputs: list[list[int]], min_first: int = 20, min_later: int = 50, max_later: int = 8, max_depth: int = 8
) -> list[tuple[tuple[int, ...], list[int]]]:
    """The contexts of one prompt worth a next-token test, from outputs sampled from it
    under one law: (output prefix, the next tokens of every output that continues it).

    The first position (prefix ()) is kept with at least `min_first` outputs: its test is a
    claim. Later positions are kept where at least `min_later` outputs share a prefix of
    1..max_depth - 1 tokens (the `max_later` most shared, ties by prefix): given the
    prefix, an exact sampler draws the next token from the target's law there, so these
    tests are valid (evidence) and reach the correction and bonus positions of a step that
    a first-token test never sees. Deterministic: sorted by (-count, prefix)."""
    nexts: dict[tuple[int, ...], list[int]] = {}
    for out in outputs:
        for j in range(min(len(out), max_depth)):
            nexts.setdefault(tuple(out[:j]), []).append(out[j])
    first = nexts.pop((), [])
    later = sorted(((k, v) for k, v in nexts.items() if len(v) >= min_later), key=lambda kv: (-len(kv[1]), kv[0]))
    return ([((), first)] if len(first) >= min_first else []) + later[:max_later]


def sparse_counts(
    prompt_id: str,
    tokens: list[int],
    p: torch.Tensor,
    mass: float = 1.0 - 1e-6,
    max_support: int = 4096,
    prefix: tuple[int, ...] | list[int] = (),
) -> NextTokenCounts:
    """Counts of sampled tokens [n] over the law `p` [V]'s likeliest tokens (covering
    `mass`), at the context `prefix` (output tokens before the tested position)."""
    probs, ids = torch.sort(p.float(), descending=True)
    keep = int(min(int((torch.cumsum(probs, 0) < mass).sum()) + 1, max_support, int((probs > 0).sum())))
    support = ids[:keep].tolist()
    index = {t: i for i, t in enumerate(support)}
    counts = [0] * keep
    rest = zero = 0
    for t in tokens:
        if t in index:
            counts[index[t]] += 1
        elif float(p[t]) > 0:
            rest += 1
        else:
            zero += 1
    support_probs = probs[:keep].tolist()
    return NextTokenCounts(
        prompt_id, support, support_probs, max(0.0, 1.0 - sum(support_probs)), counts, rest, zero, list(prefix)
    )
