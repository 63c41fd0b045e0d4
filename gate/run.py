"""Run the plan: timed requests (fallback and drafts interleaved) through the session's
runner under sequential load, overlap and exactness along the outputs with the target
oracle, and the bill. Each run of the plan's requests is also recorded as measured
windows (gate.records.RunRecord, one per runner and law). Nothing measured is lost: a
request that fails is recorded as a Failure and the run goes on; an interrupt stops the
run with what it has.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from gate import interrupt
from gate.drafts import registry as draft_kinds
from gate.errors import describe_error
from gate.measure.bill import bills_for, kv_format
from gate.measure.kv import cache_model
from gate.load.sequential import SEQUENTIAL
from gate.measure.contention import Handling, is_contended, pooled_stall_share
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
    try:
        for _ in range(warmup):
            _warmup(session, m)
        _run_requests(session, m, requests, progress, contention)
        _phase(m, FailureStage.OVERLAP, lambda: _overlaps(session, m, progress))
        if exactness and exactness.pairs:
            _phase(m, FailureStage.EXACTNESS, lambda: _exactness(session, m, exactness, seed, progress))
    except KeyboardInterrupt:
        m.failures.append(Failure(FailureStage.RUN, "*", "*", "run", "interrupted: the run stopped before every measurement was made"))
    with interrupt.deferred():  # bookkeeping on what was measured: a signal now is only recorded
        record_load(m.environment, m.requests)
        _bills(session, m, max(max_new_tokens), resources)
        m.process_peak_rss_bytes = process_peak_rss_bytes()
        if session.device.type == "cuda":
            m.cuda_max_memory_allocated_bytes = int(torch.cuda.max_memory_allocated(session.device))
            m.cuda_max_memory_reserved_bytes = int(torch.cuda.max_memory_reserved(session.device))
    # After the peaks are read: the release model (a reference, never resident at serve time) moves none of them.
    try:
        _phase(m, FailureStage.IDENTITY, lambda: measure_identity(session, m, progress))
    except KeyboardInterrupt:
        m.failures.append(Failure(FailureStage.RUN, "*", "*", "run", "interrupted while comparing the target with its release"))
    return m


def measure_more(session: Session, m: Measurements, drafts: list[str], laws: list[str], max_new_tokens: list[int],
                 repetitions: range, seed: int, interleave: bool = True, progress: Progress | None = None,
                 contention: Handling | None = None) -> None:
    """Further repetitions of the cells of `drafts` (and their fallback) under `laws`,
    appended to `m.requests`: what measurement.extra_repetitions runs when a verdict is
    inconclusive. Overlap and exactness are not remeasured (they do not depend on timing)."""
    chosen = [law for law in session.laws if law.name in laws]
    requests = plan_requests([d for d in session.drafts if d in drafts], chosen, session.prompts, max_new_tokens, repetitions,
                             seed, interleave)
    try:
        _run_requests(session, m, requests, progress or (lambda *_: None), contention)
    except KeyboardInterrupt:
        m.failures.append(Failure(FailureStage.RUN, "*", "*", "run", "interrupted during extra repetitions"))
    with interrupt.deferred():
        record_load(m.environment, m.requests)


# Once this many more cells stayed contended through all their reruns than came out clean,
# the machine is busy for good: further cells are not rerun until clean cells bring the
# count back down (reruns would only multiply the run time; the verdicts say the machine
# was contended).
STUCK_CELLS = 3


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
    done, stuck = 0, 0
    for cell in _cells(requests):
        progress("requests", done, len(requests))
        records: list[RequestRecord] = []
        failures: list[Failure] = []
        reruns = 0
        try:  # an interrupt keeps what the cell measured so far (its last whole attempt)
            _run_cell(session, cell, starts, records, failures)
            if h.max_cpu_stall is not None and stuck < STUCK_CELLS:
                while not failures and reruns < h.reruns and _contended(records, h):
                    reruns += 1
                    again: list[RequestRecord] = []
                    failed: list[Failure] = []
                    _run_cell(session, cell, starts, again, failed)
                    if failed:  # not contention: keep what was measured, say what failed
                        failures += failed
                        break
                    if (_contended(again, h), _stalled(again, h)) <= (_contended(records, h), _stalled(records, h)):
                        records[:] = again
        finally:
            for r in records:
                r.contention_reruns = reruns
            m.requests += records
            kept += records
            m.failures += failures
        if not _contended(records, h):
            stuck = max(0, stuck - 1)
        elif reruns:  # still contended after every rerun
            stuck += 1
        done += len(cell)
    progress("requests", len(requests), len(requests))


def _run_cell(session: Session, cell: list[Request], starts: dict[int, float], records: list[RequestRecord],
              failures: list[Failure]) -> None:
    """One attempt at a cell: its requests through the runner, one at a time. A request's
    record (or Failure, stage "request") is kept as it ends, so an interrupt keeps them."""

    def done(i: int, result: RequestResult) -> None:
        req = cell[i]
        if isinstance(result, BaseException):  # recorded, the run goes on
            failures.append(Failure(FailureStage.REQUEST, req.draft, req.law.name, f"request {req.prompt.id}", describe_error(result)))
            return
        record = _record(session, req, result)
        starts[id(record)] = result.started_s
        records.append(record)

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


def _phase(m: Measurements, stage: FailureStage, run: Callable[[], None]) -> None:
    """Run one measurement phase; an error that escapes it is recorded, never loses the rest."""
    try:
        run()
    except Exception as e:  # noqa: BLE001
        m.failures.append(Failure(stage, "*", "*", stage.value, describe_error(e)))


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
