"""Context-length sweeps: prompts that reach a requested number of tokens with real text.

For a question (a selected prompt) and a length L in tokens, gate puts real text from the
same source before the question until the prompt, exactly as the target sees it (chat
template included), is L tokens or at most TOLERANCE_TOKENS fewer:

1. whole exchanges of other prompts of the source, the nearest to the question first: a
   user turn with the prompt's text and, where the source has one, an assistant turn with
   its real answer (ShareGPT's gpt turn, MT-bench's reference answer, HumanEval's canonical
   solution). Prompts without an answer join the next user turn as documents, so turns
   alternate and strict chat templates accept the history;
2. then the end of the next real text, cut at a token boundary, at the very start of the
   first user turn (as a chat front end drops the oldest history first).

Never padding tokens, never the question repeated; the prompt still ends with the
question. The history's order is seeded per question and the same at every length, so a
longer context extends a shorter one further back. A question that alone is longer than L
is left out at that length. The category stays the question's own.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.core.errors import PolicyValueError
from gate.workloads.interface import Prompt

TOLERANCE_TOKENS = 4
SEPARATOR = "\n\n"
Encode = Callable[[list[dict[str, str]]], list[int]]  # messages -> the token ids the target is fed


class ContextError(ValueError):
    """The source has too little text to build the requested length."""


@dataclass(frozen=True)
class ContextPrompt:
    """A built prompt: `prompt.id` is '<question id>@<length>', `token_ids` has
    length - TOLERANCE_TOKENS <= len <= length tokens."""

    prompt: Prompt
    token_ids: list[int]
    context_length: int


@dataclass(frozen=True)
class _Rendered:
    messages: list[dict[str, str]]
    ids: list[int]


def _text(p: Prompt) -> str:
    return SEPARATOR.join(m["content"] for m in p.messages if m["role"] != "system")


def _full_text(p: Prompt) -> str:
    return _text(p) + (SEPARATOR + p.reply if p.reply else "")


def messages_with_history(question: Prompt, history: list[Prompt], head: str) -> list[dict[str, str]]:
    """The question's messages with `history` (oldest first) and `head` (cut real text at
    the very start) before its first non-system turn. See the module docstring."""
    turns: list[dict[str, str]] = []
    docs = [head] if head else []
    for p in history:
        docs.append(_text(p))
        if p.reply is not None:
            turns += [{"role": "user", "content": SEPARATOR.join(docs)}, {"role": "assistant", "content": p.reply}]
            docs = []
    q = [dict(m) for m in question.messages]
    lead = next((i for i, m in enumerate(q) if m["role"] != "system"), len(q))
    rest = q[lead:]
    if docs:
        if rest and rest[0]["role"] == "user":
            rest[0] = {"role": "user", "content": SEPARATOR.join(docs + [rest[0]["content"]])}
        else:
            rest.insert(0, {"role": "user", "content": SEPARATOR.join(docs)})
    return q[:lead] + turns + rest


class ContextBuilder:
    """Builds context-length prompts for questions from a pool of the source's prompts.

    `tokenizer` is the target's (its raw encode and decode cut the head text); `encode`
    turns messages into the ids the target is fed (chat template or plain text), so the
    length counted is the length run. `seed` fixes each question's history order."""

    def __init__(self, pool: list[Prompt], tokenizer: Any, encode: Encode, seed: int):
        self.pool = pool
        self.tokenizer = tokenizer
        self.encode = encode
        self.seed = seed
        self._ids: dict[int, list[int]] = {}
        self._orders: dict[str, list[int]] = {}
        self._separator = self._raw(SEPARATOR)

    def _raw(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _unit_ids(self, i: int) -> list[int]:
        if i not in self._ids:
            self._ids[i] = self._raw(_full_text(self.pool[i]))
        return self._ids[i]

    def _order(self, question: Prompt) -> list[int]:
        if question.id not in self._orders:
            order = [i for i, p in enumerate(self.pool) if p.id != question.id]
            random.Random(f"{self.seed}|context|{question.id}").shuffle(order)
            self._orders[question.id] = order
        return self._orders[question.id]

    def build(self, question: Prompt, length: int) -> ContextPrompt | None:
        """The question at `length` tokens; None when the question alone is longer.
        Raises ContextError when the pool's text runs out first."""
        order = self._order(question)

        def render(j: int, head: str) -> _Rendered:
            messages = messages_with_history(question, [self.pool[i] for i in reversed(order[:j])], head)
            return _Rendered(messages, self.encode(messages))

        best = render(0, "")
        if len(best.ids) > length:
            return None
        # Whole units: the largest j whose history fits (the units' own token counts bound it).
        bound, total = 0, len(best.ids)
        while bound < len(order) and total <= length:
            total += len(self._unit_ids(order[bound]))
            bound += 1
        lo, hi = 0, bound
        while lo < hi:
            mid = (lo + hi + 1) // 2
            trial = render(mid, "")
            if len(trial.ids) <= length:
                lo, best = mid, trial
            else:
                hi = mid - 1
        if len(best.ids) < length:
            best = self._fill(length, best, order[lo:], lambda head: render(lo, head))
        if length - len(best.ids) > TOLERANCE_TOKENS:
            raise ContextError(f"the source's text runs out at {len(best.ids)} tokens for prompt {question.id!r}")
        return ContextPrompt(
            Prompt(f"{question.id}@{length}", question.category, best.messages, question.reply), best.ids, length
        )

    def _fill(self, length: int, best: _Rendered, rest: list[int], render: Callable[[str], _Rendered]) -> _Rendered:
        """Put the end of the next real text, cut at a token boundary, before the history so
        the prompt lands at `length` tokens or just under it (secant steps, then bisection)."""
        need = length - len(best.ids)
        tail: list[int] = []
        for i in rest:  # the nearest unit ends the text, older ones come before it
            tail = self._unit_ids(i) + (self._separator + tail if tail else [])
            if len(tail) >= need + 8:
                break
        if not tail:
            return best

        def at(k: int) -> _Rendered:
            return render(self.tokenizer.decode(tail[-k:], skip_special_tokens=True).lstrip("\ufffd"))

        fits, over = 0, len(tail) + 1
        tried: set[int] = set()
        k = min(need, len(tail))
        for _ in range(6):
            if k in tried:
                break
            tried.add(k)
            trial = at(k)
            if len(trial.ids) <= length:
                fits = max(fits, k)
                best = trial if len(trial.ids) > len(best.ids) else best
                if len(trial.ids) == length:
                    return best
            else:
                over = min(over, k)
            k = max(1, min(len(tail), k + length - len(trial.ids)))
        while over - fits > 1 and len(best.ids) < length:
            k = (fits + over) // 2
            trial = at(k)
            if len(trial.ids) <= length:
                fits = k
                best = trial if len(trial.ids) > len(best.ids) else best
            else:
                over = k
        return best


def check_fits(lengths: list[int], max_new_tokens: int, num_draft_tokens: int, config: Any) -> None:
    """Every requested context length plus the longest max_new_tokens must fit the target's
    positions (config.max_position_embeddings). A sliding window bounds nothing: gate's loop
    rolls sliding-window layers back past their window (gate.models.cache.record_past).
    Raises PolicyValueError at workload.context_lengths[i]."""
    limit = getattr(config, "max_position_embeddings", None)
    for i, length in enumerate(lengths):
        need = length + max_new_tokens
        where = f"workload.context_lengths[{i}]"
        if limit and need > limit:
            raise PolicyValueError(
                where,
                f"context length {length} does not fit the target: with max_new_tokens {max_new_tokens} "
                f"it needs {need} positions and the target has {limit} (max_position_embeddings); "
                f"the longest context that fits is {limit - max_new_tokens} tokens",
            )
