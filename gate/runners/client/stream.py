"""One served request's stream read into a StreamResult, in gate's own process, from the raw
chunks a client worker moved (gate.runners.client.transfer).

Timing: t0 = time.perf_counter() when the request left (RawStream.sent_s: its one write handed
to the transport, gate.runners.client.transfer); connection set-up is timed apart,
ClientTiming.send_ms and connect_ms; each chunk was stamped as its bytes reached the worker, and each
SSE event's time (ms from t0) is its completing chunk's, given to every token it carries
(vLLM's serving benchmark times chunks the same way). Token counts never come from the number of events: ids come from
the stream
("token_ids" / "tokens"); else counts come from usage.completion_tokens (or llama.cpp's
tokens_predicted) spread over the events by the text each carried (count_tokens), and the
ids are then unknown (UNKNOWN_ID placeholders). Bursts: consecutive tokens closer than
burst_gap_ms are one burst, the client's view of one verification step
(StreamResult.step_committed).

Every failure is a ServedError naming the runner, the URL and what failed (a transport
failure: classify_transport).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gate.records import UNKNOWN_ID
from gate.runners.client.events import events_of
from gate.runners.client.parse import Event
from gate.runners.client.protocol import Protocol
from gate.runners.client.transfer import RawStream
from gate.runners.client.transport import ServedError
from gate.runners.result import ClientTiming, StreamResult


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
    """Reads one runner's responses (RawStream) into StreamResults.

    `runner`: the runner name errors carry; `url`: the generation URL; `protocol`: what the
    stream's events are; `burst_gap_ms`: tokens closer than this form one burst;
    `eos_token_ids`: the target's end ids (a finish "stop" whose last token is one is
    "eos"); `count_tokens`: text -> number of tokens, for streams that carry no ids."""

    runner: str
    url: str
    protocol: Protocol
    burst_gap_ms: float
    eos_token_ids: frozenset[int]
    count_tokens: Callable[[str], int] | None = None

    def read(self, raw: RawStream) -> StreamResult:
        """The StreamResult of a response a worker moved (gate.runners.client.transfer): its
        events parsed, each stamped with its completing chunk's arrival, times in ms from when
        the request left (RawStream.sent_s); ClientTiming from the milestones. Raises ServedError for
        broken SSE framing, a malformed or error event, or a stream without its final event."""
        events = self._events(raw.chunks, raw.sent_s, final=True)
        result = self._result(
            events, raw.started_s, (raw.end_s - raw.sent_s) * 1e3, max(0.0, (raw.begin_s - raw.scheduled_s) * 1e3)
        )
        result.client = ClientTiming(
            schedule_lag_ms=max(0.0, (raw.begin_s - raw.due_s) * 1e3),
            send_ms=(raw.sent_s - raw.begin_s) * 1e3,
            connect_ms=raw.connect_ms,
            loop_lag_ms=raw.loop_lag_ms,
            worker=raw.worker,
            server_output_tokens=next((e.usage_tokens for e in reversed(events) if e.usage_tokens is not None), None),
            server_prefill_ms=next((e.prefill_ms for e in events if e.prefill_ms is not None), None),
            server_tpot_ms=next((e.tpot_ms for e in events if e.tpot_ms is not None), None),
            server_cached_tokens=next((e.cached_tokens for e in events if e.cached_tokens is not None), None),
            events=len(events),
            headers_ms=None if raw.headers_s is None else (raw.headers_s - raw.sent_s) * 1e3,
        )
        result.cpu_stall_ms = raw.cpu_stall_ms
        result.load_avg_1m = raw.load_avg_1m
        return result

    def _events(self, chunks: list[tuple[float, bytes]], t0: float, final: bool) -> list[Event]:
        return events_of(self.runner, self.url, self.protocol, chunks, t0, final)

    def _result(self, events: list[Event], started_s: float, e2el_ms: float, queue_ms: float) -> StreamResult:
        finals = [e for e in events if e.final]
        if not finals:
            raise ServedError(self.runner, self.url, "stream ended without the final event")
        last = finals[-1]
        if (last.finish or "").lower() in ("abort", "error", "cancelled"):
            raise ServedError(self.runner, self.url, f"the server ended the request with finish reason {last.finish!r}")
        usage = next((e.usage_tokens for e in reversed(events) if e.usage_tokens is not None), None)
        carried = [e for e in events if e.ids or e.text]
        if (
            carried
            and all(e.ids is not None for e in carried)
            or (not carried and any(e.ids is not None for e in events))
        ):
            ids = [t for e in carried for t in (e.ids or [])]
            times = [e.t_ms for e in carried for _ in (e.ids or [])]
        else:
            ids, times = self._counted(carried, usage)
        reason, stop_string = self._stop_reason(last, ids)
        draft_n = next((e.draft_n for e in reversed(events) if e.draft_n is not None), None)
        accepted_n = next((e.draft_n_accepted for e in reversed(events) if e.draft_n_accepted is not None), None)
        if self.protocol.reports_drafts and draft_n is None:
            draft_n, accepted_n = 0, 0  # llama.cpp leaves draft_n out when no proposal was made
        steps = next((e for e in reversed(events) if e.step_drafted is not None), None)
        return StreamResult(
            output_ids=ids,
            token_times_ms=times,
            stop_reason=reason,
            e2el_ms=e2el_ms,
            started_s=started_s,
            stop_string=stop_string,
            step_committed=bursts(times, self.burst_gap_ms),
            queue_ms=queue_ms,
            server_draft_tokens=draft_n,
            server_accepted_tokens=accepted_n,
            server_step_proposed=steps.step_drafted if steps else None,
            server_step_accepted=steps.step_accepted if steps else None,
        )

    def _counted(self, carried: list[Event], usage: int | None) -> tuple[list[int], list[float]]:
        """Token times when the stream carried text but no ids: the total from usage (or
        count_tokens over the text), spread over the events by their text's token counts."""
        weights = [float(self.count_tokens(e.text)) if self.count_tokens else 1.0 for e in carried]
        total = usage if usage is not None else (int(sum(weights)) if self.count_tokens else None)
        if total is None:
            raise ServedError(
                self.runner,
                self.url,
                "the stream carried no token ids and no usage: cannot count tokens "
                "(send return_token_ids / stream_options.include_usage, or give "
                "count_tokens)",
            )
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
        return ("eos", None) if ids and ids[-1] in self.eos_token_ids else ("length", None)
