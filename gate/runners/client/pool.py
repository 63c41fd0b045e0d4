"""The connection pool of one run() call: one single-connection client per request in flight,
each on connections whose writes are coalesced until the client reads (CoalescingBackend),
so that a request leaves in one write."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import httpcore
import httpx


class CoalescingStream(httpcore.AsyncNetworkStream):
    """A connection that holds what is written until the next write or read: httpcore
    writes a request's headers and its body apart, with a turn of the event loop between
    them in which other streams' requests go out, so the server has the headers and waits
    for the body (measured here: 1.07 ms median at concurrency 8 in one worker). Held, a
    request goes in one write; nothing is held across a read, so nothing waits for one.
    `sent_s`: when the last write was handed to the transport (where a request leaves);
    `read_s`: when the bytes of the last read reached the event loop (watch_arrivals), or
    when the read returned; either way before HTTP parsing."""

    def __init__(self, stream: httpcore.AsyncNetworkStream, arrivals: "deque[list[float]] | None" = None):
        self.stream = stream
        self.arrivals = arrivals  # (perf_counter s, bytes left) per delivery of the socket, oldest first
        self.held = b""
        self.sent_s: float | None = None  # perf_counter s when the last write was handed to the transport
        self.read_s: float | None = None  # perf_counter s when the last read returned bytes from the socket

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if not self.held:
            self.held = bytes(buffer)
            return
        data, self.held = self.held + buffer, b""
        await self._send(data, timeout)

    async def flush(self, timeout: float | None = None) -> None:
        if self.held:
            data, self.held = self.held, b""
            await self._send(data, timeout)

    async def _send(self, data: bytes, timeout: float | None) -> None:
        self.sent_s = time.perf_counter()
        await self.stream.write(data, timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self.flush(timeout)
        data = await self.stream.read(max_bytes, timeout)
        self.read_s = self._arrived(len(data))
        return data

    def _arrived(self, n: int) -> float:
        """When the `n` bytes just read reached the event loop: the delivery they came in
        (the socket protocol's data_received, stamped by watch_arrivals), else now."""
        if not self.arrivals:
            return time.perf_counter()
        t = self.arrivals[0][0]
        while n > 0 and self.arrivals:
            take = min(n, int(self.arrivals[0][1]))
            self.arrivals[0][1] -= take
            n -= take
            if self.arrivals[0][1] <= 0:
                self.arrivals.popleft()
        return t

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        await self.flush(timeout)
        return CoalescingStream(await self.stream.start_tls(ssl_context, server_hostname, timeout))  # TLS: stamped at read

    def get_extra_info(self, info: str) -> Any:
        return self.stream.get_extra_info(info)


def watch_arrivals(stream: Any) -> "deque[list[float]] | None":
    """Stamp every delivery of bytes to the asyncio protocol under an httpcore AnyIOStream
    (anyio's StreamProtocol.data_received, called as the event loop reads the socket: before
    any HTTP parsing, and before the coroutine that waits for them runs behind other
    streams'): a deque of [perf_counter s, bytes] the stream's reads consume in order. None
    where the stream is not built that way (another backend or version): reads are then
    stamped when they return."""
    anyio_stream = getattr(stream, "_stream", None)
    protocol = getattr(anyio_stream, "_protocol", None)
    transport = getattr(anyio_stream, "_transport", None)
    if protocol is None or transport is None or not callable(getattr(protocol, "data_received", None)):
        return None
    arrivals: deque[list[float]] = deque()
    deliver = protocol.data_received

    def data_received(data: bytes) -> None:
        arrivals.append([time.perf_counter(), float(len(data))])
        deliver(data)

    protocol.data_received = data_received
    transport.set_protocol(protocol)  # uvloop keeps the bound method it was given: give it this one
    return arrivals


class CoalescingBackend(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend, its connections CoalescingStreams."""

    def __init__(self) -> None:
        self.backend = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        stream = await self.backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return CoalescingStream(stream, watch_arrivals(stream))

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        return CoalescingStream(await self.backend.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self.backend.sleep(seconds)


# An idle connection is not reused after this long (httpx's own default): servers close theirs
# after a few seconds idle (llama.cpp, uvicorn: 5 s), and a request must not race that close.
KEEPALIVE_EXPIRY_S = 5.0


def coalescing_transport(verify: Any) -> httpx.AsyncHTTPTransport:
    """An httpx transport of one connection on a CoalescingBackend (its httpcore pool made
    with that backend; an httpx without the pool attribute keeps its own, unchanged)."""
    transport = httpx.AsyncHTTPTransport(verify=verify, trust_env=False,
                                         limits=httpx.Limits(max_connections=1, max_keepalive_connections=1,
                                                             keepalive_expiry=KEEPALIVE_EXPIRY_S))
    if hasattr(transport, "_pool"):
        ssl = verify if not isinstance(verify, bool) else (httpx.create_ssl_context() if verify else None)
        transport._pool = httpcore.AsyncConnectionPool(ssl_context=ssl, max_connections=1, max_keepalive_connections=1,
                                                       keepalive_expiry=KEEPALIVE_EXPIRY_S, network_backend=CoalescingBackend())
    return transport


class Clients:
    """One single-connection httpx.AsyncClient per request in flight, reused (keep-alive)
    by the next request. One shared pool of N connections costs O(N) per request start and
    end in httpcore (its pool scan), which at concurrency 64 delays the client by tens of ms
    and smears token times; single-connection clients keep the client's cost per event flat.
    trust_env=False: no proxy from the environment sits between gate and the server it measures.
    `timeout`: each client's; `tls`: whether the server is https (one TLS context for all)."""

    def __init__(self, timeout: httpx.Timeout, tls: bool):
        self.timeout = timeout
        self.verify: Any = httpx.create_ssl_context() if tls else False  # one TLS context for all (loading certificates is slow)
        self.free: list[httpx.AsyncClient] = []
        self.all: list[httpx.AsyncClient] = []

    def prepare(self, n: int) -> None:
        """Make clients now until there are `n` (idle until taken)."""
        while len(self.all) < n:
            self.free.append(self._new())

    def take(self) -> httpx.AsyncClient:
        """An idle client, or a new one when none is idle."""
        return self.free.pop() if self.free else self._new()

    def _new(self) -> httpx.AsyncClient:
        client = httpx.AsyncClient(transport=coalescing_transport(self.verify), timeout=self.timeout, trust_env=False)
        self.all.append(client)
        return client

    def give(self, client: httpx.AsyncClient) -> None:
        """Hand `client` back (idle) once its request ended."""
        self.free.append(client)

    async def aclose(self) -> None:
        """Close every client made."""
        for client in self.all:
            await client.aclose()
