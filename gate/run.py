"""Run the plan: timed requests (fallback and drafts interleaved) through the session's
runner under sequential load, overlap and exactness along the outputs with the target
oracle, and the bill. Each run of the plan's requests is also recorded as measured
windows (gate.records.RunRecord, one per runner and law). Nothing measured is lost: a
request that fails is recorded as a Failure and the run goes on; an interrupt stops the
run with what it has.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch

from gate import interrupt
from gate.drafts import registry as draft_kinds
from gate.errors import describe_error
from gate.measure.bill import bills_for, kv_format
from gate.measure.kv import cache_model
from gate.load.sequential import SEQUENTIAL
from gate.measure.contention import BUSY_CELLS, Handling, RerunBudget, is_contended, pooled_stall_share
from gate.measure.environment import environment, process_peak_rss_bytes, record_load
from gate.measure.overlap import position_overlaps
from gate.models.load import dtype_name, weight_bytes
from gate.constraints import bind
from gate.law import Law, RequestLaw, law_logits, law_probs
from gate.measure.exactness import contexts, greedy_divergences, randomized_pit, sparse_counts
from gate.measure.identity import measure_identity, modifies_target
from gate.plan import ExactnessPlan, PlannedPrompt, Request, plan_requests, request_seed
from gate.oracle import TargetOracle
from gate.runners.interface import RequestResult, StreamResult
from gate.records import (FALLBACK, DraftInfo, ExactnessRecord, Failure, FailureStage, Measurements, OfferedLoad, OverlapRecord,
                          RequestRecord, RunRecord)
from gate.session import Session

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def measure(session: Session, max_new_tokens: list[int], repetitions: int, seed: int, resources: Any,
            warmup: int = 1, progress: Progress | None = None, exactness: ExactnessPlan | None = None,
            interleave: bool = True, contention: Handling | None = None) -> Measurements:
    """Every measurement the policy needs, as raw records (see gate.records).
    `warmup`: untimed requests per runner before timing (0: none); `contention`: when a
    request is contended and how often its cell is rerun (default: recorded, never rerun)."""
    progress = progress or (lambda *_: None)
    env = environment(session.device, seed)
    env.models = session.models
    m = Measurements(environment=env, laws=[law.name for law in session.laws])
    m.drafts = {name: DraftInfo(d.kind, d.num_draft_tokens, d.probability_info, modifies_target(d.kind))
                for name, d in session.drafts.items()}
    # drafts with their own tokenizer (cross_tokenizer) compared it with the target's when built
    m.tokenizers = [c for d in session.drafts.values() if (c := getattr(d, "tokenizer_comparison", None)) is not None]
    m.workload = session.workload
    requests = plan_requests(list(session.drafts), session.laws, session.prompts, max_new_tokens, repetitions, seed,
                             interleave)
    if session.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(session.device)

    def peaks() -> None:
        record_load(m.environment, m.requests)
        m.process_peak_rss_bytes = process_peak_rss_bytes()
        if session.device.type == "cuda":
            m.cuda_max_memory_allocated_bytes = int(torch.cuda.max_memory_allocated(session.device))
            m.cuda_max_memory_reserved_bytes = int(torch.cuda.max_memory_reserved(session.device))

    phases = [
        Phase("the warm-up", FailureStage.WARM_UP, lambda: [_warmup(session, m) for _ in range(warmup)],
              unmeasured=lambda why, when: []),  # the requests phase says what was not measured
        requests_phase(m, requests, lambda: _run_requests(session, m, requests, progress, contention)),
        Phase("the overlap pass", FailureStage.OVERLAP, lambda: _overlaps(session, m, progress)),
    ]
    if exactness and exactness.pairs:
        phases.append(Phase("the exactness pass", FailureStage.EXACTNESS,
                            lambda: _exactness(session, m, exactness, seed, progress)))
    phases += [
        Phase("the bill", FailureStage.BILL, lambda: _bills(session, m, max(max_new_tokens), resources), after_stop=True),
        # bookkeeping on what was measured; before the identity check: the release model (a
        # reference, never resident at serve time) moves none of the peaks
        Phase("the bookkeeping", FailureStage.RUN, peaks, after_stop=True, bookkeeping=True),
        Phase("the target identity check", FailureStage.IDENTITY, lambda: measure_identity(session, m, progress),
              unmeasured=lambda why, when: [] if getattr(session, "release", None) is None else [
                  Failure(FailureStage.IDENTITY, "*", "*", "target identity", f"not measured: {why} {when}")]),
    ]
    run_phases(m, phases)
    return m


@dataclass
class Phase:
    """One measuring phase of a run (gate.run.measure, gate.served.measure_served).

    `name`: as notes name it ("the requests", "the overlap pass"); `stage`: the failure
    stage of what it measures; `run`: the phase itself. `unmeasured(why, when)` gives the
    failures for what it did not measure when a signal or the budget stopped it (`why`:
    "interrupted by SIGTERM" or "measurement.max_wall_s (20 min) ran out"; `when`: "during
    the overlap pass", or "during the requests, before the overlap pass" for a phase that
    did not start); default: one failure at `stage` for
    every draft and law. `after_stop`: it still runs once the run was stopped (what is
    cheap and needs no further request: the bill from configs); `bookkeeping`: it is never
    cut short (a signal inside it is only recorded) and never a failure when skipped."""

    name: str
    stage: FailureStage
    run: Callable[[], Any]
    unmeasured: Callable[[str, str], list[Failure]] | None = None
    after_stop: bool = False
    bookkeeping: bool = False
    detail: Callable[[], str | None] | None = None  # what the phase measured, for the note ("3 of 40 requests measured")

    def missing(self, why: str, when: str) -> list[Failure]:
        if self.bookkeeping:
            return []
        if self.unmeasured is not None:
            return self.unmeasured(why, when)
        return [Failure(self.stage, "*", "*", self.name.removeprefix("the "), not_measured(why, when))]


def not_measured(why: str, when: str) -> str:
    """A failure's message for what a stopped run did not measure: "interrupted by SIGTERM
    <when>: not measured", or "not measured: measurement.max_wall_s (20 min) ran out <when>"."""
    return f"{why} {when}: not measured" if why.startswith("interrupted") else f"not measured: {why} {when}"


def stop_reason() -> str:
    """Why the run stopped: "interrupted by SIGTERM" or "measurement.max_wall_s (20 min) ran out"."""
    return f"{interrupt.budget()} ran out" if interrupt.ran_out() and interrupt.received() is None else \
        f"interrupted by {interrupt.name()}"


def run_phases(m: Measurements, phases: list[Phase]) -> str | None:
    """Run the measuring phases in order, under one guard. An Exception escaping a phase is a
    failure at its stage and the next phase runs. The first SIGINT or SIGTERM (a
    KeyboardInterrupt) or the budget running out (interrupt.OutOfTime, raised between
    requests and when a phase is entered) stops the phase in progress: what was measured is
    kept, that phase and every later one add failures for what they did not measure
    (Phase.missing), so no rule passes on missing data, and only the phases marked
    after_stop still run (a signal inside them is only recorded). Returns the name of the
    phase that was stopped (None: every phase ran); interrupt.stopped_in() says so too."""
    stop: str | None = None
    why = ""
    for ph in phases:
        if stop is not None:
            if ph.after_stop:
                with interrupt.deferred():
                    _safely(m, ph)
            else:
                m.failures += ph.missing(why, f"during {stop}, before {ph.name}")
            continue
        try:
            if ph.bookkeeping:
                with interrupt.deferred():
                    _safely(m, ph)
                if interrupt.received() is not None:  # a signal it only recorded: the run stops here, nothing lost
                    interrupt.caught()
                    stop, why = ph.name, stop_reason()
                    interrupt.stopped(ph.name)
            else:
                interrupt.entering(ph.name, budget=not ph.after_stop)  # an after_stop phase runs after the budget anyway
                _safely(m, ph)
        except (KeyboardInterrupt, interrupt.OutOfTime) as e:
            if isinstance(e, KeyboardInterrupt):
                interrupt.caught()
            interrupt.stop_raising()  # what is left is bookkeeping: a signal now is only recorded
            stop, why = ph.name, stop_reason()
            interrupt.stopped(ph.name, ph.detail() if ph.detail is not None else None)  # before its failures are added
            m.failures += ph.missing(why, f"during {ph.name}")
    return stop


def _safely(m: Measurements, ph: Phase) -> None:
    try:
        ph.run()
    except Exception as e:  # noqa: BLE001 - a phase that failed loses nothing else
        m.failures.append(Failure(ph.stage, "*", "*", ph.stage.value, describe_error(e)))


def requests_phase(m: Measurements, planned: list[Request], run: Callable[[], Any]) -> Phase:
    """The timed requests of an in-process run as a Phase: when stopped, each runner and law
    with requests that did not end gets a failure (stage "request") saying how many, and
    why: "not measured: measurement.max_wall_s (20 min) ran out after N of M requests", or
    "interrupted by SIGTERM after N of M requests: not measured"."""
    before = len(m.requests)
    failed_before = len(m.failures)

    def ended() -> Counter:
        done: Counter = Counter((r.draft, r.law) for r in m.requests[before:])
        done.update((f.draft, f.law) for f in m.failures[failed_before:] if f.stage == FailureStage.REQUEST)
        return done

    def unmeasured(why: str, when: str) -> list[Failure]:
        want = Counter((r.draft, r.law.name) for r in planned)
        done = ended()
        n, total = min(sum(done.values()), len(planned)), len(planned)
        text = not_measured(why, f"after {n} of {total} requests")
        return [Failure(FailureStage.REQUEST, draft, law, f"{k} of {want[draft, law]} requests not measured", text)
                for (draft, law), k in ((key, want[key] - done.get(key, 0)) for key in want) if k > 0]

    def detail() -> str:
        return f"{min(sum(ended().values()), len(planned))} of {len(planned)} requests measured"

    return Phase("the requests", FailureStage.REQUEST, run, unmeasured, detail=detail)


def measure_more(session: Session, m: Measurements, drafts: list[str], laws: list[str], max_new_tokens: list[int],
                 repetitions: range, seed: int, interleave: bool = True, progress: Progress | None = None,
                 contention: Handling | None = None) -> None:
    """Further repetitions of the cells of `drafts` (and their fallback) under `laws`,
    appended to `m.requests`: what measurement.extra_repetitions runs when a verdict is
    inconclusive. Overlap and exactness are not remeasured (they do not depend on timing).
    When measurement.max_wall_s runs out it stops between requests (interrupt.ran_out())."""
    chosen = [law for law in session.laws if law.name in laws]
    requests = plan_requests([d for d in session.drafts if d in drafts], chosen, session.prompts, max_new_tokens, repetitions,
                             seed, interleave)
    try:
        _run_requests(session, m, requests, progress or (lambda *_: None), contention)
    except KeyboardInterrupt:
        m.failures.append(Failure(FailureStage.RUN, "*", "*", "run", "interrupted during extra repetitions"))
    except interrupt.OutOfTime:  # the budget ran out: what was measured is kept (check() notes it)
        pass
    with interrupt.deferred():
        record_load(m.environment, m.requests)


# Once this many consecutive cells stayed contended through their first attempt and every
# rerun, the machine is busy for good and reruns stop for the rest of the run (they would only
# multiply the run time; the verdicts say the machine was contended, a note says reruns
# stopped). A count of stuck cells that clean cells bring back down never stopped a machine
# busy most of the time (issue 23: 29% of the example after 44 minutes). See RerunBudget.
STUCK_CELLS = BUSY_CELLS


def _cells(requests: list[Request]) -> list[list[Request]]:
    """Consecutive requests of one cell (law, length, prompt, repetition): with interleaving
    the fallback and every draft, run back to back; without it, one request each."""
    def key(r: Request) -> tuple:
        return r.law.name, r.max_new_tokens, r.prompt.id, r.prompt.context_length, r.repetition

    out: list[list[Request]] = []
    for req in requests:
        if out and key(out[-1][-1]) == key(req):
            out[-1].append(req)
        else:
            out.append([req])
    return out


def _run_requests(session: Session, m: Measurements, requests: list[Request], progress: Progress,
                  contention: Handling | None = None) -> None:
    """Run every request, a cell at a time. A cell with a contended request (see
    gate.measure.contention) is rerun whole, up to `contention.reruns` times, and the
    attempt with the fewest contended requests is kept (ties: the least stalled). The kept
    requests are recorded as windows in m.runs, also when an interrupt stops the run."""
    h = contention or Handling()
    load = SEQUENTIAL
    starts: dict[int, float] = {}  # id(record) -> its wall-clock start (s)
    kept: list[RequestRecord] = []
    try:
        _run_cells(session, m, requests, progress, h, starts, kept)
    finally:
        m.runs += _windows(kept, starts, load.offered())


def _run_cells(session: Session, m: Measurements, requests: list[Request], progress: Progress, h: Handling,
               starts: dict[int, float], kept: list[RequestRecord]) -> None:
    """Run the cells of `requests`, rerunning a contended cell while `RerunBudget` allows it
    (up to `h.reruns` times: not once the machine has stayed busy, nor beyond
    `h.rerun_budget` of the first attempts' time), and say in m.notes what reruns were not
    run and why (also when an interrupt stops the run)."""
    cells = _cells(requests)
    budget = RerunBudget(len(cells), h.rerun_budget, STUCK_CELLS)
    done = 0
    try:
        for cell in cells:
            progress("requests", done, len(requests))
            _contention_cell(session, m, cell, h, budget, starts, kept)
            done += len(cell)
    finally:
        note = budget.note() if h.max_cpu_stall is not None and h.reruns else None
        if note:
            m.notes.append(note)
    progress("requests", len(requests), len(requests))


def _contention_cell(session: Session, m: Measurements, cell: list[Request], h: Handling, budget: RerunBudget,
                     starts: dict[int, float], kept: list[RequestRecord]) -> None:
    """One cell: its first attempt, then reruns while it is contended and `budget` allows;
    the attempt with the fewest contended requests is kept (ties: the least stalled)."""
    records: list[RequestRecord] = []
    failures: list[Failure] = []
    reruns = 0
    try:  # an interrupt keeps what the cell measured so far (its last whole attempt)
        _run_cell(session, cell, starts, records, failures)
        last_ms = _wall_ms(records)
        budget.first(last_ms)
        first_contended = bool(_contended(records, h))
        if h.max_cpu_stall is not None:
            while not failures and reruns < h.reruns and _contended(records, h) and budget.allows(last_ms):
                reruns += 1
                again: list[RequestRecord] = []
                failed: list[Failure] = []
                _run_cell(session, cell, starts, again, failed)
                last_ms = _wall_ms(again)
                budget.rerun(last_ms)
                if failed:  # not contention: keep what was measured, say what failed
                    failures += failed
                    break
                if (_contended(again, h), _stalled(again, h)) <= (_contended(records, h), _stalled(records, h)):
                    records[:] = again
            budget.cell(first_contended, bool(_contended(records, h)), reruns)
    finally:
        for r in records:
            r.contention_reruns = reruns
        m.requests += records
        kept += records
        m.failures += failures


def _wall_ms(records: list[RequestRecord]) -> float:
    """The wall time of an attempt's timed requests (ms; they run one at a time)."""
    return sum(r.e2el_ms for r in records)


def _run_cell(session: Session, cell: list[Request], starts: dict[int, float], records: list[RequestRecord],
              failures: list[Failure]) -> None:
    """One attempt at a cell: its requests through the runner, one at a time. A request's
    record (or Failure, stage "request") is kept as it ends, so an interrupt keeps them.
    Raises interrupt.OutOfTime before a request once measurement.max_wall_s has run out."""

    def done(i: int, result: RequestResult) -> None:
        req = cell[i]
        if isinstance(result, BaseException):  # recorded, the run goes on
            failures.append(Failure(FailureStage.REQUEST, req.draft, req.law.name, f"request {req.prompt.id}", describe_error(result)))
            return
        record = _record(session, req, result)
        starts[id(record)] = result.started_s
        records.append(record)
        if i + 1 < len(cell):
            interrupt.check_budget()  # between requests: the next one is not sent once the budget ran out

    interrupt.check_budget()
    session.runner.run(cell, SEQUENTIAL, done)


def _windows(records: list[RequestRecord], starts: dict[int, float], load: OfferedLoad) -> list[RunRecord]:
    """One RunRecord per (runner, law) of `records`, in the order they first ran."""
    groups: dict[tuple[str, str], list[tuple[float, RequestRecord]]] = {}
    for r in records:
        groups.setdefault((r.draft, r.law), []).append((starts[id(r)], r))
    return [RunRecord.of(runner, law, load, spans) for (runner, law), spans in groups.items()]


def _contended(records: list[RequestRecord], h: Handling) -> int:
    return sum(is_contended(r, h.max_cpu_stall, h.cpus) for r in records)


def _stalled(records: list[RequestRecord], h: Handling) -> float:
    return pooled_stall_share(records, h.cpus) or 0.0


def _oracle(session: Session) -> TargetOracle:
    """The session's target oracle. Raises RuntimeError where there is no local target."""
    if session.oracle is None:
        raise RuntimeError("no local copy of the target: teacher-forced checks (overlap, exactness) need one")
    return session.oracle


def _warmup(session: Session, m: Measurements) -> None:
    """One short untimed request per runner: first calls allocate and pick kernels.
    A runner that fails here is recorded (stage "warm-up", so the run exits 3); rules judge
    its timed requests, which say for themselves whether they failed too."""
    for name in [FALLBACK, *session.drafts]:
        interrupt.check_budget()
        (result,) = session.runner.run([Request(name, session.laws[0], session.prompts[0], 4, 0, 0)], SEQUENTIAL)
        if isinstance(result, BaseException):
            m.failures.append(Failure(FailureStage.WARM_UP, name, "*", "warm-up", describe_error(result)))


def _record(session: Session, req: Request, g: StreamResult) -> RequestRecord:
    """The request's record: what the runner returned, labelled with the planned request."""
    draft = None if req.draft == FALLBACK else session.drafts.get(req.draft)
    return request_record(req, g, draft.num_draft_tokens if draft else 0)


def request_record(req: Request, g: StreamResult, num_draft_tokens: int, concurrency: int | None = None,
                   request_rate: float | None = None) -> RequestRecord:
    """A runner's StreamResult labelled with its planned request, the draft's gamma
    (`num_draft_tokens`, 0 for the fallback) and, for served runs, its load point."""
    return RequestRecord(
        draft=req.draft, law=req.law.name, prompt_id=req.prompt.id, category=req.prompt.category,
        max_new_tokens=req.max_new_tokens, repetition=req.repetition, prompt_tokens=len(req.prompt.token_ids),
        output_ids=g.output_ids, token_times_ms=g.token_times_ms, step_committed=g.step_committed,
        step_proposed=g.step_proposed, step_accepted=g.step_accepted, stop_reason=g.stop_reason, e2el_ms=g.e2el_ms,
        num_draft_tokens=num_draft_tokens, kv_cache_tokens=g.kv_cache_tokens,
        kv_cache_bytes=g.kv_cache_bytes, draft_kv_cache_bytes=g.draft_kv_cache_bytes,
        context_length=req.prompt.context_length, constraint=req.prompt.constraint, stop_string=g.stop_string,
        cpu_time_ms=g.cpu_time_ms, cpu_stall_ms=g.cpu_stall_ms, load_avg_1m=g.load_avg_1m, threads=g.threads,
        concurrency=concurrency, request_rate=request_rate, queue_ms=g.queue_ms,
        server_draft_tokens=g.server_draft_tokens, server_accepted_tokens=g.server_accepted_tokens,
        step_mapping_ms=g.step_mapping_ms, step_draft_tokens=g.step_draft_tokens,
    )


def _bound(session: Session, law: Law, prompt: PlannedPrompt) -> RequestLaw:
    """`law` for one request on `prompt`: its prompt length (penalties) and a fresh matcher of
    its response format, if it has one (grammar). Raises ValueError when the format does not
    compile."""
    return bind(law, len(prompt.token_ids), prompt.response_format, session.grammars)


@torch.inference_mode()
def _overlaps(session: Session, m: Measurements, progress: Progress) -> None:
    """Teacher-forced overlap along every fallback continuation of the first repetition:
    one forward of the target and one of each draft per sequence."""
    prompts = {p.id: p for p in session.prompts}
    laws = {law.name: law for law in session.laws}
    done: set[tuple[str, str]] = set()
    runs = [r for r in m.requests if r.draft == FALLBACK and r.repetition == 0 and r.output_ids]
    for i, rec in enumerate(runs):
        progress("overlap", i, len(runs))
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
            m.failures.append(Failure(FailureStage.OVERLAP, "*", rec.law, f"overlap {rec.prompt_id}: target forward", describe_error(e)))
            continue
        for name, draft in session.drafts.items():
            try:
                q = draft.teacher_forced(ids, len(prompt), law, p.shape[-1])
                ov, top1 = position_overlaps(p, q.to(p.device))
            except Exception as e:  # noqa: BLE001
                m.failures.append(Failure(FailureStage.OVERLAP, name, rec.law, f"overlap {rec.prompt_id}", describe_error(e)))
                continue
            m.overlaps.append(OverlapRecord(name, rec.law, rec.prompt_id, rec.category, draft.probability_info, ov, top1,
                                            rec.context_length, constraint=rec.constraint))
    progress("overlap", len(runs), len(runs))


@torch.inference_mode()
def _exactness(session: Session, m: Measurements, plan: ExactnessPlan, seed: int, progress: Progress) -> None:
    """Raw material of the exactness tests: for greedy laws every committed token checked
    against the target's argmax on the output's own prefix (one teacher-forced forward per
    request), for sampling laws the PIT value of every token under the target's processed
    law, and speculative first steps drawn many times from each of the first
    next_token_prompts prompts (next-token tests at the first position and after shared prefixes)."""
    laws = {law.name: law for law in session.laws}
    prompts = {p.id: p for p in session.prompts}
    pit_generator = torch.Generator().manual_seed(seed)
    pairs = sorted(p for p in plan.pairs if p[0] in session.drafts and p[1] in laws)
    for i, (name, law_name) in enumerate(pairs):
        progress("exactness", i, len(pairs))
        law = laws[law_name]
        rec = ExactnessRecord(name, law_name, law.greedy)
        try:
            for r in (r for r in m.requests if r.draft == name and r.law == law_name and r.output_ids):
                interrupt.check_budget()
                prompt = list(prompts[r.prompt_id].token_ids)
                ids = prompt + r.output_ids
                logits = _oracle(session).target_logits(ids, len(prompt))
                bound = _bound(session, law, prompts[r.prompt_id])  # the penalties and grammar of each position
                if law.greedy:
                    rec.compared += 1
                    rec.divergences += greedy_divergences(law_logits(logits, bound, ids, len(prompt)), r.output_ids, r.prompt_id)
                else:
                    u = randomized_pit(law_probs(logits, bound, ids, len(prompt)).cpu(), torch.tensor(r.output_ids), pit_generator)
                    rec.pit += [None if v != v else float(v) for v in u.tolist()]
            n = plan.next_token_samples.get((name, law_name), 0)
            if n and not law.greedy:
                for prompt in session.prompts[: plan.next_token_prompts]:
                    interrupt.check_budget()
                    ids = list(prompt.token_ids)
                    fmt = prompt.response_format
                    steps = session.runner.first_steps(ids, name, law, n, request_seed(seed, prompt.id, law_name, -1, 0), fmt)
                    # the first position (a claim test) and prefixes many steps share (evidence)
                    bound = _bound(session, law, prompt)
                    for prefix, tokens in contexts(steps):
                        p = _oracle(session).target_probs(ids + list(prefix) + [0], len(ids), bound)[-1]
                        rec.next_token.append(sparse_counts(prompt.id, tokens, p.cpu(), prefix=prefix))
        except Exception as e:  # noqa: BLE001
            m.failures.append(Failure(FailureStage.EXACTNESS, name, law_name, "exactness", describe_error(e)))
            continue
        m.exactness.append(rec)
    progress("exactness", len(pairs), len(pairs))


def _bills(session: Session, m: Measurements, max_new_tokens: int, resources: Any) -> None:
    """The bill per runner from the weights actually loaded and each model's own config,
    at the policy's resources (default: the workload's longest sequence, one sequence)."""
    try:
        context = resources.context_tokens or max(len(p.token_ids) for p in session.prompts) + max_new_tokens
        drafts = [draft_kinds.loaded_bill(name, draft, session.target, lambda dtype: kv_format(resources, dtype))
                  for name, draft in session.drafts.items()]
        target_cache = cache_model(session.target.config, kv_format(resources, dtype_name(session.target)))
        bills = bills_for(resources, context, _oracle(session).vocab_size, target_cache, weight_bytes(session.target), drafts)
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
