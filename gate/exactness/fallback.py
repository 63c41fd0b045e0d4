"""Greedy exactness of runners whose numerics are not the local target's (served engines).

A served engine runs its own numerics (another build, kernels, batch shapes), so its
greedy outputs are not checked against gate's target token by token: each draft runner's
output is compared with the fallback runner's on the same prompt, length, repetition and
load point, and a divergence is weighed by the local target's logit gap where the target
is loaded here (gate.loop.session; the fallback runner's own largest gap is the control for the
server's numerics). The teacher-forced pass is batched (teacher_forced).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gate.core.errors import describe_error
from gate.core.law import law_logits
from gate.core.requests import PlannedPrompt
from gate.loop import interrupt
from gate.plan.matrix import Plan
from gate.records import (
    FALLBACK,
    UNKNOWN_ID,
    Divergence,
    ExactnessRecord,
    Failure,
    FailureStage,
    Measurements,
    RequestRecord,
)

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def greedy_exactness(session: Any, m: Measurements, exactness: Any, progress: Progress | None = None) -> None:
    """Greedy exactness of the served drafts of `session` (a gate.loop.session.Session of a served
    runner) for the pairs of `exactness` (a gate.plan.matrix.ExactnessPlan): _greedy_exactness on the
    session's plan, with its local target's oracle where one was loaded."""
    _greedy_exactness(session.plan, m, session.oracle, progress, exactness)


def _greedy_exactness(
    plan: Plan, m: Measurements, oracle: Any, progress: Progress | None = None, exactness: Any = None
) -> None:
    """Greedy exactness of served drafts: each draft runner's output equals the fallback
    runner's on the same prompt, length, repetition and load point, token for token. The
    first divergence of a request is recorded (later tokens follow other contexts), with how
    far the draft runner's token lies below the local target's top logit there when `oracle`
    is given, else an infinite gap (every divergence is a fault). The fallback runner is the
    control for the server's numerics: the largest such gap of its own tokens is recorded
    (ExactnessRecord.numerical_tolerance); the rules call a divergence within it undecidable.
    Gaps are taken under the law as greedy decoding sees it: logit bias, penalties with each
    position's own history, and the grammar of the prompt's constraint (_gaps).

    The local target's teacher-forced pass (_gaps, batched) runs only for a law with at
    least one request pair compared token for token: with no draft output that has token
    ids (every draft request failed, or the api returns counts only) it does not run at all.
    `progress("exactness", done, total)` counts the fallback outputs teacher-forced. Raises
    KeyboardInterrupt or interrupt.OutOfTime (the budget ran out between batches) as they come."""
    from gate.rules.samples import request_key

    progress = progress or (lambda *_: None)
    pairs = (exactness or plan.exactness).pairs
    prompts = {p.id: p for p in plan.workload.prompts}
    laws = {law.name: law for law in plan.laws}
    greedy = {law.name for law in plan.laws if law.greedy}
    compared: list[tuple[str, list[str], dict[Any, Any], dict[Any, Any], dict[Any, Any], dict[Any, Any]]] = []
    for law in sorted({law for _, law in pairs} & greedy):
        drafts = sorted(d for d, x in pairs if x == law)
        fallback = {request_key(r): r for r in m.requests if r.draft == FALLBACK and r.law == law}
        recs = {d: ExactnessRecord(d, law, greedy=True) for d in drafts}
        # fallback cell -> (record, position, draft token), and later the gap below the top
        found: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        no_ids = dict.fromkeys(drafts, 0)
        for r in (x for x in m.requests if x.draft in recs and x.law == law):
            f = fallback.get(request_key(r))
            if f is None:
                continue
            if UNKNOWN_ID in f.output_ids or UNKNOWN_ID in r.output_ids:
                no_ids[r.draft] += 1  # counts only came back: nothing to compare token for token
                continue
            recs[r.draft].compared += 1
            pos = next((i for i, (a, b) in enumerate(zip(f.output_ids, r.output_ids, strict=False)) if a != b), None)
            if pos is not None:
                found.setdefault(request_key(f), []).append((recs[r.draft], pos, r.output_ids[pos]))
        compared.append((law, drafts, fallback, recs, found, no_ids))
    passes = [
        law for law, _, _, recs, _, _ in compared if oracle is not None and any(r.compared for r in recs.values())
    ]
    total = sum(len(_teacher_forceable(fallback)) for law, _, fallback, _, _, _ in compared if law in passes)
    done = [0]

    def step(n: int) -> None:
        done[0] += n
        progress("exactness", done[0], total)

    if passes:
        progress("exactness", 0, total)
    for law, drafts, fallback, recs, found, no_ids in compared:
        outside = 0
        try:
            if law in passes:
                control, outside = _gaps(oracle, prompts, fallback, found, laws[law], step)
            elif oracle is not None:  # nothing compared token for token: the local target's pass is not needed
                control = None
            else:  # no local target: every divergence is a fault
                control, found = None, {k: [(*hit, float("inf")) for hit in hits] for k, hits in found.items()}
        except Exception as e:  # noqa: BLE001
            m.failures += [
                Failure(FailureStage.EXACTNESS, d, law, "greedy exactness", describe_error(e)) for d in drafts
            ]
            continue
        for d, rec in recs.items():
            rec.numerical_tolerance = control
            for key, hits in found.items():
                f = fallback[key]
                rec.divergences += [
                    Divergence(
                        f.prompt_id, pos, f.output_ids[pos], token, gap, f.repetition, f.concurrency, f.request_rate
                    )
                    for owner, pos, token, gap in hits
                    if owner is rec
                ]
            notes = []
            if no_ids[d]:
                notes.append(
                    f"{no_ids[d]} request pair(s) came back without token ids (this api returns counts only: use "
                    "api llama_cpp, or a server that returns token ids)"
                )
            if outside:
                notes.append(
                    f"{outside} token(s) of the fallback runner lie outside gate's grammar for their prompt's "
                    "constraint, left out of the control: the server's grammar or its end tokens differ from "
                    "gate's (llama.cpp ends a grammar at any end-of-generation token, gate at the target's EOS)"
                )
            rec.note = "; ".join(notes) or None
            m.exactness.append(rec)


def _teacher_forceable(
    fallback: dict[tuple[Any, ...], RequestRecord],
) -> list[tuple[tuple[Any, ...], RequestRecord]]:
    """The fallback outputs the local target can be teacher-forced along (token ids, non-empty)."""
    return [(key, f) for key, f in fallback.items() if f.output_ids and UNKNOWN_ID not in f.output_ids]


def _gaps(
    oracle: Any,
    prompts: dict[str, PlannedPrompt],
    fallback: dict[tuple[Any, ...], RequestRecord],
    found: dict[tuple[Any, ...], list[tuple[Any, ...]]],
    law: Any = None,
    step: Callable[[int], None] | None = None,
) -> tuple[float | None, int]:
    """One teacher-forced pass of the local target along each fallback output (batched:
    teacher_forced; `step(n)` after each batch of n outputs) gives both
    the control (the largest gap below the local top logit of any token the fallback runner
    emitted; None without token ids) and, in place, the gap of each divergence found at that
    cell (its context is the fallback's prefix): `found` entries become (record, position,
    token, gap). Divergences without a local target keep an infinite gap.

    Logits are the law's (gate.core.law.law_logits: logit bias, penalties with the request's own history,
    the grammar of the prompt's constraint) when `law` (a gate.core.law.Law) has any of them, else
    raw. Returns (control, outside): outside counts the fallback's tokens gate's grammar
    forbids (a server grammar that differs from gate's): left out of the control; a
    divergence to a token gate's grammar forbids has an infinite gap."""
    worst: float | None = None
    outside = 0
    processed = law is not None and bool(law.logit_bias or law.needs_history)
    items = _teacher_forceable(fallback)
    seqs = [
        (list(prompts[f.prompt_id].token_ids) + list(f.output_ids), len(prompts[f.prompt_id].token_ids))
        for _, f in items
    ]
    for j, logits in teacher_forced(oracle, seqs, step):  # [T, V]: row i given the fallback's prefix
        key, f = items[j]
        prompt = prompts[f.prompt_id]
        ids = list(prompt.token_ids)
        full = seqs[j][0]
        fmt = prompt.response_format
        if law is not None and (processed or fmt is not None):
            logits = law_logits(logits, oracle.bind(law, len(ids), fmt), full, len(ids))
        top = logits.max(dim=-1).values
        chosen = logits.gather(-1, torch.tensor(f.output_ids)[:, None]).squeeze(-1)
        allowed = torch.isfinite(chosen)
        outside += int((~allowed).sum())
        if bool(allowed.any()):
            gap = float((top - chosen)[allowed].max())
            worst = gap if worst is None else max(worst, gap)
        found[key] = [(rec, pos, token, _gap(top[pos], logits[pos, token])) for rec, pos, token in found.get(key, [])]
    return worst, outside


BATCH_ROWS = 8  # fallback outputs per teacher-forced forward of the local target
BATCH_LOGITS = 2**26  # logits kept per forward (rows x positions x vocabulary): 256 MiB in float32


def teacher_forced(oracle: Any, seqs: list[tuple[list[int], int]], step: Callable[[int], None] | None = None) -> Any:
    """Yield (i, logits) for each (ids, start) of `seqs`: the raw teacher-forced logits of
    `oracle` (a gate.exactness.oracle.TargetOracle) at positions start..len(ids)-1, float32
    [len(ids) - start, V], as TargetOracle.target_logits gives them (row k: the logits of
    ids[start + k] given ids[:start + k]), in an order of its own. Sequences of similar
    lengths go through the model together, right-padded with an attention mask (at most
    BATCH_ROWS rows and BATCH_LOGITS logits per forward; the logits of prompt positions are
    not computed where the model takes logits_to_keep); an oracle without a `model` (a
    torch module) is called one sequence at a time. Before each forward raises
    interrupt.OutOfTime once the budget ran out; `step(n)` after each forward of n
    sequences. Raises ValueError for a start below 1."""
    step = step or (lambda n: None)
    if any(start < 1 for _, start in seqs):
        raise ValueError("teacher forcing needs at least one token of prefix (start >= 1)")
    model = getattr(oracle, "model", None)
    if not isinstance(model, torch.nn.Module):
        for i, (ids, start) in enumerate(seqs):
            interrupt.check_budget()
            logits = oracle.target_logits(ids, start).float()
            step(1)
            yield i, logits
        return
    vocab = int(oracle.vocab_size)
    order = sorted(range(len(seqs)), key=lambda i: (seqs[i][1], len(seqs[i][0])))
    batch: list[int] = []
    for i in order:
        grown = [*batch, i]
        width = max(len(seqs[j][0]) - 1 for j in grown) - min(seqs[j][1] - 1 for j in grown)
        if batch and (len(grown) > BATCH_ROWS or len(grown) * width * vocab > BATCH_LOGITS):
            yield from _forward_batch(oracle, model, seqs, batch, step)
            batch = [i]
        else:
            batch = grown
    if batch:
        yield from _forward_batch(oracle, model, seqs, batch, step)


@torch.inference_mode()
def _forward_batch(
    oracle: Any,
    model: torch.nn.Module,
    seqs: list[tuple[list[int], int]],
    batch: list[int],
    step: Callable[[int], None],
) -> list[tuple[int, torch.Tensor]]:
    """One right-padded forward over the sequences `batch` indexes (see teacher_forced)."""
    interrupt.check_budget()
    inputs = [seqs[j][0][:-1] for j in batch]
    width = max(len(x) for x in inputs)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, x in enumerate(inputs):
        ids[r, : len(x)] = torch.tensor(x, dtype=torch.long)
        mask[r, : len(x)] = 1
    first = min(seqs[j][1] - 1 for j in batch)  # the first position whose logits any row needs
    args = dict(input_ids=ids.to(oracle.device), attention_mask=mask.to(oracle.device), use_cache=False)
    try:
        logits = model(**args, logits_to_keep=width - first).logits
    except TypeError:  # a model without logits_to_keep: every position
        logits = model(**args).logits
    offset = width - logits.shape[1]  # the position of logits[:, 0]
    out = [(j, logits[r, seqs[j][1] - 1 - offset : len(inputs[r]) - offset].float()) for r, j in enumerate(batch)]
    step(len(batch))
    return out


def _gap(top: torch.Tensor, value: torch.Tensor) -> float:
    """top - value, infinite when the token is forbidden (value -inf) or the row is empty."""
    gap = float(top - value)
    return gap if gap == gap else float("inf")  # nan: -inf - -inf, a row the grammar left empty


__all__ = ["greedy_exactness", "teacher_forced"]
