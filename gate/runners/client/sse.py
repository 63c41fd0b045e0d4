"""Server-sent events (the WHATWG EventSource format) read incrementally from byte chunks.

Lines split on bytes (cheaper per event than httpx's aiter_lines text decoding); lines end
in \\n or \\r\\n (a lone \\r, which the SSE spec also allows, is not supported). A comment
(":", llama.cpp's keep-alive ping) and the fields event, id and retry are skipped."""

from __future__ import annotations

from collections.abc import Iterator


class SSEReader:
    """The data payloads of an SSE stream fed in chunks: feed(chunk) yields the payloads a
    blank line completed in it, each as its line is read (several data lines of one event
    joined by newlines), end() the last payload when the stream ends without its blank
    line. Both raise ValueError naming a malformed line (its first 200 bytes)."""

    def __init__(self) -> None:
        self._pending = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> Iterator[str]:
        """The payloads completed by `chunk`, in order, each yielded as soon as its blank
        line is read (so its arrival time is taken then). Raises ValueError, at its place in
        the chunk, for a line that is neither data, a comment, nor another SSE field."""
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if self._data:
                    data, self._data = "\n".join(self._data), []
                    yield data
            elif line.startswith(b"data:"):
                value = line[5:].decode("utf-8", errors="replace")
                self._data.append(value[1:] if value.startswith(" ") else value)
            elif not line.startswith(b":") and line.partition(b":")[0] not in (b"event", b"id", b"retry"):
                raise ValueError(f"malformed SSE line: {line[:200].decode('utf-8', 'replace')!r}")

    def end(self) -> str | None:
        """The payload left when the stream ended (None: none). Raises ValueError when the
        stream ended inside a line."""
        if self._pending.strip():
            raise ValueError(f"stream ended inside a line: {self._pending[:200].decode('utf-8', 'replace')!r}")
        return "\n".join(self._data) if self._data else None
