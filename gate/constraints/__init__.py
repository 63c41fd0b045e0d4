"""Grammar constraints (structured output): a response format, and the engine that turns it
into a per-position mask over the target's vocabulary (gate.core.law applies it to p and q)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gate.constraints.interface import GrammarEngine, ResponseFormat


def grammar_engine(tokenizer: Any, vocab_size: int, eos_ids: Iterable[int] | None = None) -> GrammarEngine:
    """The grammar engine for a target's tokenizer and logits width (llguidance; its
    tokenizer is converted on first use, so an unconstrained run pays nothing). `eos_ids`: the
    ids that end the target's output, which a complete output allows (None: the tokenizer's
    EOS)."""
    from gate.constraints.llguidance import LLGuidanceEngine

    return LLGuidanceEngine(tokenizer, vocab_size, None if eos_ids is None else list(eos_ids))


def bind(law: Any, prompt_len: int, fmt: ResponseFormat | None, engine: GrammarEngine | None) -> Any:
    """`law` (gate.core.law.Law) bound to one request: its prompt length and, when the request has a
    response format, a fresh grammar matcher from `engine`. Raises ValueError when a format is
    given without an engine, or does not compile."""
    if fmt is None:
        return law.bind(prompt_len)
    if engine is None:
        raise ValueError(f"a {fmt.describe()} constraint needs a grammar engine")
    return law.bind(prompt_len, engine.matcher(fmt))
