"""A streaming OpenAI completions server on a known schedule, built as many Python shims and
llama.cpp's server are: a thread per connection (the standard library's ThreadingHTTPServer),
`Connection: close`, the schedule's clock starting when the handler starts (issue 46).

    python tests/threaded_stub.py --port 0 [--ttft-ms 40 --step-ms 25 --tokens-per-step 4
        --backlog 1024 --hold-ms 0 --headers-with-first]

Prints `PORT n` once listening. POST /v1/completions streams `max_tokens` tokens: the first
step `ttft-ms` after the handler began, then one step every `step-ms`, each one SSE event of
`tokens-per-step` tokens, then a usage event and `[DONE]`. `--hold-ms`: the handler holds the
request that long before it answers its headers (a server's wait for a free worker: a hold
the client sees as the server's, and TTFT includes; the schedule's clock starts after it);
`--headers-with-first`: the headers go out with the first event (a server that answers only
once it has a token, where a client cannot tell its queue from its prefill). GET /log returns one record per
request, in the order they ended, with the server's own stamps (time.time() s, the wall clock
every process on the machine shares):

    accept_s    the listening thread's accept() returned the connection;
    handler_s   the connection's thread began (the schedule's clock starts here);
    read_s      the request's body was read;
    events_s    each step's event was written;
    prompt      the request's prompt (a client's own request id, to join the two sides).

From them the server's lateness splits in two: the wait between accept and the handler (the
accept thread and the thread start), and the handler's own lateness against the schedule
(first event minus handler start minus ttft-ms). What the server cannot stamp is the wait in
the kernel's accept queue before accept() returned: a client that stamps when its connection
was established measures it (accept_s minus that).
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer that stamps each accepted connection and keeps the request log."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], ttft_s: float, step_s: float, tokens_per_step: int, backlog: int = 1024,
                 hold_s: float = 0.0, headers_with_first: bool = False):
        self.request_queue_size = backlog  # listen(2)'s backlog (the standard library's default is 5)
        self.ttft_s, self.step_s, self.tokens_per_step = ttft_s, step_s, tokens_per_step
        self.hold_s, self.headers_with_first = hold_s, headers_with_first
        self.accepted: dict[int, float] = {}
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.accepted[id(request)] = time.time()
        super().process_request(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        self.handler_s = time.time()
        self.handler_perf = time.perf_counter()
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_GET(self) -> None:
        if self.path == "/log":
            with self.server.lock:
                self._send(200, json.dumps(self.server.log).encode())
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "stub-model", "object": "model"}]}).encode())
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def _chunk(self, text: str) -> None:
        data = text.encode()
        if getattr(self, "_headers_buffer", None):  # --headers-with-first: the headers and the first event in one write
            self._headers_buffer.append(b"\r\n")
            head = b"".join(self._headers_buffer)
            self._headers_buffer = []
        else:
            head = b""
        self.wfile.write(head + f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_POST(self) -> None:
        srv = self.server
        with srv.lock:
            accept_s = srv.accepted.pop(id(self.request), self.handler_s)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        record: dict[str, Any] = {"accept_s": accept_s, "handler_s": self.handler_s, "read_s": time.time(),
                                  "events_s": [], "prompt": body.get("prompt")}
        n = int(body.get("max_tokens", 16))
        if srv.hold_s:
            time.sleep(srv.hold_s)
            self.handler_perf = time.perf_counter()  # the schedule's clock starts once the hold is over
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        if not srv.headers_with_first:
            self.end_headers()  # written now (BaseHTTPRequestHandler buffers headers until flushed)
        self.close_connection = True
        k = max(1, srv.tokens_per_step)
        groups = [list(range(i, min(n, i + k))) for i in range(0, n, k)]
        try:
            for j, group in enumerate(groups):
                delay = self.handler_perf + srv.ttft_s + j * srv.step_s - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                choice = {"index": 0, "text": "".join(f" t{t}" for t in group), "logprobs": None,
                          "finish_reason": "length" if j == len(groups) - 1 else None}
                self._chunk("data: " + json.dumps({"id": "cmpl-stub", "object": "text_completion",
                                                   "model": "stub-model", "choices": [choice]}) + "\n\n")
                record["events_s"].append(time.time())
            usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
            self._chunk("data: " + json.dumps({"id": "cmpl-stub", "choices": [], "usage": usage}) + "\n\n")
            self._chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        with srv.lock:
            srv.log.append(record)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=40.0)
    ap.add_argument("--step-ms", type=float, default=25.0)
    ap.add_argument("--tokens-per-step", type=int, default=1)
    ap.add_argument("--backlog", type=int, default=1024, help="listen backlog (ThreadingHTTPServer's own default is 5)")
    ap.add_argument("--hold-ms", type=float, default=0.0, help="hold each request this long before answering")
    ap.add_argument("--headers-with-first", action="store_true", help="send the headers with the first event")
    a = ap.parse_args(argv)
    srv = Server(("127.0.0.1", a.port), a.ttft_ms / 1e3, a.step_ms / 1e3, a.tokens_per_step, a.backlog,
                 a.hold_ms / 1e3, a.headers_with_first)
    print(f"PORT {srv.server_address[1]}", flush=True)
    srv.serve_forever(poll_interval=0.05)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
