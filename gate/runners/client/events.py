"""A stream's SSE chunks read into Events, each stamped with the arrival of the chunk that
completed it: in gate's process for a whole response (gate.runners.client.stream), in a
worker for what arrived before a transport failure (gate.runners.client.transfer). Every
broken event is a ServedError naming the runner and the URL."""

from __future__ import annotations

import json

from gate.runners.client.parse import Event
from gate.runners.client.protocol import Protocol
from gate.runners.client.sse import SSEReader
from gate.runners.client.transport import RequestProgress, ServedError


def events_of(
    runner: str, url: str, protocol: Protocol, chunks: list[tuple[float, bytes]], t0: float, final: bool
) -> list[Event]:
    """The events of a stream's `chunks` ((perf_counter s read, bytes)), each stamped with
    the arrival (ms from `t0`) of the chunk that completed it. Raises ServedError naming
    `runner` and `url` for broken SSE framing (`final`: the stream ended, so a payload left
    without its blank line counts), a malformed event or an error event."""
    reader = SSEReader()
    events: list[Event] = []
    try:
        for t, chunk in chunks:
            for data in reader.feed(chunk):
                _dispatch(runner, url, protocol, data, (t - t0) * 1e3, events)
        data = reader.end() if final else None
    except ValueError as e:  # the SSE framing is broken
        raise ServedError(runner, url, str(e)) from None
    if data is not None:
        _dispatch(runner, url, protocol, data, (chunks[-1][0] - t0) * 1e3, events)
    return events


def arrived(
    runner: str, url: str, protocol: Protocol, chunks: list[tuple[float, bytes]], progress: RequestProgress
) -> None:
    """Count what arrived before a transport failure into `progress` (events, tokens).
    Raises the ServedError of a malformed or error event among them (it came first)."""
    events = events_of(runner, url, protocol, chunks, progress.t0 or 0.0, final=False)
    progress.events = len(events)
    progress.tokens = sum(len(e.ids or ()) for e in events)


def _dispatch(runner: str, url: str, protocol: Protocol, data: str, t_ms: float, events: list[Event]) -> None:
    """Parse one SSE data payload (arrived at `t_ms`) into `events`; OpenAI's "[DONE]" carries nothing."""
    if data.strip() == "[DONE]":
        return
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        raise ServedError(runner, url, f"malformed SSE event: {data[:200]!r}") from None
    if not isinstance(obj, dict):
        raise ServedError(runner, url, f"malformed SSE event (not a JSON object): {data[:200]!r}")
    if "error" in obj:
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise ServedError(runner, url, f"server error mid-stream: {str(msg)[:200]}")
    try:
        events.append(protocol.parse(obj, t_ms))
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise ServedError(runner, url, f"malformed SSE event ({e}): {data[:200]!r}") from None
