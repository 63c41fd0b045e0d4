"""The in-process transformers runner: gate's own speculative-decoding loop on a
transformers causal LM, private to this module.

One request at a time (concurrency 1). Each step: the draft proposes up to
num_draft_tokens tokens, the target scores the last committed token plus the proposals in
one forward pass (num_draft_tokens + 1 positions), and gate.core.speculative.verify accepts a
prefix and draws the correction or bonus token. The target's KV cache is cropped back to
the committed prefix after every step. The fallback is the same loop with no draft: one
target forward per token, under the same law, the same target and the same code path.

Stop handling cuts a step's tokens before they are committed: an EOS, the token that
completes a stop string (gate.runners.stop) or max_new_tokens ends the output there.

Timing: time.perf_counter after synchronising the device, at the end of every step; all
tokens a step commits share that time. Each request is also measured by a
gate.measure.contention.Probe (process CPU time, machine CPU pressure): the
cpu_accounting capability.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import torch

from gate.constraints import bind
from gate.constraints.interface import GrammarEngine, ResponseFormat
from gate.core.law import AnyLaw, Law, law_probs
from gate.core.requests import Request
from gate.core.speculative import Verdict, sample, verify
from gate.drafts.interface import Draft, Proposal
from gate.load.interface import LoadStrategy
from gate.measure.contention import Probe, cpu_quota, fitted_threads, runnable_elsewhere
from gate.measure.device_memory import CudaPeaks
from gate.measure.environment import cpu_count
from gate.metrics.catalogue import MetricNames
from gate.models.cache import cache_tensor_bytes, crop_to, forward, new_cache, record_past
from gate.models.loading import weight_bytes
from gate.records import FALLBACK, DeviceMemoryRecord
from gate.runners.interface import (
    Capabilities,
    Done,
    Ended,
    Observed,
    RequestResult,
    Runner,
    RunnerSpecBase,
    StreamResult,
)
from gate.runners.registry import register
from gate.runners.stop import StopStrings

# Metrics only gate's own loop measures (Metric.measured_by "in_process"): they need its step
# counters, the caches it holds, the drafts loaded here or their tokenizer mapping.
IN_PROCESS_METRICS = MetricNames(lambda m: m.measured_by == "in_process")


class TransformersRunnerSpec(RunnerSpecBase):
    """runner.kind transformers: gate's in-process loop on the target and drafts it loads."""

    kind: Literal["transformers"] = "transformers"


@register("transformers")
class TransformersRunner(Runner):
    """Speculative and fallback generation in this process with a transformers model as
    the target, for the drafts named in `drafts` (a request's draft "fallback": none).

    `eos_token_ids`: ids that end a request; `stop`: stop strings matched on the decoded
    output (None: none). An EOS, or the token completing a stop string, inside an accepted
    block ends the output there: the tokens after it are neither committed nor counted as
    accepted (at one position EOS comes first, then a stop string, then the length)."""

    capabilities = Capabilities(
        token_ids=True,
        step_counters=True,
        seeding=True,
        first_steps=True,
        cpu_accounting=True,
        max_concurrency=1,
        server_counters=False,
        in_process=True,
        load_points=False,
        interleaves=True,
        metrics=IN_PROCESS_METRICS,
        metrics_note="needs gate's in-process loop (runner.kind {kinds}); a served run measures "
        "acceptance from the server's counters (acceptance_rate, mean_acceptance_length)",
    )
    spec = TransformersRunnerSpec

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: set[int],
        device: torch.device,
        stop: StopStrings | None = None,
        drafts: dict[str, Draft] | None = None,
        grammars: GrammarEngine | None = None,
        threads: int | Literal["auto"] | None = None,
    ):
        self.model = model
        self.grammars = grammars  # compiles a request's response format (None: constrained requests fail)
        self.eos_token_ids = set(eos_token_ids)
        self.device = device
        self.stop = stop
        self.drafts: dict[str, Draft] = dict(drafts or {})
        self._probe: Probe | None = None
        self._notes: list[str] = []
        # compute threads (measurement.threads): a number, "auto" (fit_threads), or None (torch's, untouched)
        self.threads = threads
        self._most = torch.get_num_threads()  # what the process was given: auto never goes above it
        # on CUDA: the allocator's peaks per (runner, law), reset before each request (device_memory())
        self._peaks = CudaPeaks(device) if device.type == "cuda" else None
        self._device_memory: dict[tuple[str, str], DeviceMemoryRecord] = {}
        self._others: dict[str, int] = {}  # runner -> resident bytes of the drafts it does not use
        if isinstance(threads, int):
            torch.set_num_threads(threads)
        elif threads == "auto":
            self.fit_threads("at the start")

    @classmethod
    def from_plan(cls, plan: Any, local: Any = None) -> TransformersRunner:
        """The runner on the target and drafts loaded for `plan` (`local`, a
        gate.loop.session.LocalModels). Raises ValueError without them."""
        if local is None:
            raise ValueError("the transformers runner runs the models loaded in this process: open them first")
        t = local.target
        threads = plan.policy.measurement.threads
        return cls(t.model, t.eos_token_ids, t.device, t.stop, local.drafts, t.grammars, threads)

    @property
    def threads_given(self) -> int | None:
        """The compute threads the process was given, with measurement.threads auto (a request
        on fewer ran slower than the machine allows); None for a fixed count or torch's own."""
        return self._most if self.threads == "auto" else None

    def fit_threads(self, when: str) -> None:
        """With measurement.threads auto: set torch's compute threads to the CPUs other tasks
        leave free now (gate.measure.contention.fitted_threads over runnable_elsewhere), at
        most the threads the process was given; a note says when it changed and why (`when`:
        "at the start", "before a contended cell's rerun"). Every runner of this process
        computes on the same threads. Nothing for a fixed count."""
        if self.threads != "auto" or self._most == 1:  # a fixed count, or one thread: nothing to fit
            return
        cpus = min(cpu_count() or 1, cpu_quota() or 1024)  # a container's CPU quota bounds it too
        elsewhere = runnable_elsewhere()
        now, fitted = torch.get_num_threads(), fitted_threads(cpus, elsewhere, self._most)
        if fitted != now:
            torch.set_num_threads(fitted)
            self._notes.append(
                f"compute threads {now} -> {fitted} {when}: {elsewhere:g} other runnable task(s) on {cpus} CPU(s) "
                f"(measurement.threads auto; at most the {self._most} the process was given)"
            )

    def observed(self) -> Observed:
        """The notes since the last call (compute threads fitted), then cleared."""
        out = Observed(self._notes)
        self._notes = []
        return out

    def open(self) -> None:
        """Set up the CPU accounting probe (reads whether /proc/pressure/cpu exists)."""
        if self._probe is None:
            self._probe = Probe()

    def close(self) -> None:
        self._probe = None

    def run(
        self, requests: Sequence[Request], load: LoadStrategy, done: Done | None = None, ended: Ended | None = None
    ) -> list[RequestResult]:
        """Every request in the order given, one at a time (sequential load only); each
        result is read as it ends (`done`, then `ended`)."""
        self.check_load(load)
        self.open()
        out: list[RequestResult] = []
        for i, req in enumerate(requests):
            try:
                result: RequestResult = self._request(req)
            except Exception as e:  # noqa: BLE001 - returned: the caller records it, the others run
                result = e
            out.append(result)
            if done is not None:
                done(i, result)
            if ended is not None:
                ended(i)
        return out

    def device_memory(self) -> list[DeviceMemoryRecord]:
        """On CUDA, the allocator's peak per runner and law over its requests so far, less the
        resident weights of the drafts the runner does not use (gate.measure.device_memory);
        [] on other devices."""
        return list(self._device_memory.values())

    def _others_bytes(self, runner: str) -> int:
        """Resident bytes of the drafts loaded here that `runner` does not use (counted once)."""
        if runner not in self._others:
            mine = [self.model, *([] if runner == FALLBACK else self.drafts[runner].modules())]
            every = [self.model, *(m for d in self.drafts.values() for m in d.modules())]
            self._others[runner] = weight_bytes(*every, exclude=mine)
        return self._others[runner]

    def _record_peak(self, req: Request) -> None:
        """Keep the highest allocator peak of `req`'s runner and law (after the request)."""
        assert self._peaks is not None
        peak, others = self._peaks.read(), self._others_bytes(req.draft)
        key = (req.draft, req.law.name)
        rec = self._device_memory.get(key) or DeviceMemoryRecord(
            req.draft, req.law.name, self._peaks.name(), 0, 0, others
        )
        rec.allocated_bytes = max(rec.allocated_bytes, peak.allocated - others)
        rec.reserved_bytes = max(rec.reserved_bytes, peak.reserved - others)
        rec.requests += 1
        self._device_memory[key] = rec

    def _request(self, req: Request) -> StreamResult:
        draft = None if req.draft == FALLBACK else self.drafts[req.draft]
        probe = self._probe or Probe()
        if self._peaks is not None:
            self._peaks.reset()  # before the probe: the reset is not the request's time
        started = probe.start()
        prompt = list(req.prompt.token_ids)
        law = bind(req.law, len(prompt), req.prompt.response_format, self.grammars)
        g = self._generate(prompt, draft, law, req.max_new_tokens, self._generator(req.seed))
        load = probe.stop(started)
        if self._peaks is not None:
            self._record_peak(req)
        return replace(
            g,
            cpu_time_ms=load.cpu_time_ms,
            cpu_stall_ms=load.cpu_stall_ms,
            load_avg_1m=load.load_avg_1m,
            threads=torch.get_num_threads(),
        )

    def _generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _forward(self, tokens: list[int], cache: object, keep: int) -> torch.Tensor:
        return forward(self.model, torch.tensor([tokens], device=self.device), cache, keep)[0, -keep:]

    def _score(
        self, tokens: list[int], cache: object, keep: int, draft: Draft | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [keep, V] at the last `keep` positions and, when `draft` uses the target's
        hidden states (draft heads), the hidden states [keep, H] there from the same forward
        (else None)."""
        if draft is None or not draft.uses_target_hidden:
            return self._forward(tokens, cache, keep), None
        every = draft.target_hidden_history  # the hidden states of every fed position (an EAGLE draft's history)
        logits, hidden = forward(
            self.model, torch.tensor([tokens], device=self.device), cache, keep, hidden="all" if every else True
        )
        return logits[0, -keep:], hidden[0] if every else hidden[0, -keep:]

    @torch.inference_mode()
    def _generate(
        self,
        prompt_ids: list[int],
        draft: Draft | None,
        law: AnyLaw,
        max_new_tokens: int,
        generator: torch.Generator | None,
    ) -> StreamResult:
        """One request: `prompt_ids` -> up to `max_new_tokens` committed tokens under `law`
        (draft None: the fallback; a RequestLaw carries the penalties' prompt length and the
        grammar: p and q of every position are processed with that position's history, the
        accepted proposals before it included). gate's speculative loop; no CPU accounting."""
        started_s = time.time()
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
        mapping_ms: list[float] = []  # per step: the draft's tokenizer translation time (cross-tokenizer drafts)
        draft_tokens: list[int] = []  # per step: tokens the draft proposed in its own vocabulary
        stop = ""
        stop_string: str | None = None

        def commit(tokens: list[int], n_accepted: int, n_proposed: int, proposal: Proposal | None = None) -> str:
            nonlocal stop_string
            count, reason, matched = self._cut(out, tokens, max_new_tokens)
            stop_string = matched or stop_string
            out.extend(tokens[:count])
            now_ms = (self._now() - t0) * 1e3
            times.extend([now_ms] * count)
            committed.append(count)
            proposed.append(n_proposed)
            accepted.append(min(n_accepted, count))  # the committed prefix of a block is its accepted proposals
            mapping_ms.append(float(proposal.mapping_ms) if proposal is not None else 0.0)
            drafted = proposal.draft_tokens if proposal is not None else None
            draft_tokens.append(n_proposed if drafted is None else int(drafted))
            context.extend(tokens[:count])
            return reason

        # Prefill: the first token comes from the target alone (TTFT).
        logits, hidden = self._score(context, cache, 1, draft)
        record_past(cache)  # rejected proposals roll back: sliding-window layers keep what that needs
        if hidden is not None:  # the state whose logits give the first token (and, for a history, every prompt's)
            draft.observe_target_states(hidden)
        stop = commit([sample(law_probs(logits[-1], law, context), generator)], 0, 0)
        while not stop:
            remaining = max_new_tokens - len(out)
            n = min(draft.num_draft_tokens, remaining - 1) if draft is not None else 0
            proposal = draft.propose(context, n, law, generator) if n > 0 else None
            k = int(proposal.tokens.shape[0]) if proposal is not None else 0
            fed = cache.get_seq_length()
            feed = context[fed:] + (proposal.tokens.tolist() if k else [])
            scored, hidden = self._score(feed, cache, k + 1, draft)
            p = law_probs(scored, law, context + (proposal.tokens.tolist() if k else []), len(context))
            verdict = verify(p, proposal.q, proposal.tokens, generator) if k else Verdict(0, sample(p[0], generator))
            if hidden is not None:  # the rows whose p gave the committed tokens, the last one next_token's
                draft.observe_target_states(hidden[: len(hidden) - k + verdict.accepted])
            crop_to(cache, len(context) + verdict.accepted)
            tokens = (proposal.tokens[: verdict.accepted].tolist() if k else []) + [verdict.next_token]
            stop = commit(tokens, verdict.accepted, k, proposal)
        e2el_ms = (self._now() - t0) * 1e3
        # An output that ends inside an accepted block leaves the cache holding proposals past
        # its end: the resident cache of a finished request is its prompt and output at most.
        crop_to(cache, len(context))
        return StreamResult(
            output_ids=out,
            token_times_ms=times,
            stop_reason=stop,
            e2el_ms=e2el_ms,
            started_s=started_s,
            stop_string=stop_string,
            step_committed=committed,
            step_proposed=proposed,
            step_accepted=accepted,
            kv_cache_tokens=int(cache.get_seq_length()),
            kv_cache_bytes=cache_tensor_bytes(cache),
            draft_kv_cache_bytes=draft.cache_bytes() if draft is not None else 0,
            step_mapping_ms=mapping_ms,
            step_draft_tokens=draft_tokens,
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

    def first_steps(
        self,
        prompt_ids: list[int],
        draft: str,
        law: Law,
        n: int,
        seed: int,
        response_format: ResponseFormat | None = None,
    ) -> list[list[int]]:
        """`n` independent speculative first steps of the draft named `draft` after
        `prompt_ids`, drawn with a generator seeded by `seed` on the runner's device: the
        tokens each commits (its accepted proposals, then the correction or bonus token;
        1..num_draft_tokens + 1 tokens), under `law` and the request's `response_format`
        (None: unconstrained). Raises KeyError for an unknown draft."""
        bound = bind(law, len(prompt_ids), response_format, self.grammars)
        return self._first_steps(prompt_ids, self.drafts[draft], bound, n, self._generator(seed))

    @torch.inference_mode()
    def _first_steps(
        self, prompt_ids: list[int], draft: Draft, law: AnyLaw, n: int, generator: torch.Generator | None
    ) -> list[list[int]]:
        """Each sample is one full speculative step from the prompt's last token (draft
        proposals, one verification forward, acceptance, residual or bonus); the prompt's
        prefill is computed once and the caches are rolled back in between. Stop handling does
        not apply: these samples test the law, they are not requests."""
        cache = new_cache(self.model.config)
        prompt = list(prompt_ids)
        hidden = None
        if len(prompt) > 1:
            _, hidden = self._score(prompt[:-1], cache, 1, draft)
        record_past(cache)
        base = int(cache.get_seq_length())
        draft.start()
        if hidden is not None:  # every sample starts after the prompt: one state (or history) for all
            draft.observe_target_states(hidden)
        steps: list[list[int]] = []
        for _ in range(n):
            crop_to(cache, base)
            proposal = draft.propose(prompt, draft.num_draft_tokens, law, generator)
            k = int(proposal.tokens.shape[0])
            p = law_probs(
                self._forward(prompt[base:] + proposal.tokens.tolist(), cache, k + 1),
                law,
                prompt + proposal.tokens.tolist(),
                len(prompt),
            )
            verdict = verify(p, proposal.q, proposal.tokens, generator) if k else Verdict(0, sample(p[0], generator))
            steps.append(proposal.tokens[: verdict.accepted].tolist() + [verdict.next_token])
        return steps
