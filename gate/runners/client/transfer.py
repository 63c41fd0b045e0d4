"""One served request's bytes, as a client worker moves them (gate.runners.client.worker):
POST the body, stamp every response chunk with the time its bytes were read from the socket
(the connection's last read, before HTTP parsing), keep the chunks raw. Nothing is
parsed here: a worker's event loop only sends and stamps, so one stream's parsing never
delays the stamp of another's bytes; gate's own process parses the chunks afterwards
(gate.runners.client.stream.StreamClient.read).

Clock: `begin_s` when the client began the request; `sent_s` when it left: the one write of
its headers and body was handed to the transport (gate.runners.client.pool.CoalescingStream;
else httpcore's trace when its headers began to go out, where guidellm's clock starts); the
clock of TTFT starts there; `connect_ms` the TCP/TLS set-up when the request opened its
connection. All time.perf_counter() seconds
(CLOCK_MONOTONIC on Linux: one clock for every process of the machine).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from gate.measure.contention import load_average, read_pressure
from gate.runners.client.events import arrived
from gate.runners.client.protocol import Protocol
from gate.runners.client.transport import RequestProgress, ServedError, classify_transport


@dataclass
class RawStream:
    """A request's response as it arrived: `chunks` (perf_counter s read, bytes), the
    milestones of its send (perf_counter s: `scheduled_s` it was scheduled at, `due_s` it
    could first have begun, `begin_s` begun, `sent_s` it left (its one write handed to the
    transport: the clock of its times), `end_s` its last byte read), `connect_ms` (None: a kept-alive connection), `started_s` (wall
    clock s since the epoch at begin), the machine's CPU stall over it (ms,
    /proc/pressure/cpu; None without it), the load average at its end, and what its worker
    measured: `loop_lag_ms` (the worker's largest event-loop lag while it was in flight)
    and `worker` (0-based)."""

    chunks: list[tuple[float, bytes]]
    scheduled_s: float
    due_s: float
    begin_s: float
    sent_s: float
    end_s: float
    started_s: float
    connect_ms: float | None = None
    cpu_stall_ms: float | None = None
    load_avg_1m: float | None = None
    loop_lag_ms: float = 0.0
    worker: int = 0
    index: int = -1


@dataclass(frozen=True)
class Transfer:
    """Moves one runner's requests to one URL: `headers` (with the body's content type),
    `timeout_s` per request from begin to the stream's end; `protocol` only names what
    arrived before a transport failure (its events and tokens)."""

    runner: str
    url: str
    protocol: Protocol
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0

    async def send(self, client: httpx.AsyncClient, body: bytes, scheduled_s: float, due_s: float) -> RawStream:
        """POST `body` (JSON bytes) on `client`; the response's chunks, stamped. A kept-alive
        connection the server closed as the request went out is retried once on a new one
        (its time counts from its own send). Raises ServedError for an HTTP error status or a
        transport failure (kind set: classify_transport; a malformed or error event that
        arrived before the failure names it instead)."""
        progress = RequestProgress()
        chunks: list[tuple[float, bytes]] = []
        try:
            try:
                return await asyncio.wait_for(self._send(client, body, scheduled_s, due_s, progress, chunks), self.timeout_s)
            except httpx.RemoteProtocolError as e:
                if "without sending a response" not in str(e) or progress.fresh:
                    raise
                progress.restart()
                chunks.clear()
                return await asyncio.wait_for(self._send(client, body, scheduled_s, due_s, progress, chunks), self.timeout_s)
        except ServedError:
            raise
        except (asyncio.TimeoutError, httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as e:
            arrived(self.runner, self.url, self.protocol, chunks, progress)
            kind, what = classify_transport(e, progress, time.perf_counter(), self.timeout_s)
            raise ServedError(self.runner, self.url, what, kind=kind) from None
        except httpx.HTTPError as e:
            raise ServedError(self.runner, self.url, f"{type(e).__name__}: {e}") from None

    async def _send(self, client: httpx.AsyncClient, body: bytes, scheduled_s: float, due_s: float,
                    progress: RequestProgress, chunks: list[tuple[float, bytes]]) -> RawStream:
        started_s = time.time()
        pressure0 = read_pressure()  # the machine's CPU pressure over the request's wall time (contention)
        begin = progress.begin_s = time.perf_counter()
        async with client.stream("POST", self.url, content=body, headers=self.headers,
                                 extensions={"trace": progress.trace}) as resp:
            progress.headers_s = time.perf_counter()
            stream = resp.extensions.get("network_stream")
            if getattr(stream, "sent_s", None) is not None:  # a CoalescingStream: the write that sent the request
                progress.sending_s = stream.sent_s
            if resp.status_code >= 400:
                text = (await resp.aread()).decode("utf-8", errors="replace")
                raise ServedError(self.runner, self.url, f"HTTP {resp.status_code}: {text[:200]}")
            reads = stream if getattr(stream, "read_s", None) is not None else None
            async for chunk in resp.aiter_bytes():
                # stamped when its bytes were read from the socket (before HTTP parsing), where known
                progress.last_s = now = reads.read_s if reads is not None else time.perf_counter()
                chunks.append((now, chunk))
        end = time.perf_counter()
        pressure1 = read_pressure()
        stall = (pressure1.total_us - pressure0.total_us) / 1e3 if pressure0 is not None and pressure1 is not None else None
        connect = ((progress.connected_s - progress.connect_s) * 1e3
                   if progress.connect_s is not None and progress.connected_s is not None else None)
        return RawStream(chunks, scheduled_s, due_s, begin, progress.t0 or begin, end, started_s, connect, stall,
                         load_average())
