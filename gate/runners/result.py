"""What one request produced (StreamResult), before it is labelled with its draft, law and
prompt, and how a served client sent and read it (ClientTiming). Kept free of torch and
the models: the served client's worker processes (gate.runners.client.worker) build these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ClientTiming:
    """How the served client handled one request, for checking its own timing (all ms).

    `schedule_lag_ms`: how late the client began the request against when it was due (the
    open loop's arrival, or the moment a slot came free: a closed loop's previous request
    ended, a capped open loop's slot was released); `send_ms`: from beginning the request
    to its leaving (its one write handed to the transport; connection set-up included); `connect_ms`: the TCP (and TLS)
    set-up when this request opened its connection, None when it reused a kept-alive one;
    `headers_ms`: from its leaving to its response's headers (None where none came); where they came before the
    first token, the server's time before it streamed (its accept queue, its threads, its request handling);
    `loop_lag_ms`: the largest event-loop lag of its worker while it was in flight (a timer
    due every 2 ms, how late it ran: how late a byte's arrival could have been stamped);
    `worker`: the client worker process that sent it (0-based); `server_output_tokens`:
    the output tokens the server counted (usage.completion_tokens, llama.cpp
    tokens_predicted), None where it gave none; `server_prefill_ms` / `server_tpot_ms`:
    the server's own prefill time and time per output token (llama.cpp timings.prompt_ms /
    predicted_per_token_ms), None where it gives none; `server_cached_tokens`: prompt tokens
    it took from its prefix cache (llama.cpp timings.cache_n); `events`: SSE data events read."""

    schedule_lag_ms: float
    send_ms: float
    connect_ms: float | None
    loop_lag_ms: float
    worker: int
    server_output_tokens: int | None = None
    server_prefill_ms: float | None = None
    server_tpot_ms: float | None = None
    server_cached_tokens: int | None = None
    events: int = 0
    headers_ms: float | None = None


@dataclass
class StreamResult:
    """What one request produced, before it is labelled with draft, law and prompt.

    Times are ms from the request's start (see gate.records.RequestRecord; a served request
    starts when it leaves the client: its one write is handed to the transport, gate.runners.client.transfer);
    `started_s` is the
    wall clock (s since the epoch) at that start, for the run's windows. stop_reason:
    "eos", "stop" (a stop string, gate.runners.stop) or "length". The optional fields are
    None where the runner cannot give them: per-step counts (step_counters), measured cache
    sizes (in-process), CPU accounting (cpu_accounting)."""

    output_ids: list[int]
    token_times_ms: list[float]
    stop_reason: str
    e2el_ms: float
    started_s: float = 0.0
    stop_string: str | None = None  # the stop string that ended the output (stop_reason "stop")
    step_committed: list[int] | None = None
    step_proposed: list[int] | None = None
    step_accepted: list[int] | None = None
    kv_cache_tokens: int | None = None
    kv_cache_bytes: int | None = None
    draft_kv_cache_bytes: int | None = None
    cpu_time_ms: float | None = None
    cpu_stall_ms: float | None = None
    load_avg_1m: float | None = None
    threads: int | None = None
    queue_ms: float | None = None  # client-side wait between the scheduled arrival and the send (served runners)
    server_draft_tokens: int | None = None  # proposals the server made for this request (llama.cpp timings.draft_n)
    server_accepted_tokens: int | None = None  # of them accepted (llama.cpp timings.draft_n_accepted)
    # each verification step's proposals and accepted proposals, from the server (vLLM's per-request metrics)
    server_step_proposed: list[int] | None = None
    server_step_accepted: list[int] | None = None
    step_mapping_ms: list[float] | None = (
        None  # per step: ms the draft spent translating between tokenizers (in-process)
    )
    step_draft_tokens: list[int] | None = None  # per step: tokens the draft proposed in its own vocabulary (in-process)
    client: ClientTiming | None = None  # served: how the client sent and read it (its own timing, checked)
