"""What every runner (the system under test) gives: lifecycle, declared capabilities, and
timed streams for planned requests under an offered load.

A runner returns, per request, a StreamResult (transport independent: output ids,
per-token times, stop reason, E2E latency, plus what only some runners can see, None
elsewhere) or the exception that request raised: a failed request never stops the others,
and the caller records it (gate.loop.run turns it into a Failure of stage "request").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from gate.core.law import Law
from gate.core.requests import Request
from gate.load.interface import LoadStrategy
from gate.runners.result import StreamResult

if TYPE_CHECKING:  # annotations only
    from gate.constraints.interface import ResponseFormat
    from gate.records import ClientWorkerRecord, DeviceMemoryRecord, ServerRecord
    from gate.runners.engines.interface import ServerSnapshot


@dataclass(frozen=True)
class Capabilities:
    """What a runner can do besides timed streams: the measurement loop, the passes and the
    policy read these, never the runner's kind.

    token_ids: its outputs are token ids of the target's tokenizer (not text only).
    step_counters: per-step committed/proposed/accepted counts (spec-decode counters per request).
    seeding: a request's seed (gate.core.requests.Request.seed) fixes its sampled output.
    (These three describe the records a runner gives; the records themselves say it per
    request, and what reads them reads the records.)
    first_steps: it can draw many independent speculative first steps (Runner.first_steps),
        the next-token exactness test's raw material (else that test is not drawn).
    cpu_accounting: per-request process CPU time and machine CPU pressure (gate.measure.contention),
        so contended requests can be found and their cells rerun (else none is rerun).
    max_concurrency: most requests it can have in flight (LoadStrategy.concurrency above it is refused).
    server_counters: counters scraped from a server over a window (Runner.counters, scraped
        before and after each window: RunRecord.counters; else not scraped).
    in_process: it runs the target and the drafts in this process: gate loads them (the bill
        from the loaded weights, overlap from the loaded drafts) and its outputs are the local
        target's own, so exactness checks each output against the target (else against the
        fallback runner's output, the control for the server's numerics).
    load_points: it serves requests at the policy's load points (load.concurrency,
        load.request_rate); without it every request runs alone, and records carry no load point.
    interleaves: switching between the fallback and the drafts costs nothing, so the
        measurement loop interleaves them request by request, cell by cell (else each runner
        runs its window of requests in turn).
    slow_switch: switching runners starts another server that takes long to be ready (vLLM:
        about 30 s on CPU), so at load points each repetition runs one runner's windows at
        every load point back to back (one start per runner and repetition), the runners'
        order and the load points' order rotated per repetition (else every window rotates).
    metrics: the metrics only runners with this capability measure (the catalogue's Metric.measured_by); the
        policy refuses a rule on a metric that some runner kind lists and its runner does not,
        saying "<metric> <metrics_note>" ({kinds}: the kinds that measure it).
    """

    token_ids: bool = True
    step_counters: bool = False
    seeding: bool = False
    first_steps: bool = False
    cpu_accounting: bool = False
    max_concurrency: int = 1
    server_counters: bool = False
    in_process: bool = False
    load_points: bool = False
    interleaves: bool = False
    slow_switch: bool = False
    metrics: AbstractSet[str] = frozenset()
    metrics_note: str = "is measured by runner.kind {kinds}"


class RunnerSpecBase(BaseModel):
    """The policy's `runner` section for one runner kind: each kind's spec class subclasses
    this with `kind: Literal["<kind>"]` and the fields its runner reads, and is registered
    with its Runner class (Runner.spec); the policy's `runner` union is built from them
    (gate.runners.registry.runner_spec_union)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    runner: ClassVar[Any] = None  # its Runner class (set when the class is registered)
    kind: str

    @property
    def served(self) -> bool:
        """Whether the runner serves requests at the policy's load points (Capabilities.load_points)."""
        return bool(self.runner is not None and self.runner.capabilities.load_points)

    @property
    def runs_models_here(self) -> bool:
        """Whether the runner runs the target and the drafts in this process (the one read of
        Capabilities.in_process): gate then loads them for it (gate.loop.session), and what
        depends on that reads the session (its loaded target and drafts) or this."""
        return bool(self.runner is not None and self.runner.capabilities.in_process)

    def policy_problems(self, policy: Any) -> list[tuple[str, str]]:
        """(YAML path, message) for what the rest of `policy` (a gate.policy.model.Policy)
        asks that this runner kind cannot do, told from the policy alone (e.g. a runner name
        without an endpoint). Default: none."""
        return []

    def policy_warnings(self, policy: Any) -> list[tuple[str, str]]:
        """(YAML path, warning) for what `policy` lets this runner run but gate cannot check
        (e.g. a draft endpoint whose proposals cannot be counted). Default: none."""
        return []


@dataclass
class Observed:
    """What a runner saw over its run() calls beside the requests' results (Runner.observed):
    `notes` a report should carry (e.g. the kernel's listen-queue overflows while a served
    runner ran), in the order seen, and `client_workers`, what a served client's worker
    processes measured of themselves over the last run() call (one ClientWorkerRecord per
    worker: CPU time, event-loop lag; empty where gate's own process runs the requests)."""

    notes: list[str] = field(default_factory=list)
    client_workers: list[ClientWorkerRecord] = field(default_factory=list)


@runtime_checkable
class FitsThreads(Protocol):
    """An optional ability: a runner that computes in this process and can fit its compute
    threads to the CPUs other tasks leave free (measurement.threads auto). The loop asks it
    again before a contended cell is rerun (`when` says so, for the note); `threads_given`:
    the threads the process was given where they are fitted (None: not fitted), which a
    request on fewer did not have (recorded in the environment: absolute timing verdicts
    weigh it)."""

    @property
    def threads_given(self) -> int | None: ...

    def fit_threads(self, when: str) -> None: ...


RequestResult = StreamResult | Exception
"""A request's StreamResult, or the exception it raised."""

Done = Callable[[int, RequestResult], None]
"""Called with each request's result once it is read: (its index in the requests given, its
result). A runner that reads results as they end calls it as each ends; a served client,
whose reading (parsing the streams) takes CPU the requests still in flight need, reads them
once run()'s requests have ended (or the run stopped), in the order they ended."""

Ended = Callable[[int], None]
"""Called as each request ends, before its result is read: (its index in the requests
given). What it raises (the wall-time budget, an interrupt) stops run(): nothing more is
sent, what ended is still read and given to Done, then the exception propagates."""


class Runner(ABC):
    """The system under test. Use as a context manager (open on entry, close on exit), or
    call open()/close(); run() opens a runner that was not opened."""

    kind: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    spec: ClassVar[type[RunnerSpecBase]]  # the policy's `runner` section for this kind

    @classmethod
    def from_plan(cls, plan: Any, local: Any = None) -> Runner:
        """The runner of a validated plan (gate.plan.matrix.Plan; plan.policy.runner is its spec).
        `local`: the models loaded in this process (gate.loop.session.LocalModels) for a runner
        that runs them (Capabilities.in_process), else None. Builds the configuration only:
        nothing is started or sent. Raises PolicyValueError naming the YAML path for what it
        cannot run (a draft kind, a missing binary, a law field it cannot honour)."""
        raise NotImplementedError(f"runner kind {cls.kind!r} cannot be built from a policy")

    @classmethod
    def check_plan(cls, plan: Any) -> None:
        """What a run of `plan` needs from this runner kind that can be told without starting
        anything (gate validate): default nothing. Raises PolicyValueError at the YAML path."""

    def open(self) -> None:
        """Acquire what requests need (a connection, a server process, probes). Idempotent."""

    def close(self) -> None:
        """Release what open() acquired. Idempotent."""

    def __enter__(self) -> Runner:
        self.open()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def check_load(self, load: LoadStrategy) -> None:
        """Raise ValueError when `load` asks for more than the runner can do."""
        if load.concurrency is None or load.concurrency > self.capabilities.max_concurrency:
            raise ValueError(
                f"runner {self.kind!r} serves at most {self.capabilities.max_concurrency} request(s) at once; "
                f"{load.kind} load asks for {load.concurrency or 'unbounded'}"
            )

    @abstractmethod
    def run(
        self, requests: Sequence[Request], load: LoadStrategy, done: Done | None = None, ended: Ended | None = None
    ) -> list[RequestResult]:
        """Send `requests` under `load`; per request, in the order given, its StreamResult
        or the Exception it raised (the others still run). `ended` is called as each ends
        and `done` with each result once read (Done, Ended): a caller stopped by
        KeyboardInterrupt or the budget keeps what ended before. Raises ValueError for a
        load beyond the capabilities (check_load)."""

    def observed(self) -> Observed:
        """What the runner saw since the last call beside the requests' results (Observed),
        returned once, then cleared; the loop takes it after each run() call. Default:
        nothing."""
        return Observed()

    def counters(self, runner: str) -> ServerSnapshot | None:
        """The server's counters for `runner` now (a gate.runners.server_metrics.ServerSnapshot),
        scraped before and after each measured window (their difference is the window's
        acceptance); None when the runner has no counters (default). Raises what the scrape
        raises (an unreachable metrics URL): the caller records it."""
        return None

    def law_refusals(self, runner: str, law: Law, fmt: ResponseFormat | None = None) -> list[tuple[str, str]]:
        """What `runner` cannot apply as gate applies `law` to a request constrained by `fmt`
        (a gate.constraints.interface.ResponseFormat, None: unconstrained): (field, why)
        pairs, field a Law attribute name or "constraint". Default: none (gate's own loop
        applies the whole law). Raises KeyError for a runner name it does not serve."""
        return []

    def describe(self, runner: str) -> ServerRecord | None:
        """What gate saw of `runner`'s engine, for the report: a gate.records.ServerRecord
        (endpoint, command line, version, peak RSS), or None where there is no server
        (default). Never raises: what cannot be told is None."""
        return None

    def device_memory(self) -> list[DeviceMemoryRecord]:
        """The accelerator's peak memory per runner and law over the requests run so far, where
        this runner measures it in this process (gate.measure.device_memory); [] where it does
        not (default: a served engine's is on its ServerRecord, describe())."""
        return []

    def server_info(self, runner: str) -> str | None:
        """The engine's own identity for `runner` (e.g. "llama.cpp b4567"), recorded with each
        measured window; None when unknown (default). Never raises."""
        return None

    def first_steps(
        self,
        prompt_ids: list[int],
        draft: str,
        law: Law,
        n: int,
        seed: int,
        response_format: ResponseFormat | None = None,
    ) -> list[list[int]]:
        """`n` independent speculative first steps of draft `draft` after `prompt_ids`
        under `law` and the request's `response_format` (gate.constraints.interface; None:
        unconstrained), seeded by `seed`: the tokens each commits. Only runners with the
        first_steps capability; others raise NotImplementedError."""
        raise NotImplementedError(f"runner {self.kind!r} cannot draw speculative first steps")
