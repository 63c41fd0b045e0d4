"""One served request's bytes, as a client worker moves them (gate.runners.client.worker):
POST the body (gate.runners.client.wire), stamp every response chunk with the time its bytes
were delivered by the event loop (before HTTP parsing), keep the chunks raw. Nothing is
parsed here beyond HTTP: a worker's event loop only sends and stamps, so one stream's
parsing never delays the stamp of another's bytes; gate's own process parses the chunks
afterwards (gate.runners.client.stream.StreamClient.read).

Clock: `begin_s` when the client began the request; `sent_s` when it left: its one write
(headers and body) was handed to the transport; the clock of TTFT starts there;
`connect_ms` the TCP/TLS set-up when the request opened its connection. All
time.perf_counter() seconds (CLOCK_MONOTONIC on Linux: one clock for every process of the
machine).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from gate.measure.contention import load_average, read_pressure
from gate.runners.client.events import arrived
from gate.runners.client.protocol import Protocol
from gate.runners.client.transport import (
    RemoteProtocolError,
    RequestProgress,
    ServedError,
    TransportError,
    classify_transport,
)
from gate.runners.client.wire import COMPRESSED, NO_RESPONSE, Connections


@dataclass
class RawStream:
    """A request's response as it arrived: `chunks` (perf_counter s read, bytes), the
    milestones of its send (perf_counter s: `scheduled_s` it was scheduled at, `due_s` it
    could first have begun, `begin_s` begun, `sent_s` it left (its one write handed to the
    transport: the clock of its times), `end_s` its last byte read), `connect_ms` (None: a kept-alive connection),
    `started_s` (wall
    clock s since the epoch at begin), `headers_s` (perf_counter s its response's headers were read; None where none
    came), the machine's CPU stall over it (ms,
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
    headers_s: float | None = None


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

    async def send(self, conns: Connections, body: bytes, scheduled_s: float, due_s: float) -> RawStream:
        """POST `body` (JSON bytes) on a connection of `conns` (a kept-alive one, else a new
        one); the response's chunks, stamped. A kept-alive connection the server closed as the
        request went out is retried once on a new one (its time counts from its own send).
        Raises ServedError for an HTTP error status, a compressed body or a transport failure
        (kind set: classify_transport; a malformed or error event that arrived before the
        failure names it instead)."""
        progress = RequestProgress()
        chunks: list[tuple[float, bytes]] = []
        request = conns.request(self.headers, body)
        try:
            try:
                return await asyncio.wait_for(
                    self._send(conns, request, scheduled_s, due_s, progress, chunks), self.timeout_s
                )
            except RemoteProtocolError as e:
                if str(e) != NO_RESPONSE or progress.fresh:
                    raise
                progress.restart()
                chunks.clear()
                return await asyncio.wait_for(
                    self._send(conns, request, scheduled_s, due_s, progress, chunks), self.timeout_s
                )
        except ServedError:
            raise
        except (asyncio.TimeoutError, TransportError) as e:
            arrived(self.runner, self.url, self.protocol, chunks, progress)
            kind, what = classify_transport(e, progress, time.perf_counter(), self.timeout_s)
            raise ServedError(self.runner, self.url, what, kind=kind) from None

    async def _send(
        self,
        conns: Connections,
        request: bytes,
        scheduled_s: float,
        due_s: float,
        progress: RequestProgress,
        chunks: list[tuple[float, bytes]],
    ) -> RawStream:
        started_s = time.time()
        pressure0 = read_pressure()  # the machine's CPU pressure over the request's wall time (contention)
        begin = progress.begin_s = time.perf_counter()
        conn = conns.take()
        if conn is None:
            progress.phase, progress.fresh, progress.connect_s = "connecting", True, time.perf_counter()
            conn = await conns.connect()
            progress.phase, progress.connected_s = "connected", time.perf_counter()
        try:
            response = conn.begin(request, progress, chunks)
            await response.done
        except BaseException:
            conn.close()  # never reused after a failure, a timeout or a cancel
            raise
        conns.give(conn)
        end = response.ended_s or time.perf_counter()
        if response.status >= 400:
            text = b"".join(c for _, c in chunks).decode("utf-8", errors="replace")
            raise ServedError(self.runner, self.url, f"HTTP {response.status}: {text[:200]}")
        encoding = response.headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding in COMPRESSED:
            raise ServedError(
                self.runner,
                self.url,
                f"the server compressed its stream (Content-Encoding: "
                f"{encoding.decode('latin-1')}) although the request asked for identity",
            )
        pressure1 = read_pressure()
        stall = (
            (pressure1.total_us - pressure0.total_us) / 1e3 if pressure0 is not None and pressure1 is not None else None
        )
        connect = (
            (progress.connected_s - progress.connect_s) * 1e3
            if progress.connect_s is not None and progress.connected_s is not None
            else None
        )
        return RawStream(
            chunks,
            scheduled_s,
            due_s,
            begin,
            progress.t0 or begin,
            end,
            started_s,
            connect,
            stall,
            load_average(),
            headers_s=progress.headers_s,
        )
