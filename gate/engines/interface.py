"""How tokens are produced and timed. An engine serves requests one at a time."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from gate.drafts.interface import Draft
from gate.law import Law


@dataclass
class Generation:
    """What one request produced, before it is labelled with draft, law and prompt.

    Times are ms from the request's start; see gate.records.RequestRecord. stop_reason:
    "eos", "stop" (a stop string, gate.engines.stop) or "length"."""

    output_ids: list[int]
    token_times_ms: list[float]
    step_committed: list[int]
    step_proposed: list[int]
    step_accepted: list[int]
    stop_reason: str
    e2el_ms: float
    kv_cache_tokens: int
    kv_cache_bytes: int
    draft_kv_cache_bytes: int
    stop_string: str | None = None  # the stop string that ended the output (stop_reason "stop")


class Engine(ABC):
    """Generates with the target alone (draft=None, the fallback) or with a draft."""

    vocab_size: int

    @abstractmethod
    def generate(self, prompt_ids: list[int], draft: Draft | None, law: Law, max_new_tokens: int,
                 generator: torch.Generator | None) -> Generation:
        """One request: `prompt_ids` -> up to `max_new_tokens` committed tokens under `law`."""

    @abstractmethod
    def first_steps(self, prompt_ids: list[int], draft: Draft, law: Law, n: int,
                    generator: torch.Generator | None) -> list[list[int]]:
        """`n` independent speculative first steps after the prompt: the tokens each commits."""

    @abstractmethod
    def target_logits(self, ids: list[int], start: int) -> torch.Tensor:
        """Teacher-forced raw target logits at positions start..len(ids)-1: [len(ids) - start, V]."""

    def target_probs(self, ids: list[int], start: int, law: Law) -> torch.Tensor:
        """Teacher-forced target law at positions start..len(ids)-1: float32 [len(ids) - start, V]."""
        from gate.law import law_probs

        return law_probs(self.target_logits(ids, start), law)
