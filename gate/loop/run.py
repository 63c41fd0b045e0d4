"""THE measurement loop, for every runner kind: the plan's requests through the session's
runner (gate's in-process loop or a served engine) at every load point, then the passes
along the outputs (overlap, exactness), the bill and the bookkeeping.

For every law, load point and repetition (one load point, the sequential one, for a runner
without load points: Capabilities.load_points), the fallback and every draft run the same
requests on the same prompts under the same offered load. Each runner's window gets
warm-up requests (untimed), a scrape of its counters where it has them
(Runner.counters), the timed requests, a second scrape; the difference is the window's
acceptance (gate.records.RunRecord.counters). A runner that can switch between the
fallback and the drafts at no cost (Capabilities.interleaves, and measurement.interleave)
runs them cell by cell (one prompt and length: the fallback and every draft back to back,
so slow drift of the machine hits them alike); any other runs one runner's window at a
time (a managed llama-server is started for it and the previous one stopped: never two
side by side on shared cores). The runner order rotates with the load point and
repetition. A cell (interleaved) or window with a contended request is rerun while
gate.measure.contention.RerunBudget allows (measurement.contention_reruns), the attempt
with the fewest contended requests kept. Extra repetitions (measure_more) run the same
loop for the drafts and laws whose verdicts were inconclusive.

Nothing measured is lost: a failed request is a Failure at its runner, law and load point
and the run goes on; a draft runner whose counters did not move while it produced tokens
had speculation off (an error, never a pass); the phases run under one guard
(gate.loop.phases.run_phases): a signal or measurement.max_wall_s stops the phase in progress
and keeps what was measured; runners are always closed (managed servers stopped).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch

from gate.core.errors import describe_error
from gate.core.law import Law, RequestLaw, law_logits, law_probs
from gate.core.requests import PlannedPrompt, Request, request_seed
from gate.drafts import registry as draft_kinds
from gate.exactness.collect import contexts, greedy_divergences, randomized_pit, sparse_counts
from gate.exactness.oracle import TargetOracle
from gate.exactness.stats import DEFAULT_SIGNIFICANCE
from gate.load.interface import LoadStrategy
from gate.load.points import describe_point, point_of
from gate.load.search import ProbeResult, SearchPlan, Window, judge_probe, meets, search
from gate.load.sequential import SEQUENTIAL
from gate.loop import interrupt
from gate.loop.identity import measure_identity
from gate.loop.phases import Phase, not_measured, run_phases
from gate.loop.session import Session
from gate.measure.bill import bills_for, kv_format
from gate.measure.contention import BUSY_CELLS, Handling, Probe, RerunBudget, is_contended, pooled_stall_share
from gate.measure.environment import environment, process_peak_rss_bytes, record_load
from gate.measure.kv import cache_model
from gate.measure.overlap import position_overlaps
from gate.models.loading import dtype_name, weight_bytes
from gate.plan.matrix import Asked, Block, ExactnessPlan, plan_blocks, window_requests
from gate.plan.rounds import SAMPLE_LOOKS, Rounds, Sequential, Undecided, Units, plan_rounds, sample_share
from gate.records import (
    FALLBACK,
    UNKNOWN_ID,
    EnvelopeRecord,
    ExactnessRecord,
    Failure,
    FailureStage,
    Measurements,
    OverlapRecord,
    ProbeRecord,
    RequestRecord,
    RunRecord,
    SampleLooksRecord,
    SampleRecord,
    SpecDecodeCounters,
    busy_seconds,
)
from gate.runners.engines.interface import ServerLatency
from gate.runners.interface import FitsThreads, RequestResult, Runner, StreamResult

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass(frozen=True)
class Settings:
    """What the loop runs, from the policy: `max_new_tokens` (each request's lengths),
    `repetitions`, `seed` (request seeds, gate.core.requests.request_seed), `warmup` (untimed requests
    per runner and window, 0: none), `interleave` (measurement.interleave: cells where the
    runner interleaves), `points` (load points in run order, for runners with load points),
    `slo_ms` (goodput objectives, ms: {"ttft": 500.0}), `contention` (when a request is
    contended and how often its cell is rerun), `resources` (policy.resources, for the bill),
    `search` (load.search: the envelope search after the load points, gate.load.search),
    `shard` ((i, n): this run measures the i-th of n shards, gate.commands.merge; None: everything),
    `sequential` (measurement.sequential: the budget and the still-undecided predicate,
    gate.plan.rounds; None: the fixed plan, `repetitions`)."""

    max_new_tokens: list[int]
    repetitions: int = 1
    seed: int = 0
    warmup: int = 1
    interleave: bool = True
    points: tuple[LoadStrategy, ...] = (SEQUENTIAL,)
    slo_ms: dict[str, float] = field(default_factory=dict)
    contention: Handling = field(default_factory=Handling)
    resources: Any = None
    search: SearchPlan | None = None
    shard: tuple[int, int] | None = None
    sequential: Sequential | None = None

    @property
    def first_shard(self) -> bool:
        """Whether this run measures what is not split into shards (shard 1, or no shards)."""
        return self.shard is None or self.shard[0] == 1


def measure(
    session: Session, settings: Settings, progress: Progress | None = None, exactness: ExactnessPlan | None = None
) -> Measurements:
    """Every measurement the policy needs, as raw records (see gate.records and the module
    docstring): the requests at every load point, overlap along the fallback's outputs where
    the drafts are loaded here, exactness (ExactnessPlan pairs), the bill, the bookkeeping
    and, for a runner of the local target, the target's identity. Never raises for a
    measurement that failed: it is a Failure. interrupt.stopped_in() names the phase a
    signal or the budget stopped."""
    progress = progress or (lambda *_: None)
    m = Measurements(environment=environment(session.device, settings.seed), laws=[law.name for law in session.laws])
    m.environment.models = session.models
    if isinstance(session.runner, FitsThreads):
        m.environment.threads_given = session.runner.threads_given
    m.drafts = dict(session.draft_infos)
    m.tokenizers = list(session.tokenizer_comparisons)
    m.workload = session.workload
    if session.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(session.device)
        m.accelerator = m.environment.device_name

    def peaks() -> None:
        record_load(m.environment, m.requests)  # the machine's CPU pressure over the timed requests (contention)
        m.process_peak_rss_bytes = process_peak_rss_bytes()
        if session.device.type == "cuda":
            m.cuda_max_memory_allocated_bytes = int(torch.cuda.max_memory_allocated(session.device))
            m.cuda_max_memory_reserved_bytes = int(torch.cuda.max_memory_reserved(session.device))
        # per runner and law (the runner resets the allocator's peak before each of its requests)
        m.device_memory = session.runner.device_memory()

    loop = Loop(session, m, settings, progress, exactness or ExactnessPlan())
    names = [FALLBACK, *m.drafts]
    rounds = loop.rounds()
    if rounds is None:
        phases = [loop.phase(names, session.laws, range(settings.repetitions))]
    else:  # a sequential run: the first look's units, then further looks while verdicts are undecided
        m.looks = replace(rounds.looks, taken={f"{n}/{law.name}": 1 for n in names for law in session.laws})
        first_look = f"look 1 of {len(rounds.looks.schedule)}"
        phases = [loop.phase(names, session.laws, units=rounds.units(1), label=first_look)]
    first = settings.first_shard  # what is not split runs in the first shard (gate.commands.merge)
    if session.drafts and loop.overlap_laws():  # the drafts are loaded here: overlap along the fallback's outputs
        laws = loop.overlap_laws()
        phases.append(
            Phase("the overlap pass", FailureStage.OVERLAP, lambda: _overlaps(session, m, progress, laws=laws))
        )
    if rounds is not None:
        phases.append(
            Phase("the further looks", FailureStage.REQUEST, lambda: loop.further(rounds), lambda why, when: [])
        )
    # every shard checks its own requests' outputs (greedy equality, PIT); what does not split (first steps,
    # served samples) runs in the first
    phases += _exactness_phases(
        session, m, exactness or ExactnessPlan(), settings.seed, progress, loop.checked, per_request_only=not first
    )
    if first:
        phases.append(Phase("the bill", FailureStage.BILL, lambda: _bill(session, m, settings), after_stop=True))
    phases += [
        # bookkeeping on what was measured; before the identity check: the release model (a
        # reference, never resident at serve time) moves none of the peaks
        Phase("the bookkeeping", FailureStage.RUN, peaks, after_stop=True, bookkeeping=True),
    ]
    if session.local and first:  # the target the runner serves is the one loaded here
        phases.append(
            Phase(
                "the target identity check",
                FailureStage.IDENTITY,
                lambda: measure_identity(session, m, progress),
                unmeasured=lambda why, when: (
                    []
                    if session.release is None
                    else [Failure(FailureStage.IDENTITY, "*", "*", "target identity", f"not measured: {why} {when}")]
                ),
            )
        )
    run_phases(m, phases)
    return m


def measure_more(
    session: Session,
    m: Measurements,
    settings: Settings,
    drafts: list[str],
    laws: list[str],
    repetitions: range,
    progress: Progress | None = None,
) -> None:
    """Further repetitions of `drafts` (and their fallback) under `laws`, at every load
    point, appended to `m` (requests, windows, notes): what measurement.extra_repetitions
    runs when a verdict is inconclusive. Overlap and exactness are not remeasured (they do
    not depend on timing). When measurement.max_wall_s runs out it stops between requests
    (interrupt.ran_out()); a signal stops it with a failure saying so."""
    loop = Loop(session, m, settings, progress or (lambda *_: None))
    chosen = [law for law in session.laws if law.name in laws]
    try:
        loop.requests([FALLBACK, *[d for d in m.drafts if d in drafts]], chosen, repetitions, once=False)
    except KeyboardInterrupt:
        m.failures.append(Failure(FailureStage.RUN, "*", "*", "run", "interrupted during extra repetitions"))
    except interrupt.OutOfTime:  # the budget ran out: what was measured is kept (gate.commands.check notes it)
        pass
    with interrupt.deferred():
        record_load(m.environment, m.requests)
        m.servers = _servers(session.runner, [FALLBACK, *m.drafts]) or m.servers
        m.device_memory = session.runner.device_memory() or m.device_memory


# Once this many consecutive cells stayed contended through their first attempt and every
# rerun, the machine is busy for good and reruns stop for the rest of the run (they would only
# multiply the run time; the verdicts say the machine was contended, a note says reruns
# stopped). A count of stuck cells that clean cells bring back down never stopped a machine
# busy most of the time (issue 23: 29% of the example after 44 minutes). See RerunBudget.
STUCK_CELLS = BUSY_CELLS


@dataclass
class _Attempt:
    """One attempt at a unit (a cell or a window): what ended, as it ended."""

    records: list[RequestRecord] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    starts: dict[int, float] = field(default_factory=dict)  # id(record) -> its wall-clock start (s)
    counters: dict[str, Any] = field(default_factory=dict)  # runner -> counter delta (None: no counters)
    scrape_errors: dict[str, str] = field(default_factory=dict)
    scraped: set[str] = field(default_factory=set)  # runners whose counters were read before the requests
    stall_share: float | None = None  # share of the attempt's wall time some task waited for a CPU
    client_workers: list[Any] = field(default_factory=list)  # served: the client's workers (ClientWorkerRecord)
    # runner -> the server's own mean TTFT/ITL (None: none kept)
    latency: dict[str, ServerLatency | None] = field(default_factory=dict)

    def wall_ms(self, one_at_a_time: bool) -> float:
        """Wall time the attempt's timed requests took (ms): the sum of their E2E latencies
        when they ran one at a time, else the time at least one was in flight."""
        if one_at_a_time:
            return sum(r.e2el_ms for r in self.records)
        return busy_seconds((self.starts[id(r)], self.starts[id(r)] + r.e2el_ms / 1e3) for r in self.records) * 1e3


class Loop:
    """The requests of a run through `session.runner`, recorded into `m` (see the module
    docstring). `ended` counts the requests that ended (measured or failed) per (runner,
    law, concurrency, request_rate)."""

    def __init__(
        self,
        session: Session,
        m: Measurements,
        settings: Settings,
        progress: Progress,
        exactness: ExactnessPlan | None = None,
    ):
        self.session, self.m, self.s, self.progress = session, m, settings, progress
        self.exactness = exactness or ExactnessPlan()
        self.checked: set[tuple[Any, ...]] = set()  # greedy requests checked at a look (_greedy_so_far)
        self.runner: Runner = session.runner
        caps = self.runner.capabilities
        self.labelled = caps.load_points  # records and failures carry their load point
        self.points = list(settings.points) if caps.load_points else [SEQUENTIAL]
        self.interleaved = settings.interleave and caps.interleaves
        self.ended: Counter = Counter()
        # sharding (gate.commands.merge): the (law, load point) cells in plan order, the k-th in shard k % n + 1
        self._cells = [(law.name, point_of(p)) for law in session.laws for p in self.points] if settings.shard else []

    def overlap_laws(self) -> set[str]:
        """The laws whose overlap pass this run computes, along its own fallback outputs: every
        law, unless settings.shard splits the run: then the shard that measures a law's first
        (law, load point) cell computes it (its greedy continuations are the law's; a sampling
        law's are those of that load point)."""
        laws = {law.name for law in self.session.laws}
        if self.s.shard is None:
            return laws
        i, n = self.s.shard
        return {law for law in laws if next(k for k, c in enumerate(self._cells) if c[0] == law) % n == i - 1}

    def mine(self, law: str, load: LoadStrategy) -> bool:
        """Whether this run measures `law` at `load` (always, unless settings.shard splits the
        run: then the (law, load point) cells go to the shards in turn, in plan order)."""
        if self.s.shard is None:
            return True
        i, n = self.s.shard
        key = (law, point_of(load))
        return key in self._cells and self._cells.index(key) % n == i - 1

    def blocks(
        self, names: list[str], laws: list[Law], reps: range, prompts: list[PlannedPrompt] | None = None
    ) -> list[Block]:
        """The run order of `names` (the fallback first) x `laws` x load points x `reps` x
        `prompts` (default: the workload's; gate.plan.matrix.plan_blocks)."""
        blocks = plan_blocks(
            names[1:],
            laws,
            prompts or self.session.prompts,
            self.s.max_new_tokens,
            reps,
            self.s.seed,
            self.points if self.labelled else None,
            self.interleaved,
            self.runner.capabilities.slow_switch,
        )
        if self.s.shard is None:
            return blocks
        out = []
        for b in blocks:  # this shard's cells only
            units = [u for u in ([r for r in unit if self.mine(r.law.name, b.load)] for unit in b.units) if u]
            if units:
                out.append(replace(b, units=units))
        return out

    def phase(
        self, names: list[str], laws: list[Law], reps: range = range(0), units: Units | None = None, label: str = ""
    ) -> Phase:
        """The timed requests of `reps` (or of `units`: a look of a sequential run, as
        gate.plan.rounds.Rounds.units gives them) as a Phase: when stopped, each runner, law and
        load point with requests that did not end gets a failure (stage "request") saying how
        many and why."""
        runs = self._runs(reps, units)
        # per runner, law and load point
        per = sum(len(r) * len(p or self.session.prompts) for r, p in runs) * len(self.s.max_new_tokens)
        total = sum(self.mine(law.name, load) for law in laws for load in self.points) * len(names) * per

        def ended() -> int:
            return min(sum(self.ended.values()), total)

        def unmeasured(why: str, when: str) -> list[Failure]:
            text = not_measured(why, f"after {ended()} of {total} requests")
            out = []
            for law in laws:
                for load in self.points:
                    if not self.mine(law.name, load):
                        continue
                    c, r = self._labels(load)
                    for name in names:
                        k = per - self._kept(name, law.name, c, r)
                        if k > 0:
                            what = (
                                f"{k} of {per} requests at {describe_point(load)}"
                                if self.labelled
                                else f"{k} of {per} requests not measured"
                            )
                            out.append(Failure(FailureStage.REQUEST, name, law.name, what, text, c, r))
            return out

        return Phase(
            "the requests",
            FailureStage.REQUEST,
            lambda: self.requests(names, laws, reps, units, label=label),
            unmeasured,
            detail=lambda: f"{ended()} of {total} requests measured",
        )

    def _kept(self, name: str, law: str, c: int | None, r: float | None) -> int:
        """Requests of one runner, law and load point the measurements hold: records, and
        failures of one request ("request <id> ...") or of several ("<n> requests ..."). Counted
        from what was kept, not from what ended: a request that ends in the client's thread
        while an interrupt unwinds this one is in neither, and is named as not measured."""
        n = sum(
            1
            for q in self.m.requests
            if q.draft == name and q.law == law and q.concurrency == c and q.request_rate == r
        )
        for f in self.m.failures:
            if (
                f.stage != FailureStage.REQUEST
                or f.draft != name
                or f.law != law
                or (f.concurrency, f.request_rate) != (c, r)
                or "not measured" in f.message
            ):  # what an earlier stop already named
                continue
            head = f.what.split(" ", 1)[0]
            n += 1 if head == "request" else int(head) if head.isdigit() and " requests" in f.what else 0
        return n

    def _labels(self, load: LoadStrategy) -> tuple[int | None, float | None]:
        return point_of(load) if self.labelled else (None, None)

    @staticmethod
    def _runs(reps: range, units: Units | None) -> list[tuple[range, list[PlannedPrompt] | None]]:
        """(repetitions, prompts) to plan: `reps` with every prompt, or each of `units`' runs."""
        if units is None:
            return [(reps, None)]
        return [(range(rep, rep + 1), prompts or None) for rep, prompts in units]

    def requests(
        self,
        names: list[str],
        laws: list[Law],
        reps: range = range(0),
        units: Units | None = None,
        once: bool = True,
        label: str = "",
    ) -> None:
        """Every request of `names` (the fallback first) x `laws` x load points x `reps` (or
        `units`, Loop.phase), block by block; then, with `once` (the run's first requests, not
        a further look), what a run measures once after them: a served run's exactness
        samples and the envelope search. `label` names these requests in the report's notes
        (a further look: "look 3 of 5, t0.7"). An Exception that escapes a block (a server that
        cannot start) is a failure and the reports are still written; the runner is closed at
        the end, and the servers it ran recorded (m.servers)."""
        blocks = [b for r, p in self._runs(reps, units) for b in self.blocks(names, laws, r, p)]
        total = sum(len(b.requests) for b in blocks)
        budget = RerunBudget(sum(len(b.units) for b in blocks), self.s.contention.rerun_budget, STUCK_CELLS)
        done = [0]

        def unit_done(n: int) -> None:
            done[0] += n
            self.progress("requests", done[0], total)

        try:
            with self.runner:
                for block in blocks:
                    interrupt.check_budget()  # between windows: none starts once the budget ran out
                    self.progress("requests", done[0], total)
                    self._block(block, budget, unit_done)
                self.progress("requests", total, total)
                if once and not self.session.local and names[0] == FALLBACK and len(names) > 1 and self.s.first_shard:
                    self._samples()
                if once and self.s.search is not None and self.labelled:
                    self._search(names, laws)
        except Exception as e:  # noqa: BLE001 - e.g. a server that cannot start: recorded, the reports are written
            self.m.failures.append(Failure(FailureStage.RUN, "*", "*", "run", describe_error(e)))
        finally:
            h = self.s.contention
            note = budget.note(label) if h.max_cpu_stall is not None and h.reruns else None
            if note:
                self.m.notes.append(note)
            self.m.servers = _servers(self.runner, names) or self.m.servers
            _not_lossless(self.m)
            self.runner.close()

    def rounds(self) -> Rounds | None:
        """The looks of this run (gate.plan.rounds; None: the fixed plan, or a shard: a shard
        measures its part of the fixed plan, gate merge decides on all of them)."""
        seq = self.s.sequential
        if seq is not None and self.s.shard is not None:
            self.m.notes.append(
                "a shard measures its part of the fixed plan (measurement.repetitions), not sequential looks: the "
                "looks would have to decide on every shard's records at once; gate merge decides on the fixed plan"
            )
        if seq is None or self.s.shard is not None:
            return None
        return plan_rounds(
            self.session.prompts,
            len(self.s.max_new_tokens),
            self.s.repetitions,
            seq.budget,
            self.labelled,
            self.s.seed,
        )

    def further(self, rounds: Rounds) -> None:
        """The looks after the first, while the command's predicate (Settings.sequential)
        names undecided (runner, law) cells: each look measures their units (the fallback
        beside every undecided draft of a law, as the first look did), then the overlap along
        the new fallback continuations for those drafts; m.looks records how far each cell
        went. Stops when nothing is undecided or the schedule's last look (the budget) is
        measured; a signal or measurement.max_wall_s stops it between requests."""
        assert self.s.sequential is not None and self.m.looks is not None
        laws = {law.name: law for law in self.session.laws}
        for look in range(2, len(rounds.looks.schedule) + 1):
            self._greedy_so_far()
            pending = self.s.sequential.undecided(self.m)
            if not pending:
                return
            for law_name, law in laws.items():
                drafts = [d for d in self.m.drafts if (d, law_name) in pending]
                if not drafts and (FALLBACK, law_name) not in pending:
                    continue
                names = [FALLBACK, *drafts]
                for n in names:
                    self.m.looks.taken[f"{n}/{law_name}"] = look
                label = f"look {look} of {len(rounds.looks.schedule)}, {law_name}"
                self.requests(names, [law], units=rounds.units(look), once=False, label=label)
                if drafts and self.session.drafts and self.s.first_shard:
                    _overlaps(self.session, self.m, self.progress, set(drafts))

    def _greedy_so_far(self) -> None:
        """In gate's own loop, greedy exactness of the requests measured so far (_exactness,
        the ones not yet checked), so that the predicate sees a fault at the look that made
        it and its cell stops there. A check that fails here is left to the exactness pass,
        which checks every request not yet checked and records the failure (interrupt.OutOfTime
        and KeyboardInterrupt propagate, as between requests)."""
        if not self.session.local or not self.session.drafts or not self.exactness.pairs:
            return
        if not any(law.greedy for law in self.session.laws):
            return
        _exactness(self.session, self.m, self.exactness, self.s.seed, lambda *_: None, self.checked, True)

    def _samples(self) -> None:
        """The served exactness plan's sample requests (gate.exactness.sampled), drawn while
        the runner is open, after the timed windows: planned, its cost predicted from the
        timed requests (m.notes), drawn. A plan that cannot be made is a failure."""
        from gate.exactness import sampled as sampled_exactness

        if not self.exactness.pairs:
            return
        seq = self.s.sequential
        looks = seq is not None and seq.samples is not None and self.s.shard is None
        # a sequential run's plan is sized for the last sample look's share of the significance
        share = sample_share(len(SAMPLE_LOOKS)) if looks else 1.0
        try:
            plans = sampled_exactness.plan_samples(self.session, self.exactness, list(self.points), share)
        except Exception as e:  # noqa: BLE001 - e.g. the local target's forward failed: no samples, the rule errs
            self.m.failures.append(
                Failure(FailureStage.EXACTNESS, "*", "*", "served exactness plan", describe_error(e))
            )
            return
        if not plans:
            return
        predicted = sampled_exactness.predicted_wall_s(plans, self.m)
        for plan in plans:
            self.m.notes.append("served exactness plan, " + plan.describe())
        if predicted is not None:
            self.m.notes.append(f"served exactness samples: predicted {predicted:.0f} s wall from the timed requests")
        if not looks or seq is None or seq.samples is None:
            self._draw(plans)
            return
        self._sample_looks(plans, seq.samples)

    def _sample_looks(self, plans: list[Any], undecided: Undecided) -> None:
        """The served exactness samples of a sequential run, look by look (gate.plan.rounds.
        SAMPLE_LOOKS): each look draws its share of every plan for the runners of the cells
        `undecided` named after the last (the fallback beside any draft of its law: the
        reference), then builds the exactness records (gate.exactness.sampled) for the
        predicate to read; m.sample_looks records how far the samples went. Where the records
        cannot be built (the local target's forward failed), the rest of the plan is drawn for
        every runner, as a fixed plan would be, and a note says why; the exactness pass builds
        them again and records its failure."""
        from gate.exactness import sampled as sampled_exactness

        looks = SampleLooksRecord(list(SAMPLE_LOOKS))
        looks.planned = {f"{n}/{p.law.name}": p.requests_per_runner for p in plans for n in p.runners}
        self.m.sample_looks = looks
        known: dict[tuple[str, str, tuple[int, ...]], torch.Tensor] = {}
        active = {(n, p.law.name) for p in plans for n in p.runners}
        before, failed = 0.0, False
        for k, upto in enumerate(SAMPLE_LOOKS, 1):
            step = []
            for plan in plans:
                drafts = [n for n in plan.runners if n != FALLBACK and (n, plan.law.name) in active]
                if drafts:
                    step.append(plan.look(before, upto, [FALLBACK, *drafts]))
            if not step:
                return
            self._draw(step, f" (sample look {k} of {len(SAMPLE_LOOKS)})")
            looks.taken = k
            for plan in step:
                for n in plan.runners:
                    key = f"{n}/{plan.law.name}"
                    looks.drawn[key] = looks.drawn.get(key, 0) + plan.requests_per_runner
            before = upto
            if k == len(SAMPLE_LOOKS):
                return
            if failed:
                continue  # the rest of the plan, for every runner
            try:
                sampled_exactness.sampled_exactness(self.session, self.m, self.exactness, laws_at=known)
                active = undecided(self.m)
            except Exception as e:  # noqa: BLE001 - the samples are still drawn; the exactness pass records the failure
                self.m.notes.append(
                    f"served exactness samples: the records after sample look {k} could not be built "
                    f"({describe_error(e)}): the rest of the plan is drawn for every runner"
                )
                failed, active = True, {(n, p.law.name) for p in plans for n in p.runners}

    def _search(self, names: list[str], laws: list[Law]) -> None:
        """The envelope search (gate.load.search) of each runner and law, after the load points:
        one EnvelopeRecord each (m.envelopes), the probes' requests kept raw (m.probe_requests).
        Each runner's search begins with the warm-up requests (measurement.warmup_requests: its
        server may have been started again for it). A probe window whose requests were too often contended or client
        delayed is rerun (up to
        measurement.contention_reruns times). Once measurement.max_wall_s has run out, what was
        found is recorded and interrupt.OutOfTime raised; after a signal (KeyboardInterrupt) during a
        probe, what was found is recorded and the interrupt raised again. The runners of a
        num_draft_tokens_sweep are not searched (their best K is read at the load points)."""
        plan = self.s.search
        assert plan is not None
        prompts, lengths, seed = self.session.prompts, self.s.max_new_tokens, self.s.seed
        signalled: list[bool] = []  # a signal stopped a probe: the search is recorded, then the interrupt goes on
        for law in laws:
            if not self.mine(law.name, self.points[0]):  # a law's search runs in the shard of its first load point
                continue
            for name in names:
                info = (self.session.draft_infos or {}).get(name)
                if info is not None and info.sweep_of is not None:
                    continue  # a num_draft_tokens_sweep runner is measured at the load points, not searched
                figures: dict[float, dict[str, Any]] = {}
                if self.s.warmup:  # a managed server may have been started again for this runner: warm it first
                    self._warmup(
                        name,
                        window_requests(name, law, prompts, lengths, 0, seed),
                        plan.strategy(plan.start),
                        "envelope search",
                    )

                def probe(load: float, name: str = name, law: Law = law) -> ProbeResult:
                    strategy = plan.strategy(load)
                    at = f"envelope search, {describe_point(strategy)}"
                    windows = []
                    try:
                        for rep in range(plan.repetitions):
                            base = window_requests(name, law, prompts, lengths, rep, seed)
                            unit = [replace(base[i % len(base)]) for i in range(plan.request_count(load, len(base)))]
                            for _attempt in range(1 + self.s.contention.reruns):
                                a = _Attempt()
                                try:
                                    self._attempt(unit, strategy, at, a, tally=False)
                                finally:
                                    self.m.probe_requests += a.records
                                w = Window([(a.starts[id(r)], r) for r in a.records], len(unit) - len(a.records))
                                result, _ = judge_probe(plan, load, [w])
                                if result.holds is not None or result.failed or self.s.contention.reruns == 0:
                                    break
                            windows.append(w)
                            if w.failed:
                                errors = [f.message for f in a.failures]
                                self.m.notes.append(
                                    f"{name}/{law.name} {at}: {w.failed} requests failed"
                                    + (f" ({errors[0]})" if errors else "")
                                )
                                break
                    except interrupt.OutOfTime:
                        return ProbeResult(None, None, "measurement.max_wall_s ran out during the probe", ran_out=True)
                    except KeyboardInterrupt:  # recorded with what the search found; raised again below
                        signalled.append(True)
                        return ProbeResult(None, None, "a signal stopped the probe", interrupted=True)
                    result, figs = judge_probe(plan, load, windows)
                    # the probe runs inside this runner's search, never after the loop moved on
                    figures[load] = figs  # noqa: B023
                    self.progress(f"envelope search {name}", len(figures), len(figures))  # noqa: B023
                    return result

                env = search(
                    probe,
                    plan.start,
                    plan.maximum,
                    plan.integer,
                    plan.tolerance,
                    plan.budget_s,
                    stopped=lambda: interrupt.ran_out() or bool(signalled),
                )
                probes = [
                    ProbeRecord(
                        st.load,
                        **{
                            k: figures.get(st.load, {}).get(k, default)
                            for k, default in (
                                ("requests", 0),
                                ("failed", 0),
                                ("excluded", 0),
                                ("throughputs", []),
                                ("good_shares", []),
                                ("itl_p99_ms", []),
                                ("tpot_mean_ms", []),
                            )
                        },
                        verdict=st.verdict,
                        why=st.result.why,
                        saturated=st.saturated,
                    )
                    for st in env.steps
                ]
                self.m.envelopes.append(
                    EnvelopeRecord(
                        name,
                        law.name,
                        plan.over,
                        env.lower,
                        env.upper,
                        env.stop,
                        probes,
                        env.wall_s,
                        dict(plan.slo_ms),
                        plan.itl_p99_ms,
                        plan.min_good_share,
                    )
                )
                if signalled:
                    raise KeyboardInterrupt
                if interrupt.ran_out():
                    raise interrupt.OutOfTime()

    def _block(self, block: Block, budget: RerunBudget, unit_done: Callable[[int], None]) -> None:
        """One block: warm-up of its runners, then each unit with its contention reruns
        (`unit_done(n)` after each unit of n requests), then one RunRecord per runner and law
        of what was kept (its window)."""
        at = f"{describe_point(block.load)}, repetition {block.repetition}"
        if self.s.warmup:
            for name in block.runners:
                self._warmup(name, [r for r in block.requests if r.draft == name], block.load, at)
        kept: list[_Attempt] = []
        try:
            for unit in block.units:
                self._unit(unit, block.load, at, budget, kept)
                unit_done(len(unit))
        finally:
            self._record_windows(block, at, kept)

    def _warmup(self, name: str, requests: list[Request], load: LoadStrategy, at: str) -> None:
        """Untimed requests before `name`'s window (first calls allocate and pick kernels; a
        server just started warms its caches). A runner that fails here is recorded (stage
        "warm-up", so the run exits 3); its timed requests say for themselves whether they
        failed too."""
        from gate.load.closed import ClosedLoop

        c, r = self._labels(load)
        warm = [
            Request(name, q.law, q.prompt, min(8 if self.labelled else 4, q.max_new_tokens), q.repetition, q.seed)
            for q in requests[: self.s.warmup]
        ]

        def fail(what: str, message: str) -> None:
            if self.labelled:
                self.m.failures.append(
                    Failure(FailureStage.WARM_UP, name, warm[0].law.name, f"{what} at {at}", message, c, r)
                )
            else:
                self.m.failures.append(Failure(FailureStage.WARM_UP, name, "*", "warm-up", message))

        interrupt.check_budget()
        try:
            for i, result in enumerate(self.runner.run(warm, ClosedLoop(concurrency=1))):
                if isinstance(result, BaseException):
                    fail(f"warm-up request {warm[i].prompt.id}", describe_error(result))
        except Exception as e:  # noqa: BLE001 - e.g. the server did not start: the window's requests will say so too
            fail("warm-up", describe_error(e))

    def _unit(
        self, unit: list[Request], load: LoadStrategy, at: str, budget: RerunBudget, kept: list[_Attempt]
    ) -> None:
        """One unit: its first attempt, then reruns while it is contended and `budget` allows;
        the attempt with the fewest contended requests is kept (ties: the least stalled). An
        interrupt keeps what the unit measured so far (its last whole attempt, or the first
        attempt's requests that ended)."""
        h = self.s.contention if self.runner.capabilities.cpu_accounting else Handling()  # no CPU accounting: no rerun
        best = _Attempt()
        extra: list[Failure] = []
        reruns = 0
        try:
            self._attempt(unit, load, at, best)
            last_ms = best.wall_ms(load.concurrency == 1)
            budget.first(last_ms)
            first_contended = bool(self._contended(best))
            if h.max_cpu_stall is not None:
                while not best.failures and reruns < h.reruns and self._contended(best) and budget.allows(last_ms):
                    reruns += 1
                    if isinstance(self.runner, FitsThreads):  # the CPUs left free may have changed: every arm alike
                        self.runner.fit_threads("before a contended cell's rerun")
                    again = _Attempt()
                    self._attempt(unit, load, at, again)
                    last_ms = again.wall_ms(load.concurrency == 1)
                    budget.rerun(last_ms)
                    if again.failures:  # not contention: keep what was measured, say what failed
                        extra += again.failures
                        break
                    if (self._contended(again), self._stalled(again)) <= (self._contended(best), self._stalled(best)):
                        best = again
                budget.cell(first_contended, bool(self._contended(best)), reruns)
        finally:
            for r in best.records:
                r.contention_reruns = reruns
            self.m.requests += best.records
            self.m.failures += best.failures + extra
            kept.append(best)

    def _attempt(self, unit: list[Request], load: LoadStrategy, at: str, into: _Attempt, tally: bool = True) -> None:
        """One attempt at `unit` through the runner (_send: between two counter scrapes of each
        of its runners). A request's record (or Failure, stage "request") is kept in `into` as
        its result is read (Done), so an interrupt keeps them. Raises interrupt.OutOfTime
        between requests once measurement.max_wall_s has run out. `tally`: count the requests
        that end in `ended` (the load points' progress; not the envelope search's probes)."""
        c, r = self._labels(load)
        where = f" at {at}" if self.labelled else ""
        count = 0

        def ended(i: int) -> None:
            nonlocal count
            count += 1
            if tally:
                req = unit[i]
                self.ended[req.draft, req.law.name, c, r] += 1
            if count < len(unit):
                interrupt.check_budget()  # between requests: the next one is not sent once the budget ran out

        def done(i: int, result: RequestResult) -> None:
            req = unit[i]
            if isinstance(result, BaseException):  # recorded, the run goes on
                into.failures.append(
                    Failure(
                        FailureStage.REQUEST,
                        req.draft,
                        req.law.name,
                        f"request {req.prompt.id}{where}",
                        describe_error(result),
                        c,
                        r,
                    )
                )
            else:
                info = self.m.drafts.get(req.draft)
                rec = request_record(req, result, (info.num_draft_tokens or 0) if info is not None else 0, c, r)
                into.starts[id(rec)] = result.started_s
                into.records.append(rec)

        e = self._send(unit, load, into, done, ended)
        if e is not None:  # nothing was sent (a server that cannot start), or not all: every request left failed
            kept = len(into.records) + len(into.failures)
            left = unit[kept:]
            for req in left if tally else []:
                self.ended[req.draft, req.law.name, c, r] += 1
            if left:
                into.failures.append(
                    Failure(
                        FailureStage.REQUEST,
                        left[0].draft,
                        left[0].law.name,
                        f"{len(left)} requests{where}",
                        describe_error(e),
                        c,
                        r,
                    )
                )

    def _send(
        self,
        unit: list[Request],
        load: LoadStrategy,
        into: _Attempt,
        done: Callable[[int, RequestResult], None],
        ended: Callable[[int], None] | None = None,
    ) -> Exception | None:
        """The one way requests reach the runner: `unit` at `load` (runner.run, with `done` and
        `ended`), between two counter scrapes of each of its runners (their deltas, the
        server's own latency and the scrape errors kept in `into`), with the CPU pressure and
        the client's workers over it. Returns what runner.run raised (None: it returned);
        raises interrupt.OutOfTime and KeyboardInterrupt as they come."""
        names = list(dict.fromkeys(q.draft for q in unit))
        before = {name: self._scrape(name, into) for name in names}
        into.scraped.update(name for name, b in before.items() if b is not None)
        interrupt.check_budget()
        probe = Probe()
        started = probe.start()
        try:
            self.runner.run(unit, load, done, ended)
            return None
        except Exception as e:  # noqa: BLE001 - the caller records it as the failure of what was not measured
            return e
        finally:
            seen = self.runner.observed()  # beside the results: listen-queue overflows, the client's workers
            self.m.notes += seen.notes
            into.client_workers = seen.client_workers
            reading = probe.stop(started)
            if reading.cpu_stall_ms is not None and reading.wall_ms > 0:
                into.stall_share = min(1.0, reading.cpu_stall_ms / reading.wall_ms)
            for name in names:
                after = self._scrape(name, into)
                into.counters[name] = _delta(before[name], after)
                into.latency[name] = _latency(before[name], after)

    def _draw(self, plans: list[Any], look: str = "") -> None:
        """The served exactness plans' sample requests (gate.exactness.sampled.SamplePlan)
        through the runner (_send, as every timed window), runner by runner (a managed runner
        switches servers once per runner) and load point by load point, each with its own seed
        (request_seed over the runner, prompt, law and sample index). A request that returned
        token ids is a SampleRecord; one that failed or came back without ids is counted, and
        each (runner, law, point) with any gets one Failure (stage exactness) naming how many
        and the first error: never a sample. The cost (requests, tokens, wall seconds, what the
        server's counters say was proposed) goes to m.notes, said of `look` (a sequential run's
        sample look; the wall seconds add up over the looks). Raises interrupt.OutOfTime or
        KeyboardInterrupt between requests as they come."""
        from gate.exactness.sampled import sample_requests, speculated_note

        total = sum(p.requests_per_runner * len(p.runners) for p in plans)
        done_so_far = 0
        first_sample = len(self.m.samples)
        runners = list(dict.fromkeys(name for plan in plans for name in plan.runners))
        # runner-major: a slow-switching runner (vLLM) starts each server once for every law
        for name, plan in ((name, plan) for name in runners for plan in plans if name in plan.runners):
            started = time.perf_counter()
            proposed = SpecDecodeCounters()
            counted = name != FALLBACK
            for k, point in enumerate(plan.points):
                reqs = sample_requests(plan, name, k, self.s.seed)
                c, r = point_of(point)
                errors: list[str] = []
                drawn = 0

                def done(
                    i: int,
                    result: RequestResult,
                    reqs: list[Request] = reqs,
                    errors: list[str] = errors,
                    c: int | None = c,
                    r: float | None = r,
                ) -> None:
                    nonlocal drawn
                    req = reqs[i]
                    if isinstance(result, BaseException):
                        errors.append(describe_error(result))
                    elif not result.output_ids or UNKNOWN_ID in result.output_ids:
                        errors.append("the response carried no token ids (a sample needs them)")
                    else:
                        drawn += 1
                        self.m.samples.append(
                            SampleRecord(name, plan.law.name, req.prompt.id, req.seed, list(result.output_ids), c, r)  # noqa: B023
                        )

                into = _Attempt()
                e = self._send(reqs, point, into, done)
                if e is not None:  # e.g. the server did not start: every sample of this point not drawn failed
                    errors += [describe_error(e)] * max(1, len(reqs) - drawn - len(errors))
                delta = into.counters.get(name)
                if delta is None:
                    counted = False
                else:
                    proposed = proposed + delta
                if errors:
                    self.m.failures.append(
                        Failure(
                            FailureStage.EXACTNESS,
                            name,
                            plan.law.name,
                            f"{len(errors)} of {len(reqs)} sample requests at {describe_point(point)}",
                            errors[0],
                            c,
                            r,
                        )
                    )
                done_so_far += len(reqs)
                self.progress("exactness samples", done_so_far, total)
            wall = time.perf_counter() - started
            mine = [s for s in self.m.samples[first_sample:] if s.runner == name and s.law == plan.law.name]
            self.m.notes.append(
                f"served exactness samples of {name} under {plan.law.name}{look}: {len(mine)} requests, "
                f"{sum(len(s.output_ids) for s in mine)} output tokens, {wall:.1f} s wall"
                + (speculated_note(proposed) if counted else "")
            )
            key = f"{name}/{plan.law.name}"
            self.m.sample_wall_s[key] = round(self.m.sample_wall_s.get(key, 0.0) + wall, 3)

    def _scrape(self, name: str, into: _Attempt) -> Any:
        """The runner's counters for `name` now (None: it has none, or the scrape failed: the
        error is kept in `into` and becomes a failure of the window)."""
        if not self.runner.capabilities.server_counters:
            return None
        try:
            return self.runner.counters(name)
        except Exception as e:  # noqa: BLE001 - an unreachable metrics URL is a failed measurement, not a crash
            into.scrape_errors.setdefault(name, describe_error(e))
            return None

    def _record_windows(self, block: Block, at: str, kept: list[_Attempt]) -> None:
        """One RunRecord per runner and law of `block` from the kept attempts, in the order they
        first ran; a scrape that failed, or counters that did not move for a draft that always
        proposes, is a failure."""
        c, r = self._labels(block.load)
        keys = dict.fromkeys((rec.draft, rec.law) for a in kept for rec in a.records)
        for name, law in keys:
            mine = [a for a in kept if any((rec.draft, rec.law) == (name, law) for rec in a.records)]
            spans = [(a.starts[id(rec)], rec) for a in mine for rec in a.records if (rec.draft, rec.law) == (name, law)]
            w = RunRecord.of(name, law, block.load.offered(), spans, server=self.runner.server_info(name))
            w.repetition = block.repetition
            if len(block.units) == 1 and kept and kept[0].stall_share is not None:  # the probe spans the window
                w.cpu_stall_share = kept[0].stall_share
            if len(mine) == 1:  # the workers' own figures and the server's histograms span the window
                w.client_workers = list(mine[0].client_workers)
                latency = mine[0].latency.get(name)
                if latency is not None:
                    w.server_ttft_mean_ms, w.server_itl_mean_ms = latency.ttft_mean_ms, latency.itl_mean_ms
                    if latency.cached_tokens is not None:
                        w.server_cached_tokens = int(latency.cached_tokens)
            deltas = [a.counters.get(name) for a in mine]
            w.counters = sum(deltas, SpecDecodeCounters()) if deltas and all(d is not None for d in deltas) else None
            self._reconcile(w, [rec for _, rec in spans], at)
            if self.s.slo_ms:
                w.good_requests, w.slo_ms = sum(meets(rec, self.s.slo_ms) for _, rec in spans), dict(self.s.slo_ms)
            self.m.runs.append(w)
            error = next((a.scrape_errors[name] for a in mine if name in a.scrape_errors), None)
            # A draft model proposes at every step: a server scraped for counters that has none for spec decode
            # cannot show that it speculated. Counters that did not move are judged with the requests' own
            # counts after the run (gate.measure.speculation), for every draft kind alike.
            info = self.m.drafts.get(name)
            always_proposes = info is not None and info.probability_info == "distribution"
            if error:
                self.m.failures.append(
                    Failure(FailureStage.REQUEST, name, law, f"server counters at {at}", error, c, r)
                )
            elif always_proposes and any(name in a.scraped for a in mine) and w.counters is None:
                self.m.failures.append(
                    Failure(
                        FailureStage.REQUEST,
                        name,
                        law,
                        f"server counters at {at}",
                        f"speculation not shown: the server exposes no spec-decode counters while it committed "
                        f"{w.committed_tokens} tokens",
                        c,
                        r,
                    )
                )

    def _reconcile(self, w: RunRecord, requests: list[RequestRecord], at: str) -> None:
        """A window whose requests carry the server's own per-request step counts (vLLM's
        per-request spec-decode metrics) against the server's counter deltas over the same
        window: they count the same steps, so a difference (a request the window's scrapes
        did not bracket, another client on the server) is a note naming both."""
        counted = [r.counters for r in requests if r.server_step_proposed is not None]
        if w.counters is None or not counted or len(counted) < len(requests):
            return
        mine = sum((c for c in counted if c is not None), SpecDecodeCounters())
        server = w.counters
        if (mine.num_drafts, mine.num_draft_tokens, mine.num_accepted_tokens) != (
            server.num_drafts,
            server.num_draft_tokens,
            server.num_accepted_tokens,
        ):
            self.m.notes.append(
                f"per-request spec-decode metrics of {w.runner} under {w.law} at {at} do not reconcile with the "
                f"server's counters: {mine.num_drafts} steps, {mine.num_draft_tokens} proposed, "
                f"{mine.num_accepted_tokens} accepted over its {len(requests)} requests; the counters moved by "
                f"{server.num_drafts}, {server.num_draft_tokens}, {server.num_accepted_tokens}"
            )

    def _contended(self, a: _Attempt) -> int:
        h = self.s.contention
        return sum(is_contended(r, h.max_cpu_stall, h.cpus) for r in a.records)

    def _stalled(self, a: _Attempt) -> float:
        return pooled_stall_share(a.records, self.s.contention.cpus) or 0.0


def _delta(before: Any, after: Any) -> SpecDecodeCounters | None:
    if before is None or after is None:
        return None
    from gate.runners.server_metrics import counter_delta

    return counter_delta(before, after)


def _latency(before: Any, after: Any) -> ServerLatency | None:
    """The server's own mean TTFT/ITL between two scrapes (None: not scraped, or no histograms)."""
    if before is None or after is None:
        return None
    from gate.runners.server_metrics import latency_delta

    try:
        return latency_delta(before, after)
    except (ValueError, KeyError):  # a restarted server or an odd exposition: the cross-check is left out
        return None


def _not_lossless(m: Measurements) -> None:
    """A Failure at stage "verification" for each draft whose server says it verifies with a
    method that does not keep the target's law (ServerRecord.lossless False), once."""
    for s in m.servers:
        if s.lossless is False and not any(
            f.stage == FailureStage.VERIFICATION and f.draft == s.runner for f in m.failures
        ):
            m.failures.append(
                Failure(
                    FailureStage.VERIFICATION,
                    s.runner,
                    "*",
                    "verification",
                    f"the server of {s.runner} verifies with {s.verification}, which does not keep "
                    "the target's law (acceptance not decided by p and q): no exactness or speedup "
                    "verdict rests on it",
                )
            )


def _server_pools(plan: Any, m: Measurements) -> None:
    """The served bill where servers say what they preallocated (gate.loop.bill.add_server_pools)."""
    from gate.loop.bill import add_server_pools
    from gate.measure.bill import SERVER_POOL_LINE

    if not m.bills or any(x.name == SERVER_POOL_LINE for b in m.bills for x in b.lines):
        return
    try:
        add_server_pools(plan, m.bills, m.servers)
    except Exception as e:  # noqa: BLE001 - a bill that cannot be computed is a failed measurement
        m.failures.append(Failure(FailureStage.BILL, "*", "*", "served bill", describe_error(e)))


def _servers(runner: Runner, names: list[str]) -> list[Any]:
    """What gate saw of each runner's engine (Runner.describe; none for gate's own loop)."""
    return [d for name in names if (d := runner.describe(name)) is not None]


def request_record(
    req: Request,
    g: StreamResult,
    num_draft_tokens: int,
    concurrency: int | None = None,
    request_rate: float | None = None,
) -> RequestRecord:
    """A runner's StreamResult labelled with its planned request, the draft's gamma
    (`num_draft_tokens`, 0 for the fallback) and, for served runs, its load point."""
    return RequestRecord(
        draft=req.draft,
        law=req.law.name,
        prompt_id=req.prompt.id,
        category=req.prompt.category,
        max_new_tokens=req.max_new_tokens,
        repetition=req.repetition,
        prompt_tokens=len(req.prompt.token_ids),
        output_ids=g.output_ids,
        token_times_ms=g.token_times_ms,
        step_committed=g.step_committed,
        step_proposed=g.step_proposed,
        step_accepted=g.step_accepted,
        stop_reason=g.stop_reason,
        e2el_ms=g.e2el_ms,
        num_draft_tokens=num_draft_tokens,
        kv_cache_tokens=g.kv_cache_tokens,
        kv_cache_bytes=g.kv_cache_bytes,
        draft_kv_cache_bytes=g.draft_kv_cache_bytes,
        context_length=req.prompt.context_length,
        constraint=req.prompt.constraint,
        stop_string=g.stop_string,
        cpu_time_ms=g.cpu_time_ms,
        cpu_stall_ms=g.cpu_stall_ms,
        load_avg_1m=g.load_avg_1m,
        threads=g.threads,
        concurrency=concurrency,
        request_rate=request_rate,
        queue_ms=g.queue_ms,
        server_draft_tokens=g.server_draft_tokens,
        server_accepted_tokens=g.server_accepted_tokens,
        server_step_proposed=g.server_step_proposed,
        server_step_accepted=g.server_step_accepted,
        step_mapping_ms=g.step_mapping_ms,
        step_draft_tokens=g.step_draft_tokens,
        **client_fields(g),
    )


def client_fields(g: StreamResult) -> dict[str, Any]:
    """RequestRecord's fields of a served client's own timing (none in-process)."""
    c = g.client
    if c is None:
        return {}
    return dict(
        schedule_lag_ms=c.schedule_lag_ms,
        send_ms=c.send_ms,
        connect_ms=c.connect_ms,
        headers_ms=c.headers_ms,
        loop_lag_ms=c.loop_lag_ms,
        client_worker=c.worker,
        server_output_tokens=c.server_output_tokens,
        server_prefill_ms=c.server_prefill_ms,
        server_tpot_ms=c.server_tpot_ms,
        server_cached_tokens=c.server_cached_tokens,
        started_s=g.started_s,
    )


def _exactness_phases(
    session: Session,
    m: Measurements,
    plan: ExactnessPlan,
    seed: int,
    progress: Progress,
    checked: set[tuple[Any, ...]] | None = None,
    per_request_only: bool = False,
) -> list[Phase]:
    """The exactness pass of the plan's (draft, law) pairs. A runner of the local target
    (session.local): each output against the target's own law (greedy argmax,
    PIT, next-token laws; _exactness). A served runner: greedy token equality with the
    fallback runner, divergences weighed by the local target's logit gap where it is loaded
    (gate.exactness.fallback.greedy_exactness), and for sampling laws the one- and
    two-sample counts of the samples the requests phase drew (gate.exactness.sampled).
    `checked`: the greedy requests a sequential run's looks already checked (_exactness).
    `per_request_only`: only the checks of this run's own requests (a shard but the first:
    greedy equality, PIT), not the first steps or served samples the first shard draws."""
    if session.local:
        if not plan.pairs:
            return []
        return [
            Phase(
                "the exactness pass",
                FailureStage.EXACTNESS,
                lambda: _exactness(session, m, plan, seed, progress, checked, first_steps=not per_request_only),
            )
        ]
    from gate.exactness import fallback as fallback_exactness
    from gate.exactness import sampled as sampled_exactness

    greedy_pairs = plan.has_greedy(session.laws)
    sampled_pairs = any(not law.greedy for law in session.laws if law.name in {x for _, x in plan.pairs})

    def served() -> None:
        fallback_exactness.greedy_exactness(session, m, plan, progress)
        if sampled_pairs and not per_request_only:
            sampled_exactness.sampled_exactness(session, m, plan, progress)

    return [
        Phase(
            "the served exactness pass",
            FailureStage.EXACTNESS,
            served,
            unmeasured=None if greedy_pairs or sampled_pairs else (lambda why, when: []),
        )
    ]


def _bill(session: Session, m: Measurements, settings: Settings) -> None:
    """The bill of every runner: from the weights loaded here (the in-process runner), else
    from the models' configs without loading weights (as `gate bill`)."""
    if session.local:
        _bills(session, m, max(settings.max_new_tokens), settings.resources)
    else:
        _config_bills(session.plan, m)


def _config_bills(plan: Any, m: Measurements) -> None:
    """The bill of every runner from configs, without loading weights (as `gate bill`), with
    what each server preallocated where it says (_server_pools)."""
    from gate.loop.bill import policy_bills

    try:
        m.bills = policy_bills(plan)
    except Exception as e:  # noqa: BLE001 - a bill that cannot be computed is a failed measurement
        m.failures.append(Failure(FailureStage.BILL, "*", "*", "bill", describe_error(e)))
    _server_pools(plan, m)


def _oracle(session: Session) -> TargetOracle:
    """The session's target oracle. Raises RuntimeError where there is no local target."""
    if session.oracle is None:
        raise RuntimeError("no local copy of the target: teacher-forced checks (overlap, exactness) need one")
    return session.oracle


def _bound(session: Session, law: Law, prompt: PlannedPrompt) -> RequestLaw:
    """`law` for one request on `prompt`: its prompt length (penalties) and a fresh matcher of
    its response format, if it has one (grammar). Raises ValueError when the format does not
    compile."""
    return _oracle(session).bind(law, len(prompt.token_ids), prompt.response_format)


@torch.inference_mode()
def _overlaps(
    session: Session, m: Measurements, progress: Progress, only: set[str] | None = None, laws: set[str] | None = None
) -> None:
    """Teacher-forced overlap along every fallback continuation of the first repetition:
    one forward of the target and one of each draft per sequence. `only`: these drafts, along
    the continuations of prompts they have no overlap on yet (a sequential run's further looks);
    None: every draft, every continuation. `laws`: under these laws only (a shard's, Loop.overlap_laws)."""
    prompts = {p.id: p for p in session.prompts}
    laws = {law.name: law for law in session.laws}
    done: set[tuple[str, str]] = set()
    had = {(o.draft, o.prompt_id, o.law) for o in m.overlaps}
    wanted = [name for name in session.drafts if only is None or name in only]

    def drafts_for(rec: RequestRecord) -> list[str]:
        return [name for name in wanted if (name, rec.prompt_id, rec.law) not in had]

    runs = [
        r
        for r in m.requests
        if r.draft == FALLBACK
        and r.repetition == 0
        and r.output_ids
        and (laws is None or r.law in laws)
        and drafts_for(r)
    ]
    for i, rec in enumerate(runs):
        progress(FailureStage.OVERLAP, i, len(runs))
        interrupt.check_budget()
        law = laws[rec.law]
        if law.greedy:  # greedy continuations of one prompt are prefixes of the longest one
            key = (rec.prompt_id, rec.law)
            if key in done:
                continue
            rec = max((r for r in runs if (r.prompt_id, r.law) == key), key=lambda r: len(r.output_ids))
            done.add(key)
        prompt = list(prompts[rec.prompt_id].token_ids)
        ids = prompt + rec.output_ids
        try:
            law = _bound(session, laws[rec.law], prompts[rec.prompt_id])
            p = _oracle(session).target_probs(ids, len(prompt), law)
        except Exception as e:  # noqa: BLE001
            m.failures.append(
                Failure(
                    FailureStage.OVERLAP, "*", rec.law, f"overlap {rec.prompt_id}: target forward", describe_error(e)
                )
            )
            continue
        for name in drafts_for(rec):
            draft = session.drafts[name]
            try:
                q = draft.teacher_forced(ids, len(prompt), law, p.shape[-1])
                ov, top1 = position_overlaps(p, q.to(p.device))
            except Exception as e:  # noqa: BLE001
                m.failures.append(
                    Failure(FailureStage.OVERLAP, name, rec.law, f"overlap {rec.prompt_id}", describe_error(e))
                )
                continue
            m.overlaps.append(
                OverlapRecord(
                    name,
                    rec.law,
                    rec.prompt_id,
                    rec.category,
                    draft.probability_info,
                    ov,
                    top1,
                    rec.context_length,
                    constraint=rec.constraint,
                )
            )
    progress(FailureStage.OVERLAP, len(runs), len(runs))


@torch.inference_mode()
def _exactness(
    session: Session,
    m: Measurements,
    plan: ExactnessPlan,
    seed: int,
    progress: Progress,
    checked: set[tuple[Any, ...]] | None = None,
    only_greedy: bool = False,
    first_steps: bool = True,
) -> None:
    """Raw material of the exactness tests: for greedy laws every committed token checked
    against the target's argmax on the output's own prefix (one teacher-forced forward per
    request), for sampling laws the PIT value of every token under the target's processed
    law, and speculative first steps drawn many times from each of the first
    next_token_prompts prompts (next-token tests at the first position and after shared prefixes).
    `checked`: (runner, law, request key) of the greedy requests already checked into
    m.exactness (a sequential run checks them after each look, `only_greedy`, so that a
    fault stops its cell at the look that found it); they are not checked again. `first_steps`
    False: no speculative first steps (a shard but the first: they are drawn once, in the first)."""
    laws = {law.name: law for law in session.laws}
    prompts = {p.id: p for p in session.prompts}
    pit_generator = torch.Generator().manual_seed(seed)
    pairs = sorted(p for p in plan.pairs if p[0] in session.drafts and p[1] in laws)
    checked = checked if checked is not None else set()
    for i, (name, law_name) in enumerate(pairs):
        if only_greedy and not laws[law_name].greedy:
            continue
        progress("exactness", i, len(pairs))
        law = laws[law_name]
        # a greedy record checked at an earlier look goes on from the requests it has not seen
        earlier = next((x for x in m.exactness if (x.draft, x.law) == (name, law_name)), None) if law.greedy else None
        rec = earlier or ExactnessRecord(name, law_name, law.greedy)
        m.exactness = [x for x in m.exactness if (x.draft, x.law) != (name, law_name)]
        try:
            for r in (r for r in m.requests if r.draft == name and r.law == law_name and r.output_ids):
                key = (r.draft, r.law, r.prompt_id, r.max_new_tokens, r.repetition, r.concurrency, r.request_rate)
                if law.greedy and key in checked:
                    continue
                interrupt.check_budget()
                prompt = list(prompts[r.prompt_id].token_ids)
                ids = prompt + r.output_ids
                logits = _oracle(session).target_logits(ids, len(prompt))
                bound = _bound(session, law, prompts[r.prompt_id])  # the penalties and grammar of each position
                if law.greedy:
                    rec.compared += 1
                    rec.divergences += greedy_divergences(
                        law_logits(logits, bound, ids, len(prompt)), r.output_ids, r.prompt_id, r.repetition
                    )
                    checked.add(key)
                else:
                    u = randomized_pit(
                        law_probs(logits, bound, ids, len(prompt)).cpu(), torch.tensor(r.output_ids), pit_generator
                    )
                    rec.pit += [None if v != v else float(v) for v in u.tolist()]
            asked = plan.next_token_samples.get((name, law_name), Asked())
            draws = first_steps and not only_greedy and not law.greedy and not asked.none
            if session.runner.capabilities.first_steps and draws:
                for prompt in session.prompts[: plan.next_token_prompts]:
                    interrupt.check_budget()
                    ids = list(prompt.token_ids)
                    fmt = prompt.response_format
                    n = asked.draw(partial(_planned_first_steps, session, plan, name, law, prompt, m))
                    steps = session.runner.first_steps(
                        ids, name, law, n, request_seed(seed, prompt.id, law_name, -1, 0), fmt
                    )
                    # the first position (a claim test) and prefixes many steps share (evidence)
                    for prefix, tokens in contexts(steps):
                        p = _oracle(session).next_token_law(ids, prefix, law, fmt)
                        rec.next_token.append(sparse_counts(prompt.id, tokens, p.cpu(), prefix=prefix))
        except Exception as e:  # noqa: BLE001
            if only_greedy:  # a look's check: the exactness pass checks the rest again and records why
                m.exactness.append(rec)
                continue
            m.failures.append(Failure(FailureStage.EXACTNESS, name, law_name, "exactness", describe_error(e)))
            continue
        m.exactness.append(rec)
    progress("exactness", len(pairs), len(pairs))


def _planned_first_steps(
    session: Session, plan: ExactnessPlan, name: str, law: Law, prompt: PlannedPrompt, m: Measurements
) -> int:
    """The speculative first steps of draft `name` on `prompt` that gate chooses
    (next_token_samples auto): as many as the claim test at the first position needs to
    detect the most demanding rule's detect_tv at its power
    (gate.exactness.sampled.planned_first_steps), said in m.notes."""
    from gate.exactness.sampled import TESTS_PER_PROMPT, planned_first_steps

    tv, power, alpha = plan.demands.get((name, law.name), (0.1, 0.9, DEFAULT_SIGNIFICANCE))
    drafts = sum(1 for _, x in plan.pairs if x == law.name)
    # the Holm family a claim is decided in: each prompt's next-token tests and each draft's PIT
    level = alpha / max(1, (TESTS_PER_PROMPT * plan.next_token_prompts + 1) * drafts)
    n = planned_first_steps(session, law, prompt, tv, power, level, plan.most_samples)
    m.notes.append(
        f"in-process next-token samples of {name} under {law.name} on {prompt.id}: {n} first steps, chosen by gate "
        f"(next_token_samples auto) so the claim test detects TV {tv:g} at power {power:g} at level {level:.3g} "
        f"(at most {plan.most_samples}, measurement.budget.samples)"
    )
    return n


def _bills(session: Session, m: Measurements, max_new_tokens: int, resources: Any) -> None:
    """The bill per runner from the weights actually loaded and each model's own config,
    at the policy's resources (default: the workload's longest sequence, one sequence)."""
    try:
        context = resources.context_tokens or max(len(p.token_ids) for p in session.prompts) + max_new_tokens
        drafts = [
            draft_kinds.loaded_bill(name, draft, session.target, lambda dtype: kv_format(resources, dtype))
            for name, draft in session.drafts.items()
        ]
        target_cache = cache_model(session.target.config, kv_format(resources, dtype_name(session.target)))
        bills = bills_for(
            resources, context, _oracle(session).vocab_size, target_cache, weight_bytes(session.target), drafts
        )
        for bill in bills:
            reqs = [r for r in m.requests if r.draft == bill.draft]
            line = next(x for x in bill.lines if x.name == "target KV cache")
            if reqs and resources.kv_dtype == "auto":  # requests run one sequence at a time
                longest = max(reqs, key=lambda r: r.kv_cache_tokens)
                line.measured_bytes = longest.kv_cache_bytes
                line.measured_at_tokens = longest.kv_cache_tokens
                line.predicted_at_measured_bytes = target_cache.bytes(longest.kv_cache_tokens)
        m.bills.extend(bills)
    except Exception as e:  # noqa: BLE001
        m.failures.append(Failure(FailureStage.BILL, "*", "*", "bill", describe_error(e)))
