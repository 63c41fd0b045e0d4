"""How a served request's transport failed, named for its ServedError: the request's
progress (RequestProgress), the transport's exceptions (ConnectError, ReadError,
RemoteProtocolError: gate.runners.client.wire raises them), the failure's kind and wording
(classify_transport), and the breaker that stops sending after consecutive transport
failures (Breaker)."""

from __future__ import annotations

import asyncio
import errno
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gate.runners.interface import RequestResult


class ServedError(RuntimeError):
    """A served request (or scrape) failed: `runner` (the runner name: a draft or
    "fallback"), `url` (the endpoint), `what` (what failed, e.g. "connection refused at
    connect (...)", "HTTP 503: <body>", "timed out before the first byte after 120 s (...)")
    and `kind`: for a transport failure one of TRANSPORT_KINDS (the connection, not the
    server's answer, failed), "not_sent" for a request the runner gave up on without
    sending (max_consecutive_failures), None otherwise (an HTTP error status, a malformed
    stream, a refused law)."""

    names_its_place = True  # its message names runner and URL: reports add no source location

    def __init__(self, runner: str, url: str, what: str, kind: str | None = None):
        super().__init__(f"runner {runner!r} at {url}: {what}")
        self.runner = runner
        self.url = url
        self.what = what
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled whole (a client worker process hands it back to gate's)."""
        return (ServedError, (self.runner, self.url, self.what, self.kind))


TRANSPORT_KINDS = (
    "refused",
    "connect_failed",
    "reset_before_response",
    "reset_mid_stream",
    "timeout_before_first_byte",
    "timeout_mid_stream",
)
"""ServedError.kind of a request whose connection failed (classify_transport): refused at
connect (ECONNREFUSED), another failure to connect (unreachable, name resolution), reset or
closed before the response headers, reset or closed after them, no response byte within
the time limit, stalled after the response began. These, and only these, count towards
OpenAIRunner.max_consecutive_failures."""


class TransportError(Exception):
    """A served request's connection failed (gate.runners.client.wire); the OSError behind
    it, where there is one, is its __cause__."""


class ConnectError(TransportError):
    """The connection could not be made (refused, unreachable, TLS handshake)."""


class ReadError(TransportError):
    """The connection failed after it was made (reset, broken pipe)."""


class RemoteProtocolError(TransportError):
    """The server closed the connection before its response was complete, or sent bytes
    that are not HTTP/1.1."""


@dataclass
class RequestProgress:
    """How far one request got, for naming a transport failure (classify_transport) and for
    the client's own timing (gate.runners.result.ClientTiming): the phase it last reached
    ("connecting", "connected", "sending", "sent", "headers"; None before anything) and
    perf_counter seconds at its milestones: the client began the request (`begin_s`),
    began and completed the TCP/TLS set-up (`connect_s`, `connected_s`), handed its one
    write to the transport (`sending_s`) and returned from it (`sent_s`), read the response
    headers and the last body byte; and the SSE events and tokens (ids) parsed."""

    phase: str | None = None
    fresh: bool = False  # this attempt opened its connection (else it reused a kept-alive one)
    begin_s: float | None = None
    connect_s: float | None = None
    connected_s: float | None = None
    sending_s: float | None = None
    sent_s: float | None = None
    headers_s: float | None = None
    last_s: float | None = None
    events: int = 0
    tokens: int = 0

    @property
    def t0(self) -> float | None:
        """When the request left: its one write handed to the transport (`sending_s`;
        guidellm's clock starts when its headers go out), else when the client began it."""
        for t in (self.sending_s, self.sent_s, self.begin_s):
            if t is not None:
                return t
        return None

    def restart(self) -> None:
        """Forget a lost attempt (nothing was received): the request is sent again."""
        self.phase, self.fresh, self.headers_s, self.last_s = None, False, None, None
        self.connect_s = self.connected_s = self.sending_s = self.sent_s = None
        self.events = self.tokens = 0


def _os_error(e: BaseException) -> OSError | None:
    """The first OSError with an errno in `e`'s chain of causes (a TransportError's cause is the socket's)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno is not None:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def _cause(e: BaseException) -> str:
    """'<class>: <errno name> (<os.strerror>)' of a transport exception, else '<class>:
    <message>' (or the class alone when the message is empty: asyncio.TimeoutError has none)."""
    os_err = _os_error(e)
    name = type(e).__name__
    if os_err is not None:
        code = errno.errorcode.get(os_err.errno, str(os_err.errno))
        return f"{name}: {code} ({os.strerror(os_err.errno)})"  # asyncio's strerror is "Connect call failed (...)"
    text = str(e).strip()
    return f"{name}: {text}" if text else name


def classify_transport(e: BaseException, progress: RequestProgress, now_s: float, timeout_s: float) -> tuple[str, str]:
    """(kind, what) of a request whose transport failed with `e` (a TransportError, or
    asyncio.TimeoutError: the request's time limit), given how far it got (`progress`) and
    perf_counter `now_s` (s); `timeout_s`: the request's time limit (s). `kind` is one of
    TRANSPORT_KINDS; `what` names it with a non-empty detail: the exception's class and
    errno name and strerror (or its message), the events and tokens received, the seconds
    waited (a timeout: the time limit, which it reached; else the seconds since the send).
    Raises nothing."""
    waited = now_s - progress.t0 if progress.t0 is not None else None
    after = f"{waited:.2f} s after the send" if waited is not None else "before the send"
    got = f"{progress.events} event(s), {progress.tokens} token(s)"
    started = progress.headers_s is not None
    if isinstance(e, asyncio.TimeoutError):
        which = f"the request's time limit of {timeout_s:g} s"
        if not started:
            where = {
                "connecting": "connecting",
                None: "before connecting",
                "connected": "connected, sending",
                "sending": "sending the request",
                "sent": "the request was sent",
            }.get(progress.phase, progress.phase)
            return "timeout_before_first_byte", (
                f"timed out before the first byte after {_s(timeout_s)} s ({which}; {where}, no response byte)"
            )
        last = (
            f"; the last byte {now_s - progress.last_s:.2f} s before"
            if progress.last_s is not None
            else "; nothing after the response headers"
        )
        return "timeout_mid_stream", (
            f"timed out mid-stream after {_s(timeout_s)} s ({which}; the response headers, then {got}{last})"
        )
    if isinstance(e, ConnectError):
        os_err = _os_error(e)
        code = os_err.errno if os_err is not None else None
        if code == errno.ECONNREFUSED:
            return "refused", f"connection refused at connect ({_cause(e)}; {after}: nothing listens on that port)"
        if code in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
            return "reset_before_response", f"connection reset before the response ({_cause(e)}; at connect, {after})"
        return (
            "connect_failed",
            f"connection failed at connect ({_cause(e)}; {after}: the host is unreachable or unknown)",
        )
    if not started:
        where = (
            "while sending the request" if progress.phase in ("connected", "sending") else "after the request was sent"
        )
        return "reset_before_response", (
            f"connection reset before the response ({_cause(e)}; {where}, no response byte, {after})"
        )
    return "reset_mid_stream", (
        f"connection reset mid-stream ({_cause(e)}; after the response headers and {got}, {after})"
    )


def _s(seconds: float) -> str:
    """Seconds to 0.1 s, without trailing zeros: 1, 10, 0.5, 2.3."""
    return f"{round(seconds, 1):g}"


class Breaker:
    """Consecutive transport failures of one run() call, in the order requests ended. After
    `limit` in a row every request not yet sent fails at once (refusal)."""

    def __init__(self, limit: int, runner: str, url: str, at: str):
        self.limit, self.runner, self.url, self.at = limit, runner, url, at
        self.streak = 0
        self.last: str | None = None
        self.open = False
        self.opened: tuple[int, str | None] = (0, None)

    def ended(self, result: RequestResult) -> None:
        """Count a request that ended: a transport failure lengthens the streak, any answer
        from the server resets it, a request not sent leaves it."""
        if isinstance(result, ServedError) and result.kind in TRANSPORT_KINDS:
            self.streak += 1
            self.last = result.what
            if self.streak >= self.limit and not self.open:
                self.open = True
                self.opened = (self.streak, self.last)  # what the refusals say: the streak that opened it
        elif not (isinstance(result, ServedError) and result.kind == "not_sent"):
            self.streak = 0  # an answer (even HTTP 500 or a malformed stream): the server is there

    def refusal(self) -> ServedError:
        """The ServedError (kind "not_sent") of a request not sent once the breaker is open."""
        streak, last = self.opened if self.open else (self.streak, self.last)
        return ServedError(
            self.runner,
            self.url,
            f"not sent: {streak} request{'s' if streak != 1 else ''} in a row failed at this "
            f"load point ({self.at}; last: "
            f"{last}); the rest are errors at once (runner.max_consecutive_failures: {self.limit})",
            kind="not_sent",
        )
