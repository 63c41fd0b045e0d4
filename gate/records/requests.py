"""What one request measured: its timing, its speculative-decoding counters, its overlap."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FALLBACK = "fallback"


UNKNOWN_ID = -1  # output id of a token a runner counted but whose id it did not see (a stream of text only)


@dataclass
class SpecDecodeCounters:
    """vLLM's spec-decode counters (vllm/v1/spec_decode/metrics.py) plus the tokens the
    steps committed. They add up across requests and runs; rates are derived from pooled
    counters, never averaged.

    num_drafts: verification steps that carried at least one proposal.
    num_draft_tokens: proposals made. num_accepted_tokens: proposals committed (gate stops at
    an EOS or stop string inside an accepted block: proposals after it are not counted; vLLM
    counts every proposal its rejection rule accepted).
    num_committed_tokens: tokens the steps with a proposal committed (accepted proposals plus
    the correction or bonus token, fewer when the output ends inside the block).
    num_accepted_tokens_per_pos[i]: steps whose proposal at position i was committed.
    accepted_length_histogram[k]: steps with a proposal that committed k proposals.
    num_draft_tokens_per_pos[i]: steps that proposed a token at position i (i + 1 or more
    proposals); num_verified_per_pos[i]: steps whose proposal at position i was reached by
    the verification (every earlier proposal committed). Both from gate's own step counts;
    empty where only a server's counters are known (vLLM exports neither).
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    accepted_length_histogram: list[int] = field(default_factory=list)
    num_committed_tokens: int = 0
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)
    num_verified_per_pos: list[int] = field(default_factory=list)

    def __add__(self, other: SpecDecodeCounters) -> SpecDecodeCounters:
        return SpecDecodeCounters(
            self.num_drafts + other.num_drafts,
            self.num_draft_tokens + other.num_draft_tokens,
            self.num_accepted_tokens + other.num_accepted_tokens,
            _add_lists(self.num_accepted_tokens_per_pos, other.num_accepted_tokens_per_pos),
            _add_lists(self.accepted_length_histogram, other.accepted_length_histogram),
            self.num_committed_tokens + other.num_committed_tokens,
            _add_lists(self.num_draft_tokens_per_pos, other.num_draft_tokens_per_pos),
            _add_lists(self.num_verified_per_pos, other.num_verified_per_pos),
        )

    @property
    def acceptance_rate(self) -> float:
        """num_accepted_tokens / num_draft_tokens (NaN without proposals)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """num_committed_tokens / num_drafts: committed tokens per step with a proposal, what a
        client receives per verification (NaN without proposals). Equals vLLM's figure except
        where an output ends inside an accepted block (EOS, stop string), which commits no
        correction or bonus token."""
        return self.num_committed_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def vllm_mean_acceptance_length(self) -> float:
        """1 + num_accepted_tokens / num_drafts: vLLM's formula, which adds a correction or
        bonus token to every step, also one cut short by an EOS (vLLM issue #56101)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        """num_accepted_tokens_per_pos[i] / num_drafts. Their sum + 1 is vLLM's mean acceptance length."""
        return [a / self.num_drafts if self.num_drafts else float("nan") for a in self.num_accepted_tokens_per_pos]

    @classmethod
    def from_steps(
        cls, proposed: list[int], accepted: list[int], committed: list[int] | None = None
    ) -> SpecDecodeCounters:
        """Counters from per-step proposal, accepted and committed counts (steps without
        proposals ignored). Without `committed`, every step commits its accepted proposals
        plus one token."""
        width = max(proposed, default=0)
        per_pos = [0] * width
        drafted = [0] * width
        verified = [0] * width
        hist = [0] * (width + 1)
        drafts = done = 0
        for s, (n, a) in enumerate(zip(proposed, accepted, strict=False)):
            if n == 0:
                continue
            drafts += 1
            done += committed[s] if committed is not None else a + 1
            hist[a] += 1
            for i in range(a):
                per_pos[i] += 1
            for i in range(n):
                drafted[i] += 1
            for i in range(min(a + 1, n)):
                verified[i] += 1
        return cls(drafts, sum(proposed), sum(accepted), per_pos, hist, done, drafted, verified)


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    out = [0] * max(len(a), len(b))
    for i, v in enumerate(a):
        out[i] += v
    for i, v in enumerate(b):
        out[i] += v
    return out


@dataclass
class RequestRecord:
    """One generation request, fallback or speculative, as the client sees it.

    Times are milliseconds from the request's start. token_times_ms[i] is when output
    token i was committed; tokens committed by one step share one time (so token-by-token
    ITL has zeros inside a step; itl_chunk_ms has one gap per step). Stop handling is
    applied before counting: an EOS inside an accepted block ends the output there, and so
    does the token that completes a stop string (it is the last output token; the text a
    client gets stops before the stop string, as vLLM returns it by default).
    """

    draft: str  # draft name, or "fallback"
    law: str
    prompt_id: str
    category: str
    max_new_tokens: int
    repetition: int
    prompt_tokens: int
    output_ids: list[int]
    token_times_ms: list[float]
    # Per-step counts: None where the runner cannot see steps (a served engine's stream).
    step_committed: list[int] | None  # committed tokens per step; the first step is the prefill
    step_proposed: list[int] | None  # proposals verified per step (0 for the prefill and fallback)
    step_accepted: list[int] | None  # proposals committed per step
    stop_reason: str  # "eos", "stop" (a stop string) or "length"
    e2el_ms: float
    num_draft_tokens: int  # the configured gamma (0 for the fallback)
    # Measured in-process only (None where the runner cannot see the caches):
    kv_cache_tokens: int | None  # tokens held in the target cache at the end of the request (<= prompt + output)
    kv_cache_bytes: int | None  # measured bytes of the target's cache tensors at the end (cropped to prompt + output)
    draft_kv_cache_bytes: int | None  # measured bytes of the draft's cache tensors at the end (with its last proposals)
    context_length: int | None = None  # the requested length of a context-sweep prompt (tokens), else None
    stop_string: str | None = None  # the stop string that ended the output (stop_reason "stop")
    constraint: str | None = None  # the workload.constraints label it ran under ('none', 'prompt', a name), else None
    # Contention (gate.measure.contention), over the request's wall time; None where not
    # measured (a runner without the cpu_accounting capability).
    cpu_time_ms: float | None = None  # this process's CPU time, user + system, all threads
    cpu_stall_ms: float | None = (
        None  # time some runnable task waited for a CPU (/proc/pressure/cpu "some"), None without it
    )
    load_avg_1m: float | None = None  # the machine's 1-minute load average at the request's end
    threads: int | None = None  # compute threads the runner used (torch.get_num_threads())
    contention_reruns: int = 0  # times this request's cell was rerun because a request of it was contended
    # Served runners (gate.runners.openai): the load point the request ran at, and what only a server says.
    concurrency: int | None = None  # the closed-loop load point (load.concurrency), None in-process / open loop
    request_rate: float | None = None  # the open-loop load point (load.request_rate, requests/s)
    queue_ms: float | None = None  # client queue time: scheduled arrival -> send (open loop with a cap)
    server_draft_tokens: int | None = None  # proposals the server made for it (llama.cpp timings.draft_n)
    server_accepted_tokens: int | None = None  # of them accepted (llama.cpp timings.draft_n_accepted)
    # each verification step's proposals and accepted proposals, from the server (vLLM's per-request spec-decode
    # metrics, --per-request-spec-decode-metrics detailed): the request's counters where it has no step counts of gate's
    server_step_proposed: list[int] | None = None
    server_step_accepted: list[int] | None = None
    # The served client's own timing of the request (gate.runners.result.ClientTiming; None in-process).
    # token_times_ms and e2el_ms run from when the request left (its one write handed to the transport); these say what
    # came before.
    schedule_lag_ms: float | None = None  # how late the client began it against when it was due
    send_ms: float | None = None  # began -> left (connection set-up included)
    connect_ms: float | None = None  # TCP/TLS set-up when it opened its connection (None: kept-alive, or in-process)
    # left -> its response's headers read (before the first token: the server's time before it streamed)
    headers_ms: float | None = None
    loop_lag_ms: float | None = None  # the client worker's largest event-loop lag while it was in flight
    client_worker: int | None = None  # the client worker process that sent it (0-based)
    server_output_tokens: int | None = None  # output tokens the server counted (usage / tokens_predicted)
    server_prefill_ms: float | None = None  # the server's own prefill time (llama.cpp timings.prompt_ms)
    server_tpot_ms: float | None = None  # the server's own time per output token (llama.cpp predicted_per_token_ms)
    server_cached_tokens: int | None = None  # prompt tokens the server took from its prefix cache (llama.cpp cache_n)
    started_s: float | None = None  # served: wall clock (s, epoch) when the client began it, before connecting
    # Cross-tokenizer drafts (gate.drafts.cross_tokenizer), per step like step_proposed (0 / None elsewhere):
    step_mapping_ms: list[float] | None = (
        None  # time spent translating between the tokenizers in the step's proposal (ms)
    )
    step_draft_tokens: list[int] | None = None  # tokens the draft proposed in its own vocabulary before translation

    @property
    def mapping_ms(self) -> float:
        """Total translation time of the request (ms); 0 without per-step mapping times."""
        return float(sum(self.step_mapping_ms)) if self.step_mapping_ms else 0.0

    @property
    def draft_tokens(self) -> int | None:
        """Tokens the draft proposed in its own vocabulary over the request (None: not recorded)."""
        return sum(self.step_draft_tokens) if self.step_draft_tokens is not None else None

    @property
    def output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def ttft_ms(self) -> float:
        return self.token_times_ms[0] if self.token_times_ms else float("nan")

    @property
    def server_headers_ms(self) -> float | None:
        """The server's time to answer a served request's headers (ms): from its leaving to its response's headers,
        where they came before its first token (its accept queue, its threads, its request handling); None where they
        came with it (nothing to tell apart from the prefill), or in-process."""
        if self.headers_ms is None or not self.token_times_ms or self.headers_ms >= self.token_times_ms[0]:
            return None
        return self.headers_ms

    @property
    def itl_ms(self) -> list[float]:
        """Token-by-token inter-token latencies: len = output_tokens - 1; mean = TPOT."""
        t = self.token_times_ms
        return [t[i] - t[i - 1] for i in range(1, len(t))]

    @property
    def itl_chunk_ms(self) -> list[float]:
        """One gap per step after the first (vLLM bench's per-chunk convention). Without
        per-step counts (step_committed None) a chunk is the tokens that arrived at one
        time: one gap per change of token_times_ms."""
        ends: list[float] = []
        if self.step_committed is None:
            for t in self.token_times_ms:
                if not ends or t != ends[-1]:
                    ends.append(t)
        else:
            i = 0
            for k in self.step_committed:
                if k:
                    i += k
                    ends.append(self.token_times_ms[i - 1])
        return [ends[j] - ends[j - 1] for j in range(1, len(ends))]

    @property
    def tpot_ms(self) -> float:
        n = self.output_tokens
        return (self.e2el_ms - self.ttft_ms) / (n - 1) if n > 1 else float("nan")

    @property
    def committed_tokens_per_s(self) -> float:
        return self.output_tokens / (self.e2el_ms / 1e3) if self.e2el_ms > 0 else float("nan")

    @property
    def counters(self) -> SpecDecodeCounters | None:
        """The request's spec-decode counters from its per-step counts (gate's own, else the
        server's per-step arrays, each step committing its accepted proposals plus one, vLLM's
        convention); None without either."""
        if self.step_proposed is not None and self.step_accepted is not None:
            return SpecDecodeCounters.from_steps(self.step_proposed, self.step_accepted, self.step_committed)
        if self.server_step_proposed is not None and self.server_step_accepted is not None:
            return SpecDecodeCounters.from_steps(self.server_step_proposed, self.server_step_accepted)
        return None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["derived"] = dict(
            output_tokens=self.output_tokens,
            ttft_ms=self.ttft_ms,
            tpot_ms=self.tpot_ms,
            committed_tokens_per_s=self.committed_tokens_per_s,
            counters=asdict(counters) if (counters := self.counters) is not None else None,
        )
        return out


@dataclass
class OverlapRecord:
    """Per-position overlap along one continuation the target generated under the law.

    overlap[i] = sum_x min(p_i(x), q_i(x)) at output position i, both processed by the law;
    None where the draft made no proposal (prompt lookup without an n-gram match).
    top1[i] = argmax q_i == argmax p_i (diagnostic only).
    """

    draft: str
    law: str
    prompt_id: str
    category: str
    probability_info: str  # "distribution" or "point_mass"
    overlap: list[float | None]
    top1: list[bool | None]
    context_length: int | None = None  # the requested length of a context-sweep prompt (tokens), else None
    constraint: str | None = None  # the workload.constraints label of the prompt variant, else None
