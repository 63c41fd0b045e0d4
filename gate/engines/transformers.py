"""gate's own speculative-decoding loop on a transformers causal LM, in-process.

One request at a time (concurrency 1). Each step: the draft proposes up to
num_draft_tokens tokens, the target scores the last committed token plus the proposals in
one forward pass (num_draft_tokens + 1 positions), and gate.speculative.verify accepts a
prefix and draws the correction or bonus token. The target's KV cache is cropped back to
the committed prefix after every step. The fallback is the same loop with no draft: one
target forward per token, under the same law, the same target and the same code path.

Stop handling cuts a step's tokens before they are committed: an EOS, the token that
completes a stop string (gate.engines.stop) or max_new_tokens ends the output there.

Timing: time.perf_counter after synchronising the device, at the end of every step; all
tokens a step commits share that time.
"""

from __future__ import annotations

import time

import torch

from gate.drafts.interface import Draft
from gate.engines.interface import Engine, Generation
from gate.engines.stop import StopStrings
from gate.law import Law, law_probs
from gate.models.cache import cache_tensor_bytes, crop_to, forward, new_cache
from gate.speculative import Verdict, sample, verify


class TransformersEngine(Engine):
    """Speculative and fallback generation with a transformers model as the target.

    `eos_token_ids`: ids that end a request; `stop`: stop strings matched on the decoded
    output (None: none). An EOS, or the token completing a stop string, inside an accepted
    block ends the output there: the tokens after it are neither committed nor counted as
    accepted (at one position EOS comes first, then a stop string, then the length)."""

    def __init__(self, model: torch.nn.Module, eos_token_ids: set[int], device: torch.device,
                 stop: StopStrings | None = None):
        self.model = model
        self.eos_token_ids = set(eos_token_ids)
        self.device = device
        self.stop = stop
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
        stop_string: str | None = None

        def commit(tokens: list[int], n_accepted: int, n_proposed: int) -> str:
            nonlocal stop_string
            count, reason, matched = self._cut(out, tokens, max_new_tokens)
            stop_string = matched or stop_string
            out.extend(tokens[:count])
            now_ms = (self._now() - t0) * 1e3
            times.extend([now_ms] * count)
            committed.append(count)
            proposed.append(n_proposed)
            accepted.append(min(n_accepted, count))  # the committed prefix of a block is its accepted proposals
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
        # An output that ends inside an accepted block leaves the cache holding proposals past
        # its end: the resident cache of a finished request is its prompt and output at most.
        crop_to(cache, len(context))
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
            stop_string=stop_string,
        )

    def _cut(self, out: list[int], tokens: list[int], max_new_tokens: int) -> tuple[int, str, str | None]:
        """How many of a step's `tokens` to commit after `out`, why the request ends there
        ("" when it goes on) and the stop string that ends it, if one does."""
        count, reason = len(tokens), ""
        for i, tok in enumerate(tokens):
            if tok in self.eos_token_ids:
                count, reason = i + 1, "eos"
                break
            if len(out) + i + 1 >= max_new_tokens:
                count, reason = i + 1, "length"
                break
        if self.stop is not None:
            hit = self.stop.first_stop(out + tokens[:count], count)
            if hit is not None and (hit[0] < count or reason != "eos"):
                return hit[0], "stop", hit[1]
        return count, reason, None

    @torch.inference_mode()
    def first_steps(self, prompt_ids: list[int], draft: Draft, law: Law, n: int,
                    generator: torch.Generator | None) -> list[list[int]]:
        """`n` independent speculative first steps after `prompt_ids`: the tokens each commits
        (its accepted proposals, then the correction or bonus token; 1..num_draft_tokens + 1
        tokens). Each sample is one full speculative step from the prompt's last token (draft
        proposals, one verification forward, acceptance, residual or bonus); the prompt's
        prefill is computed once and the caches are rolled back in between. Stop handling does
        not apply: these samples test the law, they are not requests."""
        cache = new_cache(self.model.config)
        prompt = list(prompt_ids)
        if len(prompt) > 1:
            self._forward(prompt[:-1], cache, 1)
        base = int(cache.get_seq_length())
        draft.start()
        steps: list[list[int]] = []
        for _ in range(n):
            crop_to(cache, base)
            proposal = draft.propose(prompt, draft.num_draft_tokens, law, generator)
            k = int(proposal.tokens.shape[0])
            p = law_probs(self._forward(prompt[base:] + proposal.tokens.tolist(), cache, k + 1), law)
            verdict = verify(p, proposal.q, proposal.tokens, generator) if k else Verdict(0, sample(p[0], generator))
            steps.append(proposal.tokens[: verdict.accepted].tolist() + [verdict.next_token])
        return steps

    @torch.inference_mode()
    def target_logits(self, ids: list[int], start: int) -> torch.Tensor:
        """Teacher-forced raw target logits at positions start..len(ids)-1: [len(ids) - start, V]."""
        if start < 1:
            raise ValueError("teacher forcing needs at least one token of prefix (start >= 1)")
        return forward(self.model, torch.tensor([ids[:-1]], device=self.device))[0, start - 1:]

