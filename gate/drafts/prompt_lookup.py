"""Prompt lookup (n-gram) proposals: copy what followed an earlier occurrence of the suffix.

q is a point mass at the proposed token, so under sampling a proposal x is accepted with
probability p(x) and the residual is p without x, renormalised (PRIMER, "Formulas").
Matching follows transformers' PromptLookupCandidateGenerator: the longest suffix n-gram
(max_ngram_size down to 1) and its earliest earlier occurrence with a continuation.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import ConfigDict, Field

from gate.core.errors import PolicyValueError
from gate.core.law import Law
from gate.drafts.interface import (
    BuildContext,
    BuiltDraft,
    Draft,
    DraftKind,
    DraftSpecBase,
    Proposal,
    ServedContext,
    ServedDraft,
    VLLMContext,
    VLLMDraft,
)
from gate.measure.speculation import ProposalFloor, lookup_floor


def lookup(context: list[int], max_ngram_size: int, n: int) -> list[int]:
    """Up to `n` tokens that followed the earliest earlier occurrence of the context's
    longest matching suffix n-gram (n-gram sizes max_ngram_size..1); [] when none matches."""
    length = len(context)
    for size in range(min(max_ngram_size, length - 1), 0, -1):
        suffix = context[length - size :]
        for start in range(0, length - size):
            if context[start : start + size] == suffix:
                follow = context[start + size : start + size + n]
                if follow:
                    return follow
    return []


class PromptLookupDraft(Draft):
    """Point-mass proposals from the request's own context; no weights, no cache."""

    kind = "prompt_lookup"
    probability_info = "point_mass"

    def __init__(self, name: str, max_ngram_size: int, num_draft_tokens: int, vocab_size: int, device: torch.device):
        self.name = name
        self.max_ngram_size = max_ngram_size
        self.num_draft_tokens = num_draft_tokens
        self.vocab_size = vocab_size
        self.device = device

    def propose(self, context: list[int], n: int, law: Law, generator: torch.Generator | None) -> Proposal:
        tokens = torch.tensor(lookup(context, self.max_ngram_size, n), dtype=torch.long, device=self.device)
        q = torch.nn.functional.one_hot(tokens, self.vocab_size).float() if len(tokens) else torch.empty(0)
        return Proposal(tokens, q)

    def teacher_forced(self, ids: list[int], start: int, law: Law, vocab_size: int) -> torch.Tensor:
        q = torch.zeros(len(ids) - start, vocab_size, device=self.device)
        for row, i in enumerate(range(start, len(ids))):
            follow = lookup(ids[:i], self.max_ngram_size, 1)
            if follow:
                q[row, follow[0]] = 1.0
        return q


class PromptLookupDraftSpec(DraftSpecBase):
    """Prompt lookup (n-gram) proposals: a point mass q, accepted with probability p(token)."""

    model_config = ConfigDict(title="PromptLookupDraft")

    kind: Literal["prompt_lookup"]
    max_ngram_size: int = Field(3, ge=1, le=16, description="Longest suffix n-gram searched for in the context.")


def _build(name: str, spec: PromptLookupDraftSpec, ctx: BuildContext) -> BuiltDraft:
    """No model to load: proposals come from the request's own context."""
    return BuiltDraft(PromptLookupDraft(name, spec.max_ngram_size, spec.num_draft_tokens, ctx.vocab_size, ctx.device))


def _llama_server(name: str, spec: PromptLookupDraftSpec, ctx: ServedContext) -> ServedDraft:
    """llama.cpp's ngram-simple: look up the last max_ngram_size tokens in the context and
    propose the num_draft_tokens that followed. gate's in-process lookup also tries shorter
    suffixes (max_ngram_size down to 1), llama.cpp only the one length, and it proposes only
    when it can copy at least max_ngram_size tokens (common/ngram-map.cpp: copy_max <
    n_draft_min gives no draft), so a num_draft_tokens below max_ngram_size never proposes.
    Raises PolicyValueError at drafts.<name>.num_draft_tokens for that."""
    if spec.num_draft_tokens < spec.max_ngram_size:
        raise PolicyValueError(
            f"drafts.{name}.num_draft_tokens",
            (
                "llama.cpp's ngram-simple proposes only when it can copy at least max_ngram_size "
                f"({spec.max_ngram_size}) "
                f"tokens, so num_draft_tokens {spec.num_draft_tokens} would never propose (speculation would never "
                "run): "
                f"use num_draft_tokens >= {spec.max_ngram_size} or a smaller max_ngram_size"
            ),
        )
    return ServedDraft(
        None,
        "ngram-simple",
        (
            "--spec-ngram-simple-size-n",
            str(spec.max_ngram_size),
            "--spec-ngram-simple-size-m",
            str(spec.num_draft_tokens),
        ),
    )


def _vllm(name: str, spec: PromptLookupDraftSpec, ctx: VLLMContext) -> VLLMDraft:
    """vLLM's ngram method: the longest suffix of max_ngram_size down to 1 tokens found
    earlier in the context, and the num_draft_tokens that followed it (as gate's own)."""
    return VLLMDraft(
        {
            "method": "ngram",
            "num_speculative_tokens": spec.num_draft_tokens,
            "prompt_lookup_max": spec.max_ngram_size,
            "prompt_lookup_min": 1,
        }
    )


def _floor(spec: PromptLookupDraftSpec) -> ProposalFloor:
    """Lookup proposes only where the context repeats an n-gram: the floor counts those
    positions in the output (gate.measure.speculation.lookup_floor)."""
    return lookup_floor(spec.max_ngram_size, spec.num_draft_tokens)


# No model, no cache, no draft step: the defaults for bill, roofline and checks.
KIND = DraftKind(
    name="prompt_lookup",
    spec=PromptLookupDraftSpec,
    probability_info="point_mass",
    build=_build,
    llama_server=_llama_server,
    vllm=_vllm,
    proposal_floor=_floor,
)
