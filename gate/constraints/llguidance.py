"""The grammar engine: llguidance (Microsoft; MIT), the engine behind vLLM's "guidance"
structured-output backend and llama.cpp's LLGUIDANCE build.

Why this one: one abi3 wheel with no Python dependencies (xgrammar and outlines-core pull
more), JSON schema, regex and Lark grammars from one API, rollback of consumed tokens
(needed to score a speculative block's positions and return to the committed prefix), and
a mask cost of about a millisecond per token on SmolLM2's 49,152-token vocabulary
(benchmarks/grammar_mask.py measures it).

JSON schemas compile with llguidance's defaults: properties in the order the schema lists
them, whitespace where JSON allows it. A served engine whose JSON grammar differs (another
property order, no whitespace) follows a different law, and gate's exactness says where.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import torch

from gate.constraints.interface import GrammarEngine, Matcher, ResponseFormat


def _grammar(fmt: ResponseFormat) -> str:
    """llguidance's grammar text for `fmt`."""
    if fmt.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(fmt.value)
    if fmt.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(fmt.value)
    return _choice_grammar(fmt.choices)


def _choice_grammar(choices: list[str]) -> str:
    """A Lark grammar whose language is exactly `choices` (JSON-quoted literals)."""
    import json

    alternatives = " | ".join(json.dumps(c) for c in choices)
    return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")


class LLGuidanceMatcher(Matcher):
    """An llguidance LLMatcher with the prefix it consumed; masks are cached by prefix."""

    def __init__(self, matcher: Any, vocab_size: int):
        self._m = matcher
        self._consumed: list[int] = []
        self._vocab_size = vocab_size
        self._cache: dict[tuple[int, ...], torch.Tensor | None] = {}
        self._times: list[float] = []

    @property
    def mask_ms(self) -> list[float]:
        return list(self._times)

    def allowed(self, output_ids: Sequence[int]) -> torch.Tensor | None:
        key = tuple(output_ids)
        if key in self._cache:
            return self._cache[key]
        t0 = time.perf_counter()  # rollback, consume and mask: what one uncached position costs
        common = 0
        for a, b in zip(self._consumed, key, strict=False):
            if a != b:
                break
            common += 1
        if common < len(self._consumed):
            self._m.rollback(len(self._consumed) - common)
            del self._consumed[common:]
        rest = list(key[common:])
        took = self._m.try_consume_tokens(rest) if rest else 0
        self._consumed.extend(rest[:took])
        if took < len(rest) or self._m.is_error():
            result = None
        else:
            bias = self._m.compute_logit_bias()
            allowed = torch.frombuffer(bytearray(bias), dtype=torch.uint8) > 0
            result = torch.zeros(self._vocab_size, dtype=torch.bool)
            width = min(self._vocab_size, int(allowed.shape[0]))
            result[:width] = allowed[:width]
        self._times.append((time.perf_counter() - t0) * 1e3)
        if len(self._cache) >= 256:  # [V] bool masks: 256 of them are 12 MB at 49k tokens
            self._cache.clear()
        self._cache[key] = result
        return result


class LLGuidanceEngine(GrammarEngine):
    """llguidance over a Hugging Face tokenizer (`tokenizer`), masks [vocab_size]. `eos_ids`: the
    ids that end the target's output (None: the tokenizer's EOS); a complete output allows
    exactly these."""

    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int] | None = None):
        self.vocab_size = int(vocab_size)
        eos = [tokenizer.eos_token_id] if eos_ids is None else sorted(eos_ids)
        self.eos_ids = [int(i) for i in eos if i is not None]
        self._hf = tokenizer
        self._ll: Any = None  # llguidance's tokenizer, built on first use (about 0.3 s for 49k tokens)
        self._grammars: dict[ResponseFormat, str] = {}

    @property
    def _tokenizer(self) -> Any:
        if self._ll is None:
            try:
                self._ll = llguidance.hf.from_tokenizer(
                    self._hf, n_vocab=max(self.vocab_size, len(self._hf)), eos_token=self.eos_ids or None
                )
            except (ValueError, TypeError, AttributeError) as e:
                raise ValueError(
                    f"llguidance cannot read the target's tokenizer ({e}); grammar constraints need a "
                    "byte-level or SentencePiece tokenizer"
                ) from None
        return self._ll

    def _compiled(self, fmt: ResponseFormat) -> str:
        if fmt not in self._grammars:
            self._grammars[fmt] = _grammar(fmt)
        return self._grammars[fmt]

    def check(self, fmt: ResponseFormat) -> str | None:
        try:
            grammar = self._compiled(fmt)
            tokenizer = self._tokenizer
        except (ValueError, TypeError) as e:
            return str(e)
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        return error or None

    def matcher(self, fmt: ResponseFormat) -> Matcher:
        error = self.check(fmt)
        if error:
            raise ValueError(f"{fmt.describe()}: {error}")
        m = llguidance.LLMatcher(self._tokenizer, self._compiled(fmt), log_level=0)
        if m.is_error():
            raise ValueError(f"{fmt.describe()}: {m.get_error()}")
        return LLGuidanceMatcher(m, self.vocab_size)
