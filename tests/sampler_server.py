"""A small speculative-sampling server with injectable sampler faults, for the mutation tests
and the benchmark of served sampled exactness (tests/{unit,integration}/test_served_sampled.py,
benchmarks/served_sampled_exactness.py).

A tiny target and a tiny draft (random-weight Llamas from a config) behind the OpenAI
completions API, streaming vLLM's token_ids: POST /<fault>/v1/completions with the prompt as
token ids, max_tokens, seed and the law's fields (temperature, top_k, top_p, min_p). As real
engines do, the first output token comes from the prefill (the target alone, sampled from
its law); from the second on, the tests' one reference sampler (tests/reference.py,
speculative_sample: Leviathan et al. 2023, Algorithm 1; Chen et al. 2023) with
`num_draft_tokens` proposals a step, over the two models' logits. Laws are gate's own
(gate.core.law), so only the speculative sampler is under test.

Faults (the path's first segment; "none" or "fallback" for the correct sampler; "fallback"
never speculates):
  "no_temperature"  speculative positions ignore the temperature (T = 1 for p and q)
  "no_top_k"        speculative positions ignore top-k
  "residual_p"      a rejection samples p instead of the residual (the classic bug: Fault.RESIDUAL_IS_P)
  "accept_all"      every proposal is accepted (a relaxed / synthetic acceptance: the law is q; Fault.ACCEPT_ALL)
  "batch_residual"  residual_p, only while more than one request is in flight (drift at batch)

Every request draws from its own torch.Generator seeded with the request's seed. The logits
of a context are cached (the same short contexts recur across samples).
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from gate.core.law import Law, law_probs
from reference import Fault, LogitFn, speculative_sample

FAULTS = ("none", "no_temperature", "no_top_k", "residual_p", "accept_all", "batch_residual")


@dataclass
class Sampler:
    """Speculative sampling of `target` with `draft` (torch causal LMs), `num_draft_tokens` per step."""

    target: Any
    draft: Any
    num_draft_tokens: int = 3
    _cache: dict[tuple[str, tuple[int, ...]], torch.Tensor] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def logits(self, which: str, ids: list[int]) -> torch.Tensor:
        """The raw logits [V] of the token after `ids`, of the target or the draft (cached)."""
        key = (which, tuple(ids))
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        model = self.target if which == "target" else self.draft
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        with self._lock:
            self._cache[key] = logits
        return logits

    def law(self, which: str, ids: list[int], law: Law) -> torch.Tensor:
        """The law [V] of the token after `ids` under `law`, of the target or the draft."""
        return law_probs(self.logits(which, ids), law)

    def logit_fn(self, which: str, prompt: list[int]) -> LogitFn:
        """The target's or the draft's logits after `prompt` + an output prefix, as the reference
        sampler reads them (tests/reference.py's LogitFn), from the cache."""

        def fn(tokens: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
            return torch.stack([torch.stack([self.logits(which, prompt + row[:a].tolist()) for a in where.tolist()])
                                for row, where in zip(tokens, at)])

        return fn

    def generate(self, prompt: list[int], max_tokens: int, law: Law, seed: int, fault: str = "none",
                 batched: bool = False) -> list[int]:
        """Output ids [max_tokens]: the prefill's token, then speculative steps with `fault`
        (module docstring; "fallback": no speculation)."""
        g = torch.Generator().manual_seed(int(seed) % (2 ** 63))
        out = [int(torch.multinomial(self.law("target", prompt, law), 1, generator=g))]
        if fault == "fallback":
            while len(out) < max_tokens:
                out.append(int(torch.multinomial(self.law("target", prompt + out, law), 1, generator=g)))
            return out[:max_tokens]
        if max_tokens <= 1:
            return out[:max_tokens]
        ctx = prompt + out
        rest = speculative_sample(self.logit_fn("target", ctx), self.logit_fn("draft", ctx), _speculative_law(law, fault),
                                  self.num_draft_tokens, 1, max_tokens - 1, g, _reference_fault(fault, batched), ctx)
        return out + rest[0].tolist()

    def first_step_law(self, ctx: list[int], law: Law, fault: str = "none") -> torch.Tensor:
        """The exact law [V] of the first token a speculative step emits after `ctx` (output
        position 1 when `ctx` is the prompt and the prefill's token), under `fault`: what the
        tests at that position see. min(p, q) + (1 - beta) r with beta = sum min(p, q) and r
        the residual (Leviathan et al. 2023, Theorem 1); faults change p, q, r or acceptance.
        "batch_residual" is given unbatched (the correct law)."""
        p = self.law("target", ctx, law)
        if fault == "fallback":
            return p
        spec = _speculative_law(law, fault)
        ps, q = self.law("target", ctx, spec), self.law("draft", ctx, spec)
        if fault == "accept_all":
            return q
        accepted = torch.minimum(ps, q)
        beta = float(accepted.sum())
        resid = ps if fault == "residual_p" else torch.clamp(ps - q, min=0)
        return accepted + (1.0 - beta) * resid / resid.sum() if beta < 1.0 else accepted


def _speculative_law(law: Law, fault: str) -> Law:
    """The law a faulty sampler applies at speculative positions (to p and q alike)."""
    if fault == "no_temperature":
        return Law(law.name, 1.0, law.top_k, law.top_p, min_p=law.min_p)
    if fault == "no_top_k":
        return Law(law.name, law.temperature, None, law.top_p, min_p=law.min_p)
    return law


def _reference_fault(fault: str, batched: bool) -> Fault:
    """The reference sampler's fault for a server fault (module docstring)."""
    if fault == "residual_p" or (fault == "batch_residual" and batched):
        return Fault.RESIDUAL_IS_P
    return Fault.ACCEPT_ALL if fault == "accept_all" else Fault.NONE


class SamplerServer:
    """The HTTP server around a Sampler (module docstring): start(), .url, stop(); `in_flight`
    and `requests` (count) are observed."""

    def __init__(self, sampler: Sampler, host: str = "127.0.0.1"):
        self.sampler = sampler
        self.in_flight = 0
        self.requests = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - /v1/models, /version: nothing to say
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                fault = self.path.strip("/").split("/")[0]
                if fault not in (*FAULTS, "fallback") or not self.path.endswith("/v1/completions"):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with server._lock:
                    server.in_flight += 1
                    server.requests += 1
                    batched = server.in_flight > 1
                try:
                    k = int(body.get("top_k") or 0)
                    law = Law("law", float(body.get("temperature", 1.0)), k if k > 0 else None,
                              float(body.get("top_p", 1.0)), min_p=float(body.get("min_p") or 0.0) or None)
                    ids = server.sampler.generate([int(t) for t in body["prompt"]], int(body.get("max_tokens", 16)), law,
                                                  int(body.get("seed", 0)), fault, batched)
                finally:
                    with server._lock:
                        server.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                events = [{"choices": [{"index": 0, "text": f" t{t}", "token_ids": [t], "finish_reason": None}]}
                          for t in ids]
                events[-1]["choices"][0]["finish_reason"] = "length"
                events.append({"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                                        "completion_tokens": len(ids)}})
                chunks = [f"data: {json.dumps(ev)}\n\n".encode() for ev in events] + [b"data: [DONE]\n\n"]
                # one write (the stream's timing is not under test): no small-write Nagle delays
                self.wfile.write(b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n")
                self.wfile.flush()

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        self._httpd = ThreadingHTTPServer((host, 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://{host}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def start(self) -> "SamplerServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "SamplerServer":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
