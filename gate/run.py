"""Run the plan: timed requests (fallback and drafts interleaved), overlap along the
fallback's continuations, and the bill. Nothing measured is lost: a request that fails is
recorded as a Failure and the run goes on; an interrupt stops the run with what it has.
"""

from __future__ import annotations

import traceback
from typing import Callable

import torch

from gate.measure.bill import KVGeometry, build_bill, kv_geometry
from gate.measure.environment import environment, process_peak_rss_bytes
from gate.measure.overlap import position_overlaps
from gate.models.load import weight_bytes
from gate.plan import Request, plan_requests
from gate.records import FALLBACK, Failure, Measurements, OverlapRecord, RequestRecord
from gate.session import Session

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def _geometry(model: torch.nn.Module) -> KVGeometry:
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return kv_geometry(model.config, torch.empty(0, dtype=dtype).element_size())


def measure(session: Session, max_new_tokens: list[int], repetitions: int, seed: int, warmup: bool = True,
            progress: Progress | None = None) -> Measurements:
    """Every measurement the policy needs, as raw records (see gate.records)."""
    progress = progress or (lambda *_: None)
    env = environment(session.device, seed)
    env.models = session.models
    m = Measurements(environment=env, laws=[law.name for law in session.laws])
    m.drafts = {name: {"kind": d.kind, "num_draft_tokens": d.num_draft_tokens, "probability_info": d.probability_info}
                for name, d in session.drafts.items()}
    requests = plan_requests(list(session.drafts), session.laws, session.prompts, max_new_tokens, repetitions, seed)
    if session.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(session.device)
    try:
        if warmup:
            _warmup(session, m)
        for i, req in enumerate(requests):
            progress("requests", i, len(requests))
            try:
                m.requests.append(_run_one(session, req))
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                m.failures.append(Failure("request", req.draft, req.law.name, f"request {req.prompt.id}", _describe(e)))
        progress("requests", len(requests), len(requests))
        _overlaps(session, m, progress)
    except KeyboardInterrupt:
        m.failures.append(Failure("run", "*", "*", "run", "interrupted: the run stopped before every measurement was made"))
    _bills(session, m, max(max_new_tokens))
    m.process_peak_rss_bytes = process_peak_rss_bytes()
    if session.device.type == "cuda":
        m.cuda_max_memory_allocated_bytes = int(torch.cuda.max_memory_allocated(session.device))
    return m


def _describe(e: BaseException) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})" if frame else ""
    return f"{type(e).__name__}: {e}{where}"


def _generator(session: Session, seed: int) -> torch.Generator:
    return torch.Generator(device=session.device).manual_seed(seed)


def _warmup(session: Session, m: Measurements) -> None:
    """One short untimed request per runner: first calls allocate and pick kernels.
    A runner that fails here is recorded; its timed requests will say for themselves."""
    prompt = list(session.prompts[0].token_ids)
    for name, draft in [(FALLBACK, None), *session.drafts.items()]:
        try:
            session.engine.generate(prompt, draft, session.laws[0], 4, _generator(session, 0))
        except Exception as e:  # noqa: BLE001
            m.failures.append(Failure("request", name, "*", "warm-up", _describe(e)))


def _run_one(session: Session, req: Request) -> RequestRecord:
    draft = None if req.draft == FALLBACK else session.drafts[req.draft]
    g = session.engine.generate(list(req.prompt.token_ids), draft, req.law, req.max_new_tokens, _generator(session, req.seed))
    return RequestRecord(
        draft=req.draft, law=req.law.name, prompt_id=req.prompt.id, category=req.prompt.category,
        max_new_tokens=req.max_new_tokens, repetition=req.repetition, prompt_tokens=len(req.prompt.token_ids),
        output_ids=g.output_ids, token_times_ms=g.token_times_ms, step_committed=g.step_committed,
        step_proposed=g.step_proposed, step_accepted=g.step_accepted, stop_reason=g.stop_reason, e2el_ms=g.e2el_ms,
        num_draft_tokens=draft.num_draft_tokens if draft else 0, kv_cache_tokens=g.kv_cache_tokens,
        kv_cache_bytes=g.kv_cache_bytes, draft_kv_cache_bytes=g.draft_kv_cache_bytes,
    )


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
        key = (rec.prompt_id, rec.law)
        if key in done:  # the longest max_new_tokens covers the shorter ones' prefixes
            continue
        rec = max((r for r in runs if (r.prompt_id, r.law) == key), key=lambda r: len(r.output_ids))
        done.add(key)
        law = laws[rec.law]
        prompt = list(prompts[rec.prompt_id].token_ids)
        ids = prompt + rec.output_ids
        try:
            p = session.engine.target_probs(ids, len(prompt), law)
        except Exception as e:  # noqa: BLE001
            m.failures.append(Failure("overlap", "*", rec.law, f"overlap {rec.prompt_id}: target forward", _describe(e)))
            continue
        for name, draft in session.drafts.items():
            try:
                q = draft.teacher_forced(ids, len(prompt), law, p.shape[-1])
            except Exception as e:  # noqa: BLE001
                m.failures.append(Failure("overlap", name, rec.law, f"overlap {rec.prompt_id}", _describe(e)))
                continue
            ov, top1 = position_overlaps(p, q.to(p.device))
            m.overlaps.append(OverlapRecord(name, rec.law, rec.prompt_id, rec.category, draft.probability_info, ov, top1))
    progress("overlap", len(runs), len(runs))


def _bills(session: Session, m: Measurements, max_new_tokens: int) -> None:
    """The first bill per runner at the workload's longest sequence, one sequence."""
    try:
        target_geometry = _geometry(session.target)
        target_bytes = weight_bytes(session.target)
        longest = max(len(p.token_ids) for p in session.prompts) + max_new_tokens
        vocab = session.engine.vocab_size
        m.bills.append(build_bill(FALLBACK, target_geometry, target_bytes, vocab, longest, 0, None, 0, False))
        for name, draft in session.drafts.items():
            modules = draft.modules()
            geometry = _geometry(modules[0]) if modules else None
            own = weight_bytes(*modules, exclude=[session.target]) if modules else 0
            m.bills.append(build_bill(name, target_geometry, target_bytes, vocab, longest, draft.num_draft_tokens,
                                      geometry, own, draft.probability_info == "distribution"))
    except Exception as e:  # noqa: BLE001
        m.failures.append(Failure("bill", "*", "*", "bill", _describe(e)))
