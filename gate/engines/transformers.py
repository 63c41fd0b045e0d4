"""gate's own speculative-decoding loop on a transformers causal LM, in-process.

One request at a time (concurrency 1). Each step: the draft proposes up to
num_draft_tokens tokens, the target scores the last committed token plus the proposals in
one forward pass (num_draft_tokens + 1 positions), and gate.speculative.verify accepts a
prefix and draws the correction or bonus token. The target's KV cache is cropped back to
the committed prefix after every step. The fallback is the same loop with no draft: one
target forward per token, under the same law, the same target and the same code path.

Timing: time.perf_counter after synchronising the device, at the end of every step; all
tokens a step commits share that time.
"""

from __future__ import annotations

import time

import torch

from gate.drafts.interface import Draft
from gate.engines.interface import Engine, Generation
from gate.law import Law, law_probs
from gate.models.cache import cache_tensor_bytes, crop_to, forward, new_cache
from gate.speculative import Verdict, sample, verify


class TransformersEngine(Engine):
    """Speculative and fallback generation with a transformers model as the target.

    `eos_token_ids`: ids that end a request (an EOS inside an accepted block ends the
    output there; the tokens after it are not committed)."""

    def __init__(self, model: torch.nn.Module, eos_token_ids: set[int], device: torch.device):
        self.model = model
        self.eos_token_ids = set(eos_token_ids)
        self.device = device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0]) if model.get_output_embeddings() is not None else int(model.config.vocab_size)

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _forward(self, tokens: list[int], cache: object, keep: int) -> torch.Tensor:
        return forward(self.model, torch.tensor([tokens], device=self.device), cache, keep)[0, -keep:]

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], draft: Draft | None, law: Law, max_new_tokens: int,
                 generator: torch.Generator | None) -> Generation:
        t0 = self._now()
        cache = new_cache(self.model.config)
        if draft is not None:
            draft.start()
        context = list(prompt_ids)
        out: list[int] = []
        times: list[float] = []
        committed: list[int] = []
        proposed: list[int] = []
        accepted: list[int] = []
        stop = ""

        def commit(tokens: list[int], n_accepted: int, n_proposed: int) -> str:
            count = 0
            reason = ""
            for tok in tokens:
                out.append(tok)
                count += 1
                if tok in self.eos_token_ids:
                    reason = "eos"
                    break
                if len(out) >= max_new_tokens:
                    reason = "length"
                    break
            now_ms = (self._now() - t0) * 1e3
            times.extend([now_ms] * count)
            committed.append(count)
            proposed.append(n_proposed)
            accepted.append(min(n_accepted, count))
            context.extend(tokens[:count])
            return reason

        # Prefill: the first token comes from the target alone (TTFT).
        logits = self._forward(context, cache, 1)
        stop = commit([sample(law_probs(logits[-1], law), generator)], 0, 0)
        while not stop:
            remaining = max_new_tokens - len(out)
            n = min(draft.num_draft_tokens, remaining - 1) if draft is not None else 0
            proposal = draft.propose(context, n, law, generator) if n > 0 else None
            k = int(proposal.tokens.shape[0]) if proposal is not None else 0
            fed = cache.get_seq_length()
            feed = context[fed:] + (proposal.tokens.tolist() if k else [])
            p = law_probs(self._forward(feed, cache, k + 1), law)
            verdict = verify(p, proposal.q, proposal.tokens, generator) if k else Verdict(0, sample(p[0], generator))
            crop_to(cache, len(context) + verdict.accepted)
            tokens = (proposal.tokens[: verdict.accepted].tolist() if k else []) + [verdict.next_token]
            stop = commit(tokens, verdict.accepted, k)
        e2el_ms = (self._now() - t0) * 1e3
        return Generation(
            output_ids=out,
            token_times_ms=times,
            step_committed=committed,
            step_proposed=proposed,
            step_accepted=accepted,
            stop_reason=stop,
            e2el_ms=e2el_ms,
            kv_cache_tokens=int(cache.get_seq_length()),
            kv_cache_bytes=cache_tensor_bytes(cache),
            draft_kv_cache_bytes=draft.cache_bytes() if draft is not None else 0,
        )

    @torch.inference_mode()
    def first_tokens(self, prompt_ids: list[int], draft: Draft, law: Law, n: int,
                     generator: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
        """`n` independent speculative first tokens after `prompt_ids`, and the target law
        there (float32 [V]). Each sample is one full speculative step from the prompt's
        last token (draft proposals, one verification forward, acceptance or residual);
        the prompt's prefill is computed once and the caches are rolled back in between."""
        cache = new_cache(self.model.config)
        prompt = list(prompt_ids)
        if len(prompt) > 1:
            self._forward(prompt[:-1], cache, 1)
        base = int(cache.get_seq_length())
        draft.start()
        tokens: list[int] = []
        first_law = torch.empty(0)
        for _ in range(n):
            crop_to(cache, base)
            proposal = draft.propose(prompt, draft.num_draft_tokens, law, generator)
            k = int(proposal.tokens.shape[0])
            p = law_probs(self._forward(prompt[base:] + proposal.tokens.tolist(), cache, k + 1), law)
            verdict = verify(p, proposal.q, proposal.tokens, generator) if k else Verdict(0, sample(p[0], generator))
            tokens.append(int(proposal.tokens[0]) if verdict.accepted else verdict.next_token)
            first_law = p[0]
        return tokens, first_law

    @torch.inference_mode()
    def target_logits(self, ids: list[int], start: int) -> torch.Tensor:
        """Teacher-forced raw target logits at positions start..len(ids)-1: [len(ids) - start, V]."""
        if start < 1:
            raise ValueError("teacher forcing needs at least one token of prefix (start >= 1)")
        return forward(self.model, torch.tensor([ids[:-1]], device=self.device))[0, start - 1:]

