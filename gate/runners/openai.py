"""The OpenAI-compatible served runner: gate as a streaming HTTP client of a serving engine
(vLLM, SGLang, TensorRT-LLM, llama.cpp's server), one endpoint per runner name.

An Endpoint names where a runner name is served, the protocol it speaks (Endpoint.api:
gate.runners.client.protocol: "completions", or llama.cpp's native "llama_cpp") and the
engine behind it (gate.runners.engines: whose counter names /metrics has, how the law and
the constraint go on the wire, what it cannot apply as gate does). The streaming client
(its worker processes, connections, stream parsers and how a transport failure is named)
is gate.runners.client; this module splits a load point over its workers
(gate.load.schedule), reads each response as it ends, keeps the breaker, and asks the
endpoint's engine for everything that depends on it.

Every failure of a request is a ServedError naming the runner, the URL and what failed; it
becomes that request's result and the other requests go on. A transport failure says which
of refused at connect, reset before the response, reset mid-stream, timed out before the
first byte, timed out mid-stream it was, with the errno and what had arrived
(gate.runners.client.transport.classify_transport); after max_consecutive_failures of them
in a row the load point's requests not yet sent fail at once. The kernel's listen-queue
overflows during a run() call become a note (observed(), gate.runners.netstat).

The declared law travels whole in every request, each field explicit where the engine is
verified (a server's defaults, e.g. vLLM's generation_config.json or llama.cpp's top_k 40 /
min_p 0.05, never apply), with the request's constraint (its prompt's response_format).
What a server cannot apply as gate's law defines it is refused before anything is sent
(OpenAIRunner.law_refusals; `gate validate` names the policy field).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gate.core.requests import Request
from gate.load.interface import LoadStrategy
from gate.load.schedule import split
from gate.metrics.catalogue import MetricNames
from gate.records import UNKNOWN_ID, ClientWorkerRecord, ServerRecord
from gate.runners.client.protocol import PROTOCOLS, protocol
from gate.runners.client.stream import StreamClient
from gate.runners.client.transfer import RawStream
from gate.runners.client.transport import TRANSPORT_KINDS, Breaker, ServedError
from gate.runners.client.worker import NOT_SENT, Job
from gate.runners.client.workers import DISPATCH_BYTES_PER_S, START_LEAD_S, PoolError, client_workers, shared_pool
from gate.runners.engines.interface import Engine
from gate.runners.engines.registry import engine, engine_names
from gate.runners.interface import Capabilities, Done, Ended, Observed, RequestResult, Runner, RunnerSpecBase
from gate.runners.netstat import listen_counters, listen_note
from gate.runners.registry import register
from gate.runners.server_metrics import ServerSnapshot, parse_metrics

__all__ = ["Endpoint", "OpenAIRunner", "ServedError", "TRANSPORT_KINDS", "UNKNOWN_ID", "describe_load"]


@dataclass(frozen=True)
class Endpoint:
    """Where one runner name is served. `base_url`: scheme, host and port, no trailing /v1;
    `model`: the served model name sent as "model" (None: not sent); `metrics_url`: its
    Prometheus text endpoint (None: no server counters); `api`: the protocol
    (gate.runners.client.protocol); `engine`: the engine serving it, a name of
    gate.runners.engines.registry (its counter names, its wire fields, its refusals);
    `api_key_env`: the environment variable holding the API key, sent as
    "Authorization: Bearer ..." (the key itself is never stored in a record). Raises
    ValueError for an unknown api or engine, or a base_url that is not http(s)."""

    base_url: str
    model: str | None = None
    metrics_url: str | None = None
    api: str = "completions"
    engine: str = "generic"
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        protocol(self.api)
        if self.engine not in engine_names():
            raise ValueError(f"unknown engine {self.engine!r}; known: {', '.join(engine_names())}")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")

    @property
    def url(self) -> str:
        """The generation URL of `api`."""
        return self.base_url.rstrip("/") + PROTOCOLS[self.api].path

    @property
    def dialect(self) -> Engine:
        """The engine whose sampling definitions and wire fields the server follows: the
        protocol's own engine where it has one (llama.cpp's native api), else `engine`."""
        return engine(PROTOCOLS[self.api].engine or self.engine)


def constraint_of(req: Request) -> Any:
    """The request's constraint: its prompt's response_format (a
    gate.constraints.interface.ResponseFormat), None when unconstrained."""
    return req.prompt.response_format


def describe_load(load: LoadStrategy) -> str:
    """'concurrency 4' (closed loop) or 'request rate 8/s' (open loop, with its cap)."""
    if load.request_rate is not None:
        cap = f" (at most {load.concurrency} in flight)" if load.concurrency is not None else ""
        return f"request rate {load.request_rate:g}/s{cap}"
    return f"concurrency {load.concurrency}" if load.concurrency is not None else "unbounded concurrency"


class EndpointSpec(BaseModel):
    """One runner's OpenAI-compatible server (runner kind openai)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    base_url: str = Field(..., pattern=r"^https?://", description="Server root, e.g. 'http://127.0.0.1:8000' (no /v1).")
    model: str | None = Field(None, description="Served model name sent as `model`.")
    metrics_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="Prometheus text endpoint for spec-decode "
        "counters, e.g. 'http://127.0.0.1:8000/metrics'; without it a draft runner has no "
        "server-side acceptance figures.",
    )
    api: Literal[tuple(PROTOCOLS)] = Field(  # type: ignore[valid-type]
        "completions",
        description="completions: /v1/completions with token-id prompts (the chat template is applied by "
        "gate, as for every runner); llama_cpp: llama.cpp's native /completion (token ids and per-response draft "
        "counts "
        "come back).",
    )
    engine: Literal[tuple(engine_names())] = Field(  # type: ignore[valid-type]
        "generic", description="Which engine's counter names to read from metrics_url."
    )

    @field_validator("base_url")
    @classmethod
    def _root_only(cls, url: str) -> str:
        """A base_url whose path ends in an API path gate adds itself (/v1, /v1/completions,
        /completion, ... whichever api) would be sent to '.../v1/v1/completions': refused here,
        not as a 404 on every request. A proxy's prefix ('http://host/llm') is kept."""
        path = urlsplit(url).path.rstrip("/").lower()
        tail = next((t for t in API_PATHS if path.endswith(t)), None)
        if tail is not None:
            cut = urlsplit(url)
            root = f"{cut.scheme}://{cut.netloc}{urlsplit(url).path.rstrip('/')[: len(path) - len(tail)]}"
            raise ValueError(
                f"base_url {url!r} ends in {tail!r}, an API path gate adds itself (api completions: "
                f"<base_url>{PROTOCOLS['completions'].path}, api llama_cpp: "
                f"<base_url>{PROTOCOLS['llama_cpp'].path}): give the server root, {root!r}"
            )
        return url


# Paths an OpenAI-compatible or llama.cpp server answers on, longest first: a base_url must not end in one.
API_PATHS = tuple(
    sorted(
        {"/v1", "/v1/chat/completions", "/completions", "/chat/completions", *(p.path for p in PROTOCOLS.values())},
        key=len,
        reverse=True,
    )
)


class ServedRunnerSpec(RunnerSpecBase):
    """What every served runner kind reads from the policy: request time limits, the breaker,
    fixed output lengths and the burst rule."""

    request_timeout_s: float = Field(120.0, gt=0, description="Seconds one request may take before it is an error.")
    max_consecutive_failures: int = Field(
        3,
        ge=1,
        description="After this many requests in a row (in the order they "
        "ended) failed by timeout or a failed connection (not an HTTP error status or "
        "a malformed stream), the load point's requests not yet sent are errors at "
        "once, so a runner that keeps failing stops costing request_timeout_s per "
        "request.",
    )
    ignore_eos: bool = Field(
        True, description="Ask the server for fixed output lengths (max_new_tokens every time) where it allows."
    )
    burst_gap_ms: float = Field(
        1.0,
        ge=0,
        description="Streamed tokens closer than this (ms) are one burst: one "
        "verification step as the client sees it (llama-server sends one event per token).",
    )
    client_workers: int | None = Field(
        None,
        ge=1,
        description="Client worker processes sending the requests, each "
        "with its own event loop and connections (unset: one per "
        "2 streams in flight, at most one per CPU gate may use).",
    )


class OpenAIRunnerSpec(ServedRunnerSpec):
    """runner.kind openai: any OpenAI-compatible server, one endpoint per runner name."""

    kind: Literal["openai"]
    endpoints: dict[str, EndpointSpec] = Field(
        default_factory=dict, description="'fallback' and every draft name -> its endpoint."
    )
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The environment variable holding the API key (sent as a bearer token, never written to a report).",
    )

    def policy_problems(self, policy: Any) -> list[tuple[str, str]]:
        """Every runner (the fallback and each draft) has an endpoint, and every endpoint a runner."""
        import difflib

        names = ["fallback", *policy.drafts]
        problems = [
            (
                "runner.endpoints",
                f"no endpoint for runner {name!r}: every runner (fallback and each draft) names its server",
            )
            for name in names
            if name not in self.endpoints
        ]
        for name in self.endpoints:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                problems.append(
                    (
                        f"runner.endpoints.{name}",
                        f"unknown runner {name!r}; runners: {', '.join(names)}"
                        + (f" (did you mean {close[0]!r}?)" if close else ""),
                    )
                )
        return problems

    def policy_warnings(self, policy: Any) -> list[tuple[str, str]]:
        """A draft endpoint at the fallback's own base_url (an A/A check, or a draft pointed at the
        plain server: it cannot speculate), and one whose proposals gate cannot count (an api
        without per-response draft counts and no metrics_url): whether it speculated cannot be
        told, so a plain server behind it would pass (gate.measure.speculation)."""
        out = []
        fallback = self.endpoints.get("fallback")
        for name, ep in self.endpoints.items():
            if name == "fallback" or name not in policy.drafts:
                continue
            if fallback is not None and ep.base_url.rstrip("/") == fallback.base_url.rstrip("/"):
                out.append(
                    (
                        f"runner.endpoints.{name}.base_url",
                        f"draft {name!r} is served at the fallback's own URL "
                        f"{ep.base_url!r}: a server that serves the fallback does not speculate, so every rule on "
                        f"{name!r} will be an error (speculation did not run), unless this is an A/A check",
                    )
                )
            elif ep.metrics_url is None and not PROTOCOLS[ep.api].reports_drafts:
                out.append(
                    (
                        f"runner.endpoints.{name}",
                        f"gate cannot count the proposals of draft {name!r} (api "
                        f"{ep.api!r} returns no per-response draft counts, and no metrics_url is given): whether it "
                        "speculated cannot be checked, so a server without speculation behind it would pass; give "
                        "its metrics_url (or use api llama_cpp on llama-server)",
                    )
                )
        return out


# Metrics only a runner at load points measures (Metric.measured_by "load_points"): windows of
# requests in flight together.
SERVED_METRICS = MetricNames(lambda m: m.measured_by == "load_points")


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

    Raises ValueError for request_timeout_s <= 0 or max_consecutive_failures < 1. observed()
    says when the kernel counted listen-queue overflows during a run() call
    (gate.runners.netstat).
    """

    capabilities = Capabilities(
        token_ids=True,
        step_counters=False,
        seeding=True,
        first_steps=False,
        cpu_accounting=False,
        max_concurrency=4096,
        server_counters=True,
        in_process=False,
        load_points=True,
        interleaves=False,
        metrics=SERVED_METRICS,
        metrics_note="is measured on served runners at a load point; set runner.kind to {kinds}",
    )
    spec: ClassVar[type[RunnerSpecBase]] = OpenAIRunnerSpec

    @classmethod
    def from_plan(cls, plan: Any, local: Any = None) -> OpenAIRunner:
        """The endpoints of plan.policy.runner (runner.endpoints: one per runner name), with
        the target tokenizer's end ids (gate.models.loading.eos_token_ids)."""
        from gate.models.loading import eos_token_ids

        spec = plan.policy.runner
        endpoints = {
            name: Endpoint(e.base_url, e.model, e.metrics_url, e.api, e.engine, spec.api_key_env)
            for name, e in spec.endpoints.items()
        }
        return cls(
            endpoints,
            eos_token_ids(plan.tokenizer),
            request_timeout_s=spec.request_timeout_s,
            ignore_eos=spec.ignore_eos,
            burst_gap_ms=spec.burst_gap_ms,
            max_consecutive_failures=spec.max_consecutive_failures,
            client_workers=spec.client_workers,
        )

    @classmethod
    def check_plan(cls, plan: Any) -> None:
        """The API key's variable is set (runner.api_key_env), the runner's configuration
        builds (from_plan: nothing started or sent) and every declared law and constraint is
        one its servers apply as gate does (gate.runners.refusals.check_law_refusals).
        Raises PolicyValueError at the YAML path."""
        from gate.core.errors import PolicyValueError
        from gate.runners.refusals import check_law_refusals

        spec = plan.policy.runner
        if spec.api_key_env and not os.environ.get(spec.api_key_env):
            raise PolicyValueError(
                "runner.api_key_env",
                f"the environment variable {spec.api_key_env} is not set (it holds the API key the servers expect)",
            )
        check_law_refusals(plan, cls.from_plan(plan))

    def describe(self, runner: str) -> ServerRecord | None:
        """The runner's endpoint, the command line of a server gate started, the version the
        server gives and its peak RSS, where known (ServerRecord); never raises."""

        def safe(get: Callable[[], Any]) -> Any:
            try:
                return get()
            except Exception:  # noqa: BLE001 - informative only
                return None

        method = safe(lambda: self.verification(runner))
        pool = safe(lambda: self.kv_pool(runner)) or {}
        device_bytes, device_note = safe(lambda: self.device_memory_bytes(runner)) or (None, None)
        return ServerRecord(
            runner,
            self.kind,
            safe(lambda: self.endpoint(runner).base_url),
            safe(lambda: self.command_line(runner)),
            safe(lambda: self.server_info(runner)),
            safe(lambda: self.peak_rss_bytes(runner)),
            method[0] if method else None,
            method[1] if method else None,
            pool.get("tokens"),
            pool.get("bytes"),
            pool.get("dtype"),
            safe(lambda: self.server_slots(runner)),
            device_bytes,
            device_note,
        )

    def server_slots(self, runner: str) -> int | None:
        """Requests `runner`'s server admits at once, where it says: llama.cpp's /props
        total_slots, for a protocol that reads /props (waits min(5 s, request_timeout_s));
        None otherwise."""
        ep = self.endpoint(runner)
        if "/props" not in PROTOCOLS[ep.api].info_paths:
            return None
        self.open()
        try:
            resp = httpx.get(
                ep.base_url.rstrip("/") + "/props",
                headers=self._headers(runner),
                timeout=min(5.0, self.request_timeout_s),
                trust_env=False,
            )
            slots = resp.json().get("total_slots") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return slots if isinstance(slots, int) and slots > 0 else None

    def kv_pool(self, runner: str) -> dict | None:
        """The KV cache `runner`'s server preallocated, where gate read it: {"tokens": blocks x
        block size, "bytes": as the server counts them, "dtype": the served weights' dtype};
        None here."""
        return None

    def verification(self, runner: str) -> tuple[str, bool] | None:
        """How `runner`'s server verifies proposals and whether that keeps the target's law
        (method, lossless), where gate knows it; None here (an endpoint gate did not start)."""
        return None

    def command_line(self, runner: str) -> list[str] | None:
        """The command line of the server gate started for `runner` (None: gate started none)."""
        return None

    def peak_rss_bytes(self, runner: str) -> int | None:
        """Peak resident set size of `runner`'s server in bytes (None: not known to gate)."""
        return None

    def device_memory_bytes(self, runner: str) -> tuple[int | None, str | None]:
        """The device memory `runner`'s server used and None, or None and why it is not
        measured: gate reads it only for a server it started (a managed runner)."""
        return None, "gate did not start this server: it has no process whose device memory to read"

    def __init__(
        self,
        endpoints: dict[str, Endpoint],
        eos_token_ids: set[int],
        request_timeout_s: float = 120.0,
        ignore_eos: bool = True,
        burst_gap_ms: float = 1.0,
        count_tokens: Callable[[str], int] | None = None,
        max_consecutive_failures: int = 3,
        client_workers: int | None = None,
    ):
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
        if int(max_consecutive_failures) != max_consecutive_failures or max_consecutive_failures < 1:
            raise ValueError(f"max_consecutive_failures must be an integer >= 1, got {max_consecutive_failures}")
        self.max_consecutive_failures = int(max_consecutive_failures)
        if client_workers is not None and client_workers < 1:
            raise ValueError(f"client_workers must be >= 1, got {client_workers}")
        self.client_workers = client_workers
        self._workers: list[ClientWorkerRecord] = []
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

    def run(
        self, requests: Sequence[Request], load: LoadStrategy, done: Done | None = None, ended: Ended | None = None
    ) -> list[RequestResult]:
        """Send `requests` (all for one runner name) under `load`; per request its
        StreamResult or the ServedError it raised. `ended` is called as each request ends;
        the responses are read (parsed) once the requests have all ended or the run stopped,
        each then given to `done` (Done): reading 32 events costs ~0.5 ms of gate's process,
        which at concurrency 64 on 2 cores delayed the next requests' first tokens by ~2 ms
        (benchmarks/client_accuracy.py). Raises ValueError for requests of several
        runners, an unknown runner or a load beyond max_concurrency; ServedError (before
        sending anything) for a law or constraint the server cannot apply as gate does
        (law_refusals), or a missing API key.
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
        self._refuse(runner, ep.url, requests)
        before = listen_counters()
        try:
            return self._run(runner, ep, list(requests), load, done, ended)
        finally:
            note = listen_note(before, listen_counters(), runner, f"{describe_load(load)} ({len(requests)} requests)")
            if note:
                self._notes.append(note)

    def observed(self) -> Observed:
        """Since the last call, then cleared: a note per run() call during which the kernel's
        TcpExt ListenOverflows or ListenDrops rose (gate.runners.netstat.listen_note:
        connections dropped because a server's accept backlog was full), naming the runner
        and load point (none where /proc/net/netstat cannot be read); and what the client's
        workers measured of themselves over the last run() call (one ClientWorkerRecord per
        worker: CPU time, event-loop lag)."""
        out = Observed(self._notes, self._workers)
        self._notes, self._workers = [], []
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

    def workers_for(self, load: LoadStrategy, n: int) -> int:
        """Client worker processes for `n` requests under `load`: runner.client_workers when
        set, else gate.runners.client.workers.client_workers of the most requests in flight
        (the concurrency, or n for an uncapped open loop), never more than n."""
        if self.client_workers is not None:
            return max(1, min(self.client_workers, n))
        return max(1, min(client_workers(load.concurrency or n), n))

    def _run(
        self,
        runner: str,
        ep: Endpoint,
        requests: list[Request],
        load: LoadStrategy,
        done: Done | None,
        ended: Ended | None,
    ) -> list[RequestResult]:
        """The requests sent by the client's worker processes (gate.runners.client.workers),
        each held raw as it ends and read here once they have all ended (or the run stopped:
        a PoolError, or what `ended` or an interrupt raised). Past the run's time limit (request_timeout_s per
        request that may have to wait for a slot, plus the open loop's arrival span, plus
        60 s) the requests that have not ended are errors and the workers are ended."""
        n = len(requests)
        streams = StreamClient(
            runner, ep.url, PROTOCOLS[ep.api], self.burst_gap_ms, frozenset(self.eos_token_ids), self.count_tokens
        )
        breaker = Breaker(self.max_consecutive_failures, runner, ep.url, describe_load(load))
        bodies = {i: json.dumps(self.body(ep, r)).encode() for i, r in enumerate(requests)}
        pool = shared_pool()
        with pool.lock:
            workers = self.workers_for(load, n)
            job_id = pool.next_job_id()
            pool.ensure(workers)
            # Every worker has its share before the first is due: a closed loop's slots may take
            # any request (every body to every worker), an open loop's worker only its arrivals.
            closed = load.request_rate is None
            size = sum(map(len, bodies.values())) * (workers if closed else 1)
            start = time.perf_counter() + START_LEAD_S + size / DISPATCH_BYTES_PER_S
            common = dict(
                job_id=job_id,
                start_s=start,
                runner=runner,
                url=ep.url,
                api=ep.api,
                headers=self._headers(runner),
                timeout_s=self.request_timeout_s,
            )
            shares = split(n, load, workers, start)
            jobs = [
                Job(
                    worker=k,
                    slots=x.slots,
                    arrivals=x.arrivals,
                    capped=x.capped,
                    bodies=bodies if closed else {i: bodies[i] for i, _ in x.arrivals},
                    **common,
                )
                for k, x in enumerate(shares)
            ]
            held: dict[int, Any] = {}  # request index -> what ended (RawStream unread, ServedError), in end order
            stopped = False

            def on_result(i: int, raw: Any) -> None:
                nonlocal stopped
                held[i] = breaker.refusal() if raw == NOT_SENT else raw
                breaker.ended(held[i])  # a RawStream, read or not, is an answer: it resets the streak
                if breaker.open and not stopped:
                    stopped = True
                    pool.stop(job_id)
                if ended is not None:
                    ended(i)

            def fill(result: ServedError | str, raised: list[BaseException]) -> None:
                """What never came back: `result` for every request not held (NOT_SENT: refused);
                what `ended` raises goes to `raised`, once every one is held."""
                for i in range(n):
                    if i not in held:
                        try:
                            on_result(i, result)
                        except BaseException as e:  # noqa: BLE001 - raised by the caller, once all are read
                            raised.append(e)

            waves = math.ceil(n / (load.concurrency or n))
            span_s = max((at for x in shares for _, at in x.arrivals), default=start) - start
            limit_s = waves * self.request_timeout_s + span_s + 60.0
            self._workers = []
            raised: list[BaseException] = []
            try:
                try:
                    if closed:
                        pool.put_indices(range(n))
                    elif load.concurrency is not None:
                        pool.put_slots(load.concurrency, start)
                    self._workers = pool.run(jobs, on_result, limit_s)
                finally:
                    pool.drain_indices()
                    pool.drain_slots()
                fill(NOT_SENT, raised)  # a closed loop's index no slot took once the breaker opened
            except PoolError as e:
                fill(ServedError(runner, ep.url, f"{e}; the requests that had not ended are errors"), raised)
            except BaseException:  # an interrupt, or what `ended` raised (the budget): what ended is still read
                self._read(streams, held, done, raised)
                raise
            results = self._read(streams, held, done, raised)
            if raised:
                raise raised[0]
            return [results[i] for i in range(n)]

    @staticmethod
    def _read(
        streams: StreamClient, held: dict[int, Any], done: Done | None, raised: list[BaseException]
    ) -> dict[int, RequestResult]:
        """Each held result read (a RawStream parsed by `streams`, a ServedError as it is) and
        given to `done`, in the order they ended; what `done` raises goes to `raised` (every
        result is read first)."""
        results: dict[int, RequestResult] = {}
        for i, raw in held.items():
            if isinstance(raw, RawStream):
                try:
                    results[i] = streams.read(raw)
                except ServedError as e:
                    results[i] = e
            else:
                results[i] = raw
            if done is not None:
                try:
                    done(i, results[i])
                except BaseException as e:  # noqa: BLE001 - raised by the caller, once every result is read
                    raised.append(e)
        return results

    def body(self, ep: Endpoint, req: Request) -> dict[str, Any]:
        """The JSON body of `req` for `ep`: the whole declared law and the prompt's constraint
        in the fields of the endpoint's dialect (Endpoint.dialect: Engine.sampling_fields,
        constraint_fields), the protocol's prompt token ids, max tokens and seed
        (Protocol.request_fields), the dialect's own request fields, streaming. ignore_eos
        (when set) is left out of a constrained request: its grammar ends the output
        (llama.cpp bans end tokens for ignore_eos, which leaves a completed grammar no token)."""
        fmt = constraint_of(req)
        dialect = ep.dialect
        body: dict[str, Any] = {"stream": True}
        if ep.model is not None:
            body["model"] = ep.model
        body.update(dialect.sampling_fields(req.law, self.penalty_window(ep)))
        if self.ignore_eos and fmt is None:
            body["ignore_eos"] = True
        if fmt is not None:
            body.update(dialect.constraint_fields(fmt))
        ids = [int(t) for t in req.prompt.token_ids]
        body.update(PROTOCOLS[ep.api].request_fields(ids, req.max_new_tokens, req.seed))
        body.update(dialect.request_fields())
        return body

    def penalty_window(self, ep: Endpoint) -> int | None:
        """The tokens a repetition penalty looks back over, for an engine that takes a window
        (llama.cpp's repeat_last_n): None here, the server's slot context being unknown (the
        engine's default applies); the managed runner sends its slot context."""
        return None

    def engine_of(self, runner: str) -> Engine:
        """The engine whose sampling definitions `runner`'s server follows (Endpoint.dialect).
        Raises ValueError for an unknown runner."""
        return self.endpoint(runner).dialect

    def law_refusals(self, runner: str, law: Any, fmt: Any = None) -> list[tuple[str, str]]:
        """What `runner`'s server cannot apply as gate applies `law` (a gate.core.law.Law) to a
        request constrained by `fmt` (a gate.constraints.interface.ResponseFormat, None:
        unconstrained): (field, why) pairs, field a Law attribute name or "constraint";
        [] when the server follows the whole law (its engine's Engine.law_refusals)."""
        return self.engine_of(runner).law_refusals(law, fmt)

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
            resp = httpx.get(
                ep.metrics_url,
                headers=self._headers(runner),
                timeout=min(self.request_timeout_s, 30.0),
                trust_env=False,
            )
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
        for path in PROTOCOLS[ep.api].info_paths:
            try:
                resp = httpx.get(
                    base + path,
                    headers=self._headers(runner),
                    timeout=min(5.0, self.request_timeout_s),
                    trust_env=False,
                )
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
