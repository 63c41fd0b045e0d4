"""A small fault-injecting streaming server for tests and benchmarks: OpenAI-compatible
(/v1/completions, vLLM's token_ids) and llama.cpp native
(/completion with tokens, stop_type and timings), plus /metrics (Prometheus text),
/props, /version, /v1/models and /log (what it received and when it sent each event).

Tokens stream on a known schedule: the first event `ttft_s` after the request arrived (the
event loop's delivery of its first bytes, so the stub's own backlog of reading requests at
concurrency does not count against the client), then one event every `itl_s`, each carrying `tokens_per_event` tokens (ids 10, 11, ... up
to max_tokens / n_predict). Event times are absolute from the request's arrival
(time.perf_counter, CLOCK_MONOTONIC: comparable across processes on Linux), so the
schedule does not drift.

Faults, chosen per request by the first prompt token id (Stub.faults: id -> fault):
  "http500" 500 before streaming   "http400" 400 with a JSON error body
  "malformed" a broken data line after 2 events   "no_final" the stream ends cleanly
  without the final event   "drop" the connection is cut mid-chunk after 2 events
  "slow" headers, then nothing for 60 s   "error_event" a data: {"error": ...} event
  "eos" the output ends with id 2 (EOS): finish "stop" / stop_type "eos"
  "word" llama.cpp stop_type "word" / OpenAI stop_reason "</end>"
  "stall" the request is read, then not a byte is sent (until the client leaves)
  "reset" the request is read, then the socket is closed with an RST (SO_LINGER 0)
  "stall_mid" 2 events, then nothing (headers and events came: a stall mid-stream)
Stub.fault_all, when set, is the fault of every generation request (whatever its prompt).
Stub.cycle, when set, makes the output ids repeat with that period (a text prompt lookup can copy).
Stub.slots, when set, is the server's capacity: at most that many requests generate at once,
the others wait (first come, first served) and their schedule starts when they get a slot, so
closed-loop throughput rises with concurrency up to `slots` and stays flat beyond it.
Stub.split_events sends each event's tokens as one event per token, back to back (as
llama-server streams a speculative step); Stub.replay (first prompt id -> SSE text) sends a
recorded stream verbatim, one event per itl_s (tests/data/served/<engine>_stream.txt).

Run in a thread (Stub().start(); .url; .stop()) or as a process:
    python tests/served_stub.py --port 0 [--ttft-ms 20 --itl-ms 5 --tokens-per-event 1 --split-events --slots 4]
(prints "PORT <n>" once listening).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

EOS_ID = 2
FIRST_ID = 10


@dataclass
class Stub:
    """The stub's settings (change them between runs) and what it observed."""

    ttft_s: float = 0.02
    itl_s: float = 0.005
    tokens_per_event: int = 1
    with_ids: bool = True          # OpenAI chunks carry vLLM's token_ids (False: SGLang-like, usage only)
    draft_n: int | None = None     # llama.cpp timings.draft_n in the final event (None: left out)
    draft_n_accepted: int | None = None
    faults: dict[int, str] = field(default_factory=dict)
    split_events: bool = False     # each step's tokens as one event per token, back to back (llama.cpp)
    replay: dict[int, str] = field(default_factory=dict)  # first prompt id -> SSE text sent verbatim, an event per itl
    fault_all: str | None = None   # the fault of every generation request (None: by first prompt id, `faults`)
    slots: int | None = None       # most requests generating at once (a server's capacity); the rest wait, FIFO
    cycle: int | None = None       # output ids repeat with this period (10, 11, 12, 10, ...): text a lookup can copy
    metrics_text: str = "# no metrics\n"
    # vLLM's spec-decode counters on /metrics, grown by every generation request: (its verification steps, each
    # proposing len(per_pos) tokens; of its steps, how many committed the proposal at each position). None: metrics_text
    vllm_counters: tuple[int, list[int]] | None = None
    # vLLM's per-request spec-decode metrics (detailed) in the final usage chunk: each request's steps' proposals and
    # accepted proposals (per_step_drafted, per_step_accepted). None: left out
    vllm_steps: tuple[list[int], list[int]] | None = None
    host: str = "127.0.0.1"
    port: int = 0
    # observed
    in_flight: int = 0
    max_in_flight: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)  # per request: path, body, headers, t_recv, t_events

    def __post_init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._slots: asyncio.Semaphore | None = None
        self._events: dict[tuple[Any, ...], str] = {}  # an event's JSON by what it carries (_event)
        self._done = 0  # generation requests answered (vllm_counters)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> "Stub":
        """Serve on a free port in a daemon thread; returns self once listening."""
        self._thread = threading.Thread(target=self._serve_forever, name="served-stub", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("stub server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> "Stub":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.max_in_flight = 0

    def _serve_forever(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(asyncio.start_server(self._handle, self.host, self.port, backlog=1024))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    async def serve(self) -> None:
        """Serve in the running loop until cancelled (the process entry point)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        print(f"PORT {self.port}", flush=True)
        async with self._server:
            await self._server.serve_forever()

    # -- HTTP -------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        arrived: list[float] = []  # when the bytes of the next request began to arrive (perf_counter s)
        feed = reader.feed_data

        def stamped(data: bytes) -> None:  # the protocol's data_received calls it as the loop delivers the bytes
            if not reader._buffer and not arrived:
                arrived.append(time.perf_counter())
            feed(data)

        reader.feed_data = stamped  # type: ignore[method-assign]
        try:
            while True:
                if reader._buffer and not arrived:  # delivered before this handler ran (a new connection's first request)
                    arrived.append(time.perf_counter())
                head = await reader.readuntil(b"\r\n\r\n")
                t_recv = arrived.pop() if arrived else time.perf_counter()
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                n = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(n) if n else b""
                self._t_body = time.perf_counter()
                keep = await self._route(method, path, headers, raw, t_recv, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    async def _plain(self, writer: asyncio.StreamWriter, status: int, body: str, ctype: str = "application/json") -> bool:
        data = body.encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}.get(status, "X")
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                     + data)
        await writer.drain()
        return True

    async def _route(self, method: str, path: str, headers: dict[str, str], raw: bytes, t_recv: float,
                     writer: asyncio.StreamWriter) -> bool:
        if method == "GET":
            if path == "/metrics":
                return await self._plain(writer, 200, self._metrics(), "text/plain; version=0.0.4")
            if path == "/props":
                return await self._plain(writer, 200, json.dumps({"build_info": "b0000-stub"}))
            if path == "/version":
                return await self._plain(writer, 200, json.dumps({"version": "0.0.0-stub"}))
            if path == "/v1/models":
                return await self._plain(writer, 200, json.dumps({"data": [{"id": "stub-model"}]}))
            if path == "/log":
                return await self._plain(writer, 200, json.dumps(self.requests))
            return await self._plain(writer, 404, '{"error": "not found"}')
        if path not in ("/v1/completions", "/completion"):
            return await self._plain(writer, 404, '{"error": "not found"}')
        body = json.loads(raw or b"{}")
        record = {"path": path, "body": body, "headers": headers, "t_recv": t_recv, "t_body": self._t_body, "t_events": []}
        with self._lock:
            self.requests.append(record)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        slot = None
        try:
            if self.slots:  # a request beyond the capacity waits for a slot; its schedule starts there
                if self._slots is None:
                    self._slots = asyncio.Semaphore(self.slots)
                slot = self._slots
                await slot.acquire()
                t_recv = time.perf_counter()
            return await self._generate(path, body, record, t_recv, writer)
        finally:
            if slot is not None:
                slot.release()
            with self._lock:
                self.in_flight -= 1
                self._done += 1

    def _metrics(self) -> str:
        """metrics_text, or vLLM's spec-decode counters after the generation requests done so far."""
        if self.vllm_counters is None:
            return self.metrics_text
        steps, per_pos = self.vllm_counters
        with self._lock:
            n = self._done
        lines = [f"vllm:spec_decode_num_drafts_total {n * steps}",
                 f"vllm:spec_decode_num_draft_tokens_total {n * steps * len(per_pos)}",
                 f"vllm:spec_decode_num_accepted_tokens_total {n * sum(per_pos)}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {n * a}'
                  for i, a in enumerate(per_pos)]
        return "\n".join(lines) + "\n"

    async def _generate(self, path: str, body: dict[str, Any], record: dict[str, Any], t_recv: float,
                        writer: asyncio.StreamWriter) -> bool:
        prompt = body.get("prompt")
        first = prompt[0] if isinstance(prompt, list) and prompt else None
        fault = self.faults.get(first) if isinstance(first, int) else None
        fault = self.fault_all or fault
        native = path == "/completion"
        n = int(body.get("n_predict") if native else body.get("max_tokens", 16))
        if fault == "stall":  # read, never answered: the client's timeout must end it
            await asyncio.sleep(3600)
            return False
        if fault == "reset":  # read, then an RST instead of an answer
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if fault == "http500":
            return await self._plain(writer, 500, '{"error": {"message": "stub: internal error", "code": 500}}')
        if fault == "http400":
            return await self._plain(writer, 400, '{"error": {"message": "stub: bad request (prompt too long)"}}')
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        if first in self.replay:
            events = [e + "\n\n" for e in self.replay[first].split("\n\n") if e.strip()]
            for j, event in enumerate(events):
                delay = t_recv + self.ttft_s + j * self.itl_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._chunk(writer, event)
                record["t_events"].append(time.perf_counter())
            await self._end(writer)
            return True
        if fault == "slow":
            await asyncio.sleep(60)
            return False
        ids = [FIRST_ID + (i % self.cycle if self.cycle else i) for i in range(n)]
        if fault == "eos" and ids:
            ids[-1] = EOS_ID
        k = max(1, self.tokens_per_event)
        groups = [ids[i:i + k] for i in range(0, len(ids), k)]
        for j, group in enumerate(groups):
            target = t_recv + self.ttft_s + j * self.itl_s
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if j == 2 and fault == "malformed":
                await self._chunk(writer, "data: {this is not json\n\n")
                return False
            if j == 2 and fault == "drop":
                writer.write(b"40\r\ndata: {\"cho")  # a chunk cut short, then the socket closes
                await writer.drain()
                writer.transport.abort()
                return False
            if j == 2 and fault == "stall_mid":
                await asyncio.sleep(3600)
                return False
            if j == 2 and fault == "error_event":
                await self._chunk(writer, 'data: {"error": {"message": "stub: out of memory", "code": 500}}\n\n')
                await self._end(writer)
                return True
            last = j == len(groups) - 1
            parts = [[t] for t in group] if self.split_events else [group]
            # one write for the step's events, so the thread running the stub cannot be paused between them
            await self._chunk(writer, "".join(
                self._event(native, part, last and not native and p == len(parts) - 1 and fault != "no_final",
                            fault, len(ids)) for p, part in enumerate(parts)))
            record["t_events"].append(time.perf_counter())
        if fault == "no_final":
            await self._end(writer)
            return True
        if native:
            await self._chunk(writer, self._native_final(fault, len(ids), len(body.get("prompt") or [])))
        else:
            if not groups:
                await self._chunk(writer, self._event(native, [], True, fault, 0))
            usage = {"prompt_tokens": len(prompt or []), "completion_tokens": len(ids),
                     "total_tokens": len(prompt or []) + len(ids)}
            # the usage event, [DONE] and the last chunk in one write (the stub's CPU per request, at concurrency)
            final: dict[str, Any] = {"id": "cmpl-stub", "choices": [], "usage": usage}
            if self.vllm_steps is not None:
                drafted, accepted = self.vllm_steps
                final["metrics"] = {"speculative_decoding": {
                    "num_spec_steps": len(drafted), "num_draft_tokens": sum(drafted),
                    "num_accepted_draft_tokens": sum(accepted), "per_step_drafted": drafted,
                    "per_step_accepted": accepted}}
            writer.write(self._frame("data: " + json.dumps(final) + "\n\n")
                         + self._frame("data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            return True
        await self._end(writer)
        return True

    def _event(self, native: bool, group: list[int], last: bool, fault: str | None, n: int) -> str:
        key = (native, tuple(group), last, fault, n, self.with_ids)
        event = self._events.get(key)
        if event is None:  # each event's JSON once (the stub keeps its schedule at concurrency 64 on 2 cores)
            event = self._events[key] = self._encode(native, group, last, fault, n)
        return event

    def _encode(self, native: bool, group: list[int], last: bool, fault: str | None, n: int) -> str:
        text = "".join(f" t{t}" for t in group)
        if native:
            obj: dict[str, Any] = {"index": 0, "content": text, "tokens": group, "stop": False, "id_slot": 0,
                                   "tokens_predicted": 0, "tokens_evaluated": 0}
        else:
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": None, "stop_reason": None}
            choice["text"] = text
            if self.with_ids:
                choice["token_ids"] = group
            if last:
                if fault == "eos":
                    choice["finish_reason"] = "stop"
                elif fault == "word":
                    choice["finish_reason"], choice["stop_reason"] = "stop", "</end>"
                else:
                    choice["finish_reason"] = "length"
            obj = {"id": "cmpl-stub", "object": "text_completion",
                   "model": "stub-model", "choices": [choice]}
        return "data: " + json.dumps(obj) + "\n\n"

    def _native_final(self, fault: str | None, n: int, n_prompt: int) -> str:
        timings: dict[str, Any] = {"cache_n": 0, "prompt_n": n_prompt, "prompt_ms": 1.0, "predicted_n": n,
                                   "predicted_ms": 1.0}
        if self.draft_n is not None:
            timings["draft_n"] = self.draft_n
            timings["draft_n_accepted"] = self.draft_n_accepted or 0
        stop_type = {"eos": "eos", "word": "word"}.get(fault or "", "limit")
        obj = {"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True, "model": "stub-model",
               "tokens_predicted": n, "tokens_evaluated": n_prompt, "stop_type": stop_type,
               "stopping_word": "</end>" if fault == "word" else "", "tokens_cached": n + n_prompt, "timings": timings}
        return "data: " + json.dumps(obj) + "\n\n"

    @staticmethod
    def _frame(text: str) -> bytes:
        data = text.encode()
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    async def _chunk(self, writer: asyncio.StreamWriter, text: str) -> None:
        writer.write(self._frame(text))
        await writer.drain()

    async def _end(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--tokens-per-event", type=int, default=1, help="tokens per step")
    ap.add_argument("--split-events", action="store_true", help="each step's tokens as one event per token")
    ap.add_argument("--slots", type=int, default=None, help="most requests generating at once (the rest wait)")
    args = ap.parse_args(argv)
    stub = Stub(ttft_s=args.ttft_ms / 1e3, itl_s=args.itl_ms / 1e3, tokens_per_event=args.tokens_per_event,
                port=args.port, split_events=args.split_events, slots=args.slots)
    try:
        try:
            import uvloop  # the process's loop reads and writes sockets in C: the stub keeps its schedule at concurrency
            run = uvloop.run
        except ImportError:
            run = asyncio.run
        run(stub.serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
