"""HTTP/1.1 for the client workers: asyncio's connections and httptools' response parser
(llhttp, Node.js's HTTP parser, in C), so that a worker's cost per streamed event is a
parser callback and not a trip through an HTTP client's Python layers.

Measured with tests/served_stub.py (96 requests of 32 tokens in 8 steps, one SSE event per
token, 32 in flight, one uvloop process): 0.39 s of CPU through httpx 0.29 (anyio, httpcore,
h11), 0.10 s through aiohttp 3.14, 0.04 s here. At concurrency 64 on 2 cores the client's
CPU is taken from the server it measures and delays the stamps of other streams' bytes.

Each response body chunk is stamped with time.perf_counter() as the event loop delivers its
bytes (data_received, before any parsing); a request goes out in one write (the server never
holds headers waiting for a body); a connection serves one request at a time and is kept
alive for the next (KEEPALIVE_EXPIRY_S) when the server allows. Failures raise the exception
classes of gate.runners.client.transport (ConnectError, ReadError, RemoteProtocolError), which
classify_transport names."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

import httptools

from gate.runners.client.transport import ConnectError, ReadError, RemoteProtocolError, RequestProgress

# An idle connection is not reused after this long (httpx's default): servers close theirs
# after a few seconds idle (llama.cpp, uvicorn: 5 s), and a request must not race that close.
KEEPALIVE_EXPIRY_S = 5.0
NO_RESPONSE = "Server disconnected without sending a response."  # a kept-alive connection the server had closed
COMPRESSED = (b"gzip", b"deflate", b"br", b"zstd", b"compress")


class Response:
    """One response as it arrives: `status`, `headers` (lower-case name -> value, bytes),
    `chunks` ((perf_counter s its bytes were delivered, body bytes), the body de-chunked),
    `done` (a future: None once the message is complete, or the exception that ended it),
    `ended_s` (perf_counter s the bytes that completed it were delivered)."""

    def __init__(self, progress: RequestProgress, chunks: list[tuple[float, bytes]], done: asyncio.Future[None]):
        self.progress, self.chunks, self.done = progress, chunks, done
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.complete = False
        self.keep_alive = False
        self.ended_s: float | None = None  # perf_counter s the bytes that completed it were delivered


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, one request at a time (begin, then the response's `done`)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.response: Response | None = None
        self.parser: Any = None
        self._t = 0.0  # when the bytes being parsed were delivered

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._t = time.perf_counter()
        if self.parser is None:  # bytes while no request is out: the connection is unusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._end(RemoteProtocolError(f"malformed HTTP response: {e}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself; connection_lost ends an unfinished response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        r = self.response
        if r is None or r.done.done():
            return
        if exc is not None:
            error: Exception = ReadError(str(exc) or type(exc).__name__)
            error.__cause__ = exc
            self._end(error)
        elif r.progress.headers_s is None:
            self._end(RemoteProtocolError(NO_RESPONSE))
        elif b"content-length" not in r.headers and b"chunked" not in r.headers.get(b"transfer-encoding", b""):
            self.on_message_complete()  # a body delimited by the close
        else:
            what = (
                "incomplete chunked read"
                if b"chunked" in r.headers.get(b"transfer-encoding", b"")
                else "received fewer bytes than Content-Length"
            )
            self._end(RemoteProtocolError(f"peer closed connection without sending complete message body ({what})"))

    # -- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        r = self.response
        assert r is not None
        r.status = self.parser.get_status_code()
        r.progress.phase, r.progress.headers_s = "headers", self._t

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response.chunks.append((self._t, bytes(body)))
        self.response.progress.last_s = self._t

    def on_message_complete(self) -> None:
        r = self.response
        assert r is not None
        r.complete, r.ended_s = True, self._t
        r.keep_alive = bool(self.parser.should_keep_alive()) and not self.closed
        self._end(None)

    # -- requests --------------------------------------------------------------------------
    def begin(self, request: bytes, progress: RequestProgress, chunks: list[tuple[float, bytes]]) -> Response:
        """Send `request` (its whole bytes, in one write); the Response it gets. Marks
        `progress` sending then sent (perf_counter s: the write was handed to the transport).
        Raises ReadError when the connection is already closed."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise ReadError("the connection was closed before the request")
        self.response = Response(progress, chunks, asyncio.get_running_loop().create_future())
        self.parser = httptools.HttpResponseParser(self)
        progress.phase, progress.sending_s = "sending", time.perf_counter()
        self.transport.write(request)
        progress.phase, progress.sent_s = "sent", time.perf_counter()
        return self.response

    def _end(self, error: Exception | None) -> None:
        r = self.response
        if r is not None and not r.done.done():
            if error is None:
                r.done.set_result(None)
            else:
                r.done.set_exception(error)

    def reusable(self) -> bool:
        """Whether the last response completed and the server keeps the connection alive."""
        r = self.response
        return (
            r is not None
            and r.complete
            and r.keep_alive
            and not self.closed
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def close(self) -> None:
        """Close now (unread bytes are dropped)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()
        self.closed = True


class Connections:
    """The kept-alive connections to one server (`url`'s scheme, host and port) of one worker:
    take() an idle one or connect(), give() it back after a complete response."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.netloc = parts.netloc.rsplit("@", 1)[-1]
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if self.tls else None
        )  # one for all: loading certificates is slow
        self.idle: list[Connection] = []

    def request(self, headers: dict[str, str], body: bytes) -> bytes:
        """A POST of `body` to the URL's path, with `headers` (and Host, Content-Length,
        Accept-Encoding: identity, so a body arrives as the server wrote it), as bytes."""
        lines = [
            f"POST {self.target} HTTP/1.1",
            f"Host: {self.netloc}",
            "User-Agent: gate",
            "Accept: text/event-stream",
            "Accept-Encoding: identity",
            *(f"{k}: {v}" for k, v in headers.items()),
            f"Content-Length: {len(body)}",
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    def take(self) -> Connection | None:
        """An idle connection still open and idle under KEEPALIVE_EXPIRY_S (others are closed), or None."""
        now = time.perf_counter()
        while self.idle:
            conn = self.idle.pop()
            if conn.reusable() and now - conn.idle_since < KEEPALIVE_EXPIRY_S:
                return conn
            conn.close()
        return None

    async def connect(self) -> Connection:
        """A new connection. Raises ConnectError (its cause: the OSError) when it cannot be made."""
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                Connection, self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None
            )
        except ssl.SSLError as e:  # an OSError whose errno is OpenSSL's, not the system's: named by its text
            raise ConnectError(f"TLS handshake failed: {e}") from None
        except socket.gaierror as e:  # likewise: getaddrinfo's code
            raise ConnectError(f"name resolution failed for {self.host!r}: {e}") from None
        except OSError as e:
            raise ConnectError(str(e) or type(e).__name__) from e
        return conn

    def give(self, conn: Connection) -> None:
        """Hand `conn` back after its request: kept when reusable, else closed."""
        if conn.reusable():
            conn.idle_since = time.perf_counter()
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Close every idle connection."""
        for conn in self.idle:
            conn.close()
        self.idle.clear()
