"""Measured windows: the offered load, the client's workers, a window's record, the server's."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gate.records.requests import RequestRecord, SpecDecodeCounters


@dataclass
class OfferedLoad:
    """The load a window was measured under (gate.load): `kind` ("sequential", ...), most
    requests in flight (`concurrency`, None: unbounded) and mean arrivals per second
    (`request_rate`, None: each request as soon as a slot is free)."""

    kind: str
    concurrency: int | None = 1
    request_rate: float | None = None
    burstiness: float | None = None  # gamma shape of inter-arrival times (1: Poisson); None without a rate


def busy_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by the union of (start_s, end_s) intervals: the time at least one
    of them was in flight. Intervals that do not overlap (sequential requests) add up."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


@dataclass
class ClientWorkerRecord:
    """What one served-client worker process measured of itself over one window
    (gate.runners.client.worker): `wall_s` and `cpu_s` (its process's user + system time;
    cpu_s / wall_s near 1: it was saturated), the requests it began, and its event-loop lag
    in ms (a timer due every 2 ms, how late it ran: median, 99th percentile, max over
    `ticks` timers)."""

    worker: int
    wall_s: float
    cpu_s: float
    requests: int
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    ticks: int

    @property
    def cpu_share(self) -> float | None:
        """CPU time over wall time (1.0: one CPU busy throughout); None for an empty window."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else None


@dataclass
class RunRecord:
    """One measured window: the timed requests of one runner (a draft name or "fallback")
    under one law, sent by one run of the plan under one offered load.

    `start_s`/`end_s`: wall clock (s since the epoch) when its first request started and
    its last one ended; with interleaving other runners' requests run in between, so the
    window's `busy_s` (the union of its requests' [start, start + e2el] intervals) is its
    time, not end - start. `committed_tokens`: output tokens of its requests; `counters`:
    spec-decode counters pooled over the window (counter deltas; None where the runner
    gives no per-step counts); `server`: the served engine's identity (None in-process).
    Requests that failed are not in the window; contention reruns keep the attempt kept."""

    runner: str
    law: str
    start_s: float
    end_s: float
    load: OfferedLoad
    requests: int
    busy_s: float
    committed_tokens: int
    counters: SpecDecodeCounters | None = None
    server: str | None = None
    repetition: int | None = None  # served load points: the repetition this window is (paired across runners by it)
    good_requests: int | None = None  # requests meeting every load.goodput SLO (None: no SLO declared)
    slo_ms: dict[str, float] = field(default_factory=dict)  # the SLOs good_requests was counted against
    cpu_stall_share: float | None = None  # served: share of the window's wall time some task waited for a CPU (PSI)
    client_workers: list[ClientWorkerRecord] = field(default_factory=list)  # served: the client's worker processes
    server_ttft_mean_ms: float | None = (
        None  # the server's own mean TTFT over the window (vLLM's histogram), where kept
    )
    server_itl_mean_ms: float | None = None  # the server's own mean inter-token latency over the window, where kept
    server_cached_tokens: int | None = (
        None  # prompt tokens the server took from its prefix cache over the window (vLLM's counter)
    )

    @property
    def duration_s(self) -> float:
        """Wall time of the window, first send to last byte (s): a served window's denominator
        of output and request throughput (vLLM bench serve's benchmark duration)."""
        return self.end_s - self.start_s

    def committed_tokens_per_s(self) -> float:
        """Committed tokens per second of the window: committed_tokens / busy_s (NaN when
        nothing was busy). Under sequential load the requests never overlap, so busy_s is
        the sum of their E2E latencies and this equals today's pooled committed_tokens_per_s
        (sum of output tokens / sum of E2E time) over the same requests; at a concurrency
        above 1 the sum of latencies overcounts time and only this figure is throughput."""
        return self.committed_tokens / self.busy_s if self.busy_s > 0 else float("nan")

    @classmethod
    def of(
        cls,
        runner: str,
        law: str,
        load: OfferedLoad,
        spans: list[tuple[float, RequestRecord]],
        server: str | None = None,
    ) -> RunRecord:
        """The window of `spans`: (wall-clock start in s, record) of every request in it
        (non-empty). Counters are None when any record lacks per-step counts."""
        if not spans:
            raise ValueError("a run record needs at least one request")
        intervals = [(start, start + r.e2el_ms / 1e3) for start, r in spans]
        counts = [r.counters for _, r in spans]
        known = [c for c in counts if c is not None]
        pooled = sum(known, SpecDecodeCounters()) if len(known) == len(counts) else None
        return cls(
            runner,
            law,
            min(s for s, _ in intervals),
            max(e for _, e in intervals),
            load,
            len(spans),
            busy_seconds(intervals),
            sum(r.output_tokens for _, r in spans),
            pooled,
            server,
        )


@dataclass
class ServerRecord:
    """A served engine as gate saw it, one per runner: `kind` (the runner kind), `endpoint`
    (base URL; for a managed llama-server, the last one it listened on), `command` (the
    command line of a server gate started, else None), `version` (what the server said of
    itself), `peak_rss_bytes` (a managed server's peak resident set, VmHWM summed over its
    process tree, max over the times it was started; None where gate did not start it),
    `verification` (how the server verifies proposals, where gate knows it: vLLM's
    rejection_sample_method, e.g. "standard"; None: unknown or no speculation) and `lossless`
    (whether that method keeps the target's law; None: unknown). A draft whose server says
    lossless False gets a Failure at stage "verification": no exactness or speedup rule on it
    passes. `kv_pool_tokens` / `kv_pool_bytes`: the KV cache the server preallocated, in
    tokens (blocks x block size) and in bytes as the server counts them; `served_dtype`: the
    weights' dtype it serves at ("bfloat16"); None where the server does not say."""

    runner: str
    kind: str
    endpoint: str | None = None
    command: list[str] | None = None
    version: str | None = None
    peak_rss_bytes: int | None = None
    verification: str | None = None
    lossless: bool | None = None
    kv_pool_tokens: int | None = None
    kv_pool_bytes: int | None = None
    served_dtype: str | None = None
    slots: int | None = None  # requests the server admits at once (llama.cpp slots, vLLM max-num-seqs), where known
    # the device memory NVML says the server's process tree used, bytes, highest sample (ready, after each run,
    # before each stop; gate.measure.device_memory); None: not measured, and device_memory_note says why
    device_bytes: int | None = None
    device_memory_note: str | None = None


@dataclass
class DeviceMemoryRecord:
    """The accelerator's peak memory over one runner's requests under one law, in-process
    (gate.measure.device_memory): `allocated_bytes` / `reserved_bytes`, the CUDA caching
    allocator's peaks (max_memory_allocated / max_memory_reserved, reset before each of its
    requests), highest over `requests` requests, less `others_bytes`: the weights of the
    drafts loaded beside it that this runner does not use (resident during its requests,
    counted from their storages). `device`: the device's name. Served engines' device memory
    is on their ServerRecord (device_bytes)."""

    runner: str
    law: str
    device: str
    allocated_bytes: int
    reserved_bytes: int
    others_bytes: int = 0
    requests: int = 0
