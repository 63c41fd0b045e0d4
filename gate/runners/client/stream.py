"""One served request's stream read into a StreamResult.

Timing: t0 = time.perf_counter() just before the request is sent; each SSE event's arrival
time (ms from t0) is given to every token it carries (vLLM's serving benchmark times chunks
the same way). Token counts never come from the number of events: ids come from the stream
("token_ids" / "tokens"); else counts come from usage.completion_tokens (or llama.cpp's
tokens_predicted) spread over the events by the text each carried (count_tokens), and the
ids are then unknown (UNKNOWN_ID placeholders). Bursts: consecutive tokens closer than
burst_gap_ms are one burst, the client's view of one verification step
(StreamResult.step_committed).

Every failure is a ServedError naming the runner, the URL and what failed (a transport
failure: classify_transport).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import httpx

from gate.measure.contention import load_average, read_pressure
from gate.records import UNKNOWN_ID
from gate.runners.client.parse import Event
from gate.runners.client.protocol import Protocol
from gate.runners.client.sse import SSEReader
from gate.runners.client.transport import RequestProgress, ServedError, classify_transport
from gate.runners.interface import StreamResult



def bursts(times_ms: Sequence[float], gap_ms: float) -> list[int]:
    """Sizes of the bursts of token arrival times (ms, non-decreasing): consecutive tokens
    less than `gap_ms` apart are one burst (tokens of one SSE event are 0 ms apart). The
    sizes sum to len(times_ms); [] for no tokens."""
    sizes: list[int] = []
    prev = -math.inf
    for t in times_ms:
        if sizes and t - prev < gap_ms:
            sizes[-1] += 1
        else:
            sizes.append(1)
        prev = t
    return sizes


@dataclass(frozen=True)
class StreamClient:
    """Streams one runner's requests to one URL and reads each into a StreamResult.

    `runner`: the runner name errors carry; `url`: the generation URL; `protocol`: what the
    stream's events are; `headers`: sent with each request; `timeout_s`: per request, from
    send to the end of the stream; `burst_gap_ms`: tokens closer than this form one burst;
    `eos_token_ids`: the target's end ids (a finish "stop" whose last token is one is
    "eos"); `count_tokens`: text -> number of tokens, for streams that carry no ids."""

    runner: str
    url: str
    protocol: Protocol
    headers: dict[str, str]
    timeout_s: float
    burst_gap_ms: float
    eos_token_ids: frozenset[int]
    count_tokens: Callable[[str], int] | None = None

    async def request(self, client: httpx.AsyncClient, body: dict[str, Any], scheduled_s: float) -> StreamResult:
        """POST `body` on `client` and read its stream; `scheduled_s`: perf_counter seconds
        the request was due (its queue time runs from there to the send). A kept-alive
        connection the server closed as the request went out is retried once on a new one.
        Raises ServedError for every failure (kind set for a transport failure)."""
        progress = RequestProgress()
        try:
            try:
                return await asyncio.wait_for(self._stream(client, body, scheduled_s, progress), self.timeout_s)
            except httpx.RemoteProtocolError as e:
                if "without sending a response" not in str(e) or progress.fresh:
                    raise
                # A kept-alive connection the server closed as the request went out (cpp-httplib closes
                # idle ones): nothing was received, so the request is sent once more on a new connection,
                # timed from its own send (the queue time includes the lost attempt).
                progress.restart()
                return await asyncio.wait_for(self._stream(client, body, scheduled_s, progress), self.timeout_s)
        except ServedError:
            raise
        except (asyncio.TimeoutError, httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as e:
            kind, what = classify_transport(e, progress, time.perf_counter(), self.timeout_s)
            raise ServedError(self.runner, self.url, what, kind=kind) from None
        except httpx.HTTPError as e:
            raise ServedError(self.runner, self.url, f"{type(e).__name__}: {e}") from None

    async def _stream(self, client: httpx.AsyncClient, body: dict[str, Any], scheduled_s: float,
                      progress: RequestProgress) -> StreamResult:
        events: list[Event] = []
        reader = SSEReader()
        started_s = time.time()
        pressure0 = read_pressure()  # the machine's CPU pressure over the request's wall time (contention)
        t0 = time.perf_counter()
        queue_ms = max(0.0, (t0 - scheduled_s) * 1e3)
        progress.t0 = t0
        async with client.stream("POST", self.url, json=body, headers=self.headers,
                                 extensions={"trace": progress.trace}) as resp:
            progress.headers_s = time.perf_counter()
            if resp.status_code >= 400:
                text = (await resp.aread()).decode("utf-8", errors="replace")
                raise ServedError(self.runner, self.url, f"HTTP {resp.status_code}: {text[:200]}")
            try:
                async for chunk in resp.aiter_bytes():
                    progress.last_s = time.perf_counter()
                    for data in reader.feed(chunk):
                        n = len(events)
                        self._dispatch(data, t0, events)
                        if len(events) > n:
                            progress.events += 1
                            progress.tokens += len(events[-1].ids or ())
                data = reader.end()
            except ValueError as e:  # the SSE framing is broken
                raise ServedError(self.runner, self.url, str(e)) from None
            if data is not None:
                self._dispatch(data, t0, events)
        e2el_ms = (time.perf_counter() - t0) * 1e3
        result = self._result(events, started_s, e2el_ms, queue_ms)
        pressure1 = read_pressure()
        if pressure0 is not None and pressure1 is not None:
            result.cpu_stall_ms = (pressure1.total_us - pressure0.total_us) / 1e3
        result.load_avg_1m = load_average()
        return result

    def _dispatch(self, data: str, t0: float, events: list[Event]) -> None:
        """Parse one SSE data payload (arrived now) into `events`; OpenAI's "[DONE]" carries nothing."""
        t_ms = (time.perf_counter() - t0) * 1e3
        if data.strip() == "[DONE]":
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            raise ServedError(self.runner, self.url, f"malformed SSE event: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise ServedError(self.runner, self.url, f"malformed SSE event (not a JSON object): {data[:200]!r}")
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise ServedError(self.runner, self.url, f"server error mid-stream: {str(msg)[:200]}")
        try:
            events.append(self.protocol.parse(obj, t_ms))
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ServedError(self.runner, self.url, f"malformed SSE event ({e}): {data[:200]!r}") from None

    def _result(self, events: list[Event], started_s: float, e2el_ms: float, queue_ms: float) -> StreamResult:
        finals = [e for e in events if e.final]
        if not finals:
            raise ServedError(self.runner, self.url, "stream ended without the final event")
        last = finals[-1]
        if (last.finish or "").lower() in ("abort", "error", "cancelled"):
            raise ServedError(self.runner, self.url, f"the server ended the request with finish reason {last.finish!r}")
        usage = next((e.usage_tokens for e in reversed(events) if e.usage_tokens is not None), None)
        carried = [e for e in events if e.ids or e.text]
        if carried and all(e.ids is not None for e in carried) or (not carried and any(e.ids is not None for e in events)):
            ids = [t for e in carried for t in (e.ids or [])]
            times = [e.t_ms for e in carried for _ in (e.ids or [])]
        else:
            ids, times = self._counted(carried, usage)
        reason, stop_string = self._stop_reason(last, ids)
        draft_n = next((e.draft_n for e in reversed(events) if e.draft_n is not None), None)
        accepted_n = next((e.draft_n_accepted for e in reversed(events) if e.draft_n_accepted is not None), None)
        if self.protocol.reports_drafts and draft_n is None:
            draft_n, accepted_n = 0, 0  # llama.cpp leaves draft_n out when no proposal was made
        return StreamResult(output_ids=ids, token_times_ms=times, stop_reason=reason, e2el_ms=e2el_ms,
                            started_s=started_s, stop_string=stop_string,
                            step_committed=bursts(times, self.burst_gap_ms), queue_ms=queue_ms,
                            server_draft_tokens=draft_n, server_accepted_tokens=accepted_n)

    def _counted(self, carried: list[Event], usage: int | None) -> tuple[list[int], list[float]]:
        """Token times when the stream carried text but no ids: the total from usage (or
        count_tokens over the text), spread over the events by their text's token counts."""
        weights = [float(self.count_tokens(e.text)) if self.count_tokens else 1.0 for e in carried]
        total = usage if usage is not None else (int(sum(weights)) if self.count_tokens else None)
        if total is None:
            raise ServedError(self.runner, self.url, "the stream carried no token ids and no usage: cannot count tokens "
                                                     "(send return_token_ids / stream_options.include_usage, or give "
                                                     "count_tokens)")
        if total == 0:
            return [], []
        if not carried:
            raise ServedError(self.runner, self.url, f"usage says {total} tokens but no event carried output")
        if sum(weights) <= 0:
            weights = [1.0] * len(carried)
        cum, acc = [], 0.0
        for w in weights:
            acc += w
            cum.append(acc / sum(weights))
        times, j = [], 0
        for k in range(total):
            while j < len(cum) - 1 and cum[j] < (k + 0.5) / total:
                j += 1
            times.append(carried[j].t_ms)
        return [UNKNOWN_ID] * total, times

    def _stop_reason(self, last: Event, ids: list[int]) -> tuple[str, str | None]:
        """gate's stop reason from a final event: "eos", "stop" (with its string) or "length"."""
        finish = (last.finish or "").lower()
        if finish in ("length", "limit"):
            return "length", None
        if finish == "word" or (finish == "stop" and last.stop_string):
            return "stop", last.stop_string
        if finish in ("eos", "stop"):
            return "eos", None
        return (("eos", None) if ids and ids[-1] in self.eos_token_ids else ("length", None))
