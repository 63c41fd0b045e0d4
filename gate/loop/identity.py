"""Target identity: is the loaded target the released one, and if not, how far has its law moved?

A policy may pin the released target (`target.release`: a weights fingerprint, a saved gate
report, or the released weights themselves). gate then compares the loaded target with it
and classifies the run:

- **unchanged target**: identical weights and architecture (same fingerprint and config
  digest), or weights that differ only within `tolerance_logits` on the logit probe. The
  drafts are verified proposals on the released target, and exactness against the
  release's law is the criterion (the loaded target's law is that law, up to the
  tolerance: per-position TV at most 1 - exp(-2 x tolerance)).
- **updated target**: anything else (a jointly fine-tuned backbone, merged adapters, a
  re-quantized target, a changed architecture or tokenizer). Its exactness is judged
  against its own law (the oracle is the loaded target), and its quality against the
  release is measured: the probe's figures and, when the release's weights are given,
  the drift of its law along the workload (TV, KL, top-1 agreement per position:
  metrics target_drift_tv, target_drift_kl, target_drift_top1).

**The probe.** PROBE_PROMPTS, a fixed set of short texts (prose, code, arithmetic, a
question, German, a list), tokenized with the target's tokenizer without a chat
template; the target's logits at every position are taken in one forward per prompt.
Every in-process report stores them compactly (TargetIdentity.probe: top PROBE_TOP_K
ids and logits and the logsumexp per position), so that any saved report can be the
release of a later run. Against a saved report, the loaded target is probed on the
report's own prompts (so a changed probe set in a later gate still compares), and:
max |logit difference| is taken over the release's stored top-k tokens at every
position (the tokens that carry the mass; a lower bound of the whole-vocabulary figure),
and TV is bounded by sparse_tv. Against a release model both sides are full: exact.

**Drift** (release given by `model`): along every fallback continuation of the first
repetition (the continuations overlap is measured along; a greedy law's longest only),
both models teacher-forced on the same tokens, both laws processed by gate.core.law.law_probs
exactly as the verifier does: TV(p, r), KL(p || r) in nats (p the loaded target, r the
release: the expected log-likelihood ratio of what the updated target emits, as the
release sees it; terms with p(x) = 0 are 0; p(x) > 0 = r(x) makes it +inf, stored as
None in JSON; rounding below 0 is clamped to 0) and top-1 agreement. The release model
is loaded after the run's memory peaks are read and freed afterwards: it is a reference,
never resident at serve time, and is billed nowhere.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gate.constraints import bind
from gate.core.law import AnyLaw, Law, law_probs
from gate.measure.release import Release
from gate.records import (
    FALLBACK,
    DriftRecord,
    Failure,
    FailureStage,
    Measurements,
    ProbeSequence,
    ReleaseComparison,
    TargetIdentity,
)

UNCHANGED = "unchanged target"
UPDATED = "updated target"

# Fixed, short and varied so that many parts of the vocabulary and of the network are exercised; never change
# them lightly: a saved report's own prompts are used against it, so old reports stay comparable either way.
PROBE_PROMPTS = (
    "The quick brown fox jumps over the lazy dog. Meanwhile, the weather in the valley turned cold.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Question: what is 17 multiplied by 23? Answer: 17 x 23 = 391, because 17 x 20 = 340 and 17 x 3 = 51.",
    "Can you explain, in two sentences, why the sky looks blue during the day?",
    "Die Katze sitzt auf dem Fenster und schaut den Vögeln im Garten zu.",
    "Shopping list:\n1. eggs\n2. flour\n3. milk\n4.",
)
PROBE_TOP_K = 32  # tokens stored per probe position (ids and logits): ~11,000 numbers for SmolLM2's 168 positions

# Config fields that decide what the network computes from its weights (architecture, positions, norms,
# softcaps): two configs with the same fields give the same function of the same weights. Dtype is not among
# them (a re-quantization is a change of weights, seen by the fingerprint and the probe), nor `architectures`
# (a class name: a config read from a GGUF file has none, the same weights saved by transformers have one).
ARCH_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "hidden_activation",
    "max_position_embeddings",
    "rms_norm_eps",
    "layer_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "tie_word_embeddings",
    "sliding_window",
    "layer_types",
    "attention_bias",
    "mlp_bias",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "query_pre_attn_scalar",
    "logits_scaling",
)


def config_fields(config: Any) -> dict[str, Any]:
    """The architecture fields (ARCH_KEYS) a transformers config sets, as JSON values (a
    value JSON cannot hold is written as its repr)."""
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return json.loads(
        json.dumps({k: data[k] for k in ARCH_KEYS if data.get(k) is not None}, sort_keys=True, default=repr)
    )


def config_digest(fields: dict[str, Any]) -> str:
    """First 16 hex digits of sha256 over the fields as sorted, compact JSON."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def probe_ids(tokenizer: Any, prompts: tuple[str, ...] | list[str]) -> list[list[int]]:
    """Each probe prompt's token ids under `tokenizer` (its special tokens as `encode` adds
    them; no chat template)."""
    return [list(tokenizer.encode(text)) for text in prompts]


@torch.inference_mode()
def probe_logits(model: torch.nn.Module, ids: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """The raw logits at every position of each id list (one forward each), float32 on the
    CPU: one [len(ids[i]), V] tensor per list (row j predicts the token after ids[i][j]).
    Raises ValueError for an empty list."""
    from gate.models.cache import forward

    out = []
    for seq in ids:
        if not seq:
            raise ValueError("a probe prompt tokenized to no tokens")
        out.append(forward(model, torch.tensor([seq], device=device))[0].float().cpu())
    return out


def compact(prompt: str, ids: list[int], logits: torch.Tensor, k: int = PROBE_TOP_K) -> ProbeSequence:
    """The stored form of one probe sequence: top-k ids and logits and logsumexp per position
    (logits [T, V] float32)."""
    top = torch.topk(logits, min(k, logits.shape[-1]), dim=-1)
    lse = torch.logsumexp(logits.double(), dim=-1)
    return ProbeSequence(prompt, list(ids), top.indices.tolist(), top.values.tolist(), lse.tolist())


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation 1/2 sum_x |p(x) - q(x)| of probability vectors [..., V] -> [...], in [0, 1]
    (computed in float64)."""
    return (0.5 * (p.double() - q.double()).abs().sum(dim=-1)).clamp(0.0, 1.0)


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum_x p(x) log(p(x) / q(x)) in nats for probability vectors [..., V] ->
    [...] (float64): terms with p(x) = 0 are 0, any p(x) > 0 = q(x) makes it +inf, and
    rounding below 0 is clamped to 0 (KL >= 0, Gibbs' inequality; Cover & Thomas, Thm 2.6.3)."""
    p, q = p.double(), q.double()
    support = p > 0
    terms = torch.where(
        support, p * (torch.log(torch.where(support, p, 1.0)) - torch.log(torch.where(support, q, 1.0))), 0.0
    )
    kl = terms.sum(dim=-1).clamp_min(0.0)
    return torch.where((support & (q <= 0)).any(dim=-1), torch.full_like(kl, math.inf), kl)


def sparse_tv(seq: ProbeSequence, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds on TV(r, q) per position between a stored release law r (seq: top-k ids S with
    their logits and the logsumexp) and a full law q = softmax(logits [T, V]), raw
    (temperature 1). With A = 1/2 sum_{x in S} |r(x) - q(x)| (exact) and the masses outside
    S, r_out = 1 - r(S) and q_out = 1 - q(S): by the triangle inequality
    A + 1/2 |r_out - q_out| <= TV <= A + 1/2 (r_out + q_out), an interval of width
    min(r_out, q_out). Returns (low [T], high [T]) in float64."""
    ids = torch.tensor(seq.top_ids, dtype=torch.long)
    r = torch.exp(
        torch.tensor(seq.top_logits, dtype=torch.float64) - torch.tensor(seq.logsumexp, dtype=torch.float64)[:, None]
    )
    q_full = torch.softmax(logits.double(), dim=-1)
    q = torch.gather(q_full, 1, ids)
    inside = 0.5 * (r - q).abs().sum(dim=-1)
    r_out = (1.0 - r.sum(dim=-1)).clamp_min(0.0)
    q_out = (1.0 - q.sum(dim=-1)).clamp_min(0.0)
    return (inside + 0.5 * (r_out - q_out).abs()).clamp(0.0, 1.0), (inside + 0.5 * (r_out + q_out)).clamp(0.0, 1.0)


@dataclass
class ProbeDiff:
    """The probe of the loaded target against the release's: `positions` compared, max |logit
    difference| over them, TV per position (max and mean; from a stored top-k probe its
    guaranteed lower bound, with `tv_error` the widest interval high - low: 0 when exact), and
    `mismatches`: probe prompts whose token ids differ (a changed tokenizer: not compared)."""

    positions: int = 0
    max_abs_logit_diff: float = 0.0
    tv_max: float = 0.0
    tv_mean: float = 0.0
    tv_error: float = 0.0
    mismatches: list[str] = field(default_factory=list)


def compare_sparse(release: list[ProbeSequence], ids: list[list[int]], logits: list[torch.Tensor]) -> ProbeDiff:
    """The loaded target's probe (`ids`, full `logits` [T, V] per prompt, on the release's own
    prompts) against a stored release probe: max |logit difference| over the release's top-k
    tokens at every position, TV by sparse_tv's lower bound (what is certain; where the
    stored tokens carry little mass, e.g. a flat law, the interval is wide: tv_error says how)."""
    diff, tvs = ProbeDiff(), []
    for seq, mine, lg in zip(release, ids, logits, strict=False):
        if list(mine) != list(seq.token_ids):
            diff.mismatches.append(f"probe prompt {seq.prompt[:30]!r}: token ids differ (a changed tokenizer)")
            continue
        top = torch.gather(lg.double(), 1, torch.tensor(seq.top_ids, dtype=torch.long))
        delta = (top - torch.tensor(seq.top_logits, dtype=torch.float64)).abs()
        diff.max_abs_logit_diff = max(diff.max_abs_logit_diff, float(delta.max()))
        low, high = sparse_tv(seq, lg)
        tvs.append((low, high - low))
        diff.positions += lg.shape[0]
    if tvs:
        mid = torch.cat([t for t, _ in tvs])
        diff.tv_max, diff.tv_mean = float(mid.max()), float(mid.mean())
        diff.tv_error = float(torch.cat([e for _, e in tvs]).max())
    return diff


def compare_full(release: list[torch.Tensor], logits: list[torch.Tensor]) -> ProbeDiff:
    """Both probes full (a release model, same prompts and token ids): exact max |logit
    difference| over the whole vocabulary and exact TV of the raw laws per position."""
    diff, tvs = ProbeDiff(), []
    for r, lg in zip(release, logits, strict=False):
        if r.shape != lg.shape:
            diff.mismatches.append(
                f"probe logits of shape {tuple(lg.shape)} against the release's {tuple(r.shape)} (a changed vocabulary)"
            )
            continue
        diff.max_abs_logit_diff = max(diff.max_abs_logit_diff, float((r.double() - lg.double()).abs().max()))
        tvs.append(tv_distance(torch.softmax(r.double(), -1), torch.softmax(lg.double(), -1)))
        diff.positions += lg.shape[0]
    if tvs:
        tv = torch.cat(tvs)
        diff.tv_max, diff.tv_mean = float(tv.max()), float(tv.mean())
    return diff


def classify(
    identity: TargetIdentity,
    release: Release,
    probe: ProbeDiff | None,
    fingerprint: str | None,
    config: dict[str, Any] | None,
    modifying: list[str] | None = None,
) -> ReleaseComparison:
    """The run's classification against the release (see the module docstring): the release's
    `fingerprint` and `config` fields (None: not known), the probe comparison (None: none
    possible) and the drafts whose kind ships a changed target (`modifying`)."""
    differences: list[str] = []
    same_weights = fingerprint is not None and fingerprint == identity.fingerprint
    if fingerprint is not None and not same_weights:
        differences.append(f"weights fingerprint {identity.fingerprint} (release {fingerprint})")
    if config is not None:
        changed = sorted(k for k in set(config) | set(identity.config) if config.get(k) != identity.config.get(k))
        differences += [f"config {k}: {identity.config.get(k)!r} (release {config.get(k)!r})" for k in changed]
    else:
        changed = []
    if probe is not None:
        differences += probe.mismatches
    tol = release.tolerance_logits
    figures = ""
    if probe is not None and probe.positions:
        over = "the release's stored top-k tokens" if release.probe is not None else "the whole vocabulary"
        figures = (
            f"probe max |logit difference| {probe.max_abs_logit_diff:.3g} over {probe.positions} positions and {over}, "
            + (
                f"TV of the raw law at least max {probe.tv_max:.3g}, mean {probe.tv_mean:.3g} (lower bounds from the "
                f"stored top-k; up to {probe.tv_error:.2g} more at a position)"
                if release.probe is not None
                else f"TV of the raw law max {probe.tv_max:.3g}, mean {probe.tv_mean:.3g}"
            )
        )
    within = probe is not None and probe.positions > 0 and not probe.mismatches and probe.max_abs_logit_diff <= tol
    if same_weights and not changed and not (probe and probe.mismatches):
        classification, reason = UNCHANGED, f"identical weights (fingerprint {identity.fingerprint}) and architecture"
    elif changed or (probe is not None and probe.mismatches):
        classification = UPDATED
        reason = "the architecture or tokenizer differs from the release's (listed below)"
    elif within:
        classification, reason = UNCHANGED, f"weights differ, within numerical tolerance: {figures} <= {tol:g}"
    elif probe is None or not probe.positions:
        classification = UPDATED
        reason = "the weights differ from the release's and no probe could tell whether within numerical tolerance"
    else:
        classification = UPDATED
        reason = f"{figures}, beyond the tolerance {tol:g}"
    if (
        figures and figures not in reason and not (same_weights and not changed)
    ):  # identical weights: the probe adds nothing
        reason += f"; {figures}"
    reason += (
        "; the drafts are verified proposals: exactness against the release's law is the criterion"
        if classification == UNCHANGED
        else "; its exactness is judged against its own law, its quality against the release"
    )
    if modifying:
        differences.append(f"drafts shipping a changed target: {', '.join(modifying)}")
        reason += f"; drafts {', '.join(modifying)} ship a changed target: an updated target for them"
    return ReleaseComparison(
        release=release.given,
        fingerprint=fingerprint,
        config_digest=config_digest(config) if config is not None else None,
        classification=classification,
        reason=reason,
        differences=differences,
        tolerance_logits=tol,
        probe_positions=probe.positions if probe else 0,
        probe_max_abs_logit_diff=probe.max_abs_logit_diff if probe and probe.positions else None,
        probe_tv_max=probe.tv_max if probe and probe.positions else None,
        probe_tv_mean=probe.tv_mean if probe and probe.positions else None,
        probe_tv_error=probe.tv_error if probe and probe.positions else None,
        modifying_drafts=list(modifying or []),
    )


def drift_along(
    logits: torch.Tensor,
    release_logits: torch.Tensor,
    law: AnyLaw,
    ids: list[int] | None = None,
    start: int | None = None,
) -> tuple[list[float], list[float | None], list[bool]]:
    """Per position, the loaded target's law p against the release's r, both from teacher-forced
    logits [T, V] at positions start.. of `ids`, processed by `law` with each position's history
    (gate.core.law.law_probs): TV(p, r), KL(p || r) (None where infinite) and whether the raw
    argmaxes agree."""
    p, r = law_probs(logits, law, ids, start), law_probs(release_logits, law, ids, start)
    tv = tv_distance(p, r).tolist()
    kl = [None if math.isinf(v) else v for v in kl_divergence(p, r).tolist()]
    top1 = (logits.argmax(dim=-1) == release_logits.argmax(dim=-1)).tolist()
    return tv, kl, top1


def _continuations(m: Measurements, laws: dict[str, Law]) -> list[Any]:
    """The fallback continuations overlap is measured along: repetition 0, and for a greedy
    law only the longest of each prompt (the others are its prefixes)."""
    runs = [r for r in m.requests if r.draft == FALLBACK and r.repetition == 0 and r.output_ids and r.law in laws]
    out, seen = [], set()
    for rec in runs:
        if laws[rec.law].greedy:
            key = (rec.prompt_id, rec.law)
            if key in seen:
                continue
            seen.add(key)
            rec = max((r for r in runs if (r.prompt_id, r.law) == key), key=lambda r: len(r.output_ids))
        out.append(rec)
    return out


def _describe(e: BaseException) -> str:
    from gate.core.errors import describe_error

    return describe_error(e)


def measure_identity(session: Any, m: Measurements, progress: Callable[[str, int, int], None] | None = None) -> None:
    """The loaded target's identity (fingerprint, config, probe) into m.target_identity, and with
    a pinned release (session.release, a Release) its classification and, for a release
    model, the drift along the workload into m.drift. Nothing is lost: with a release, a
    probe, release model or drift that fails is a Failure (stage "target identity" or
    "target drift"); without one a failed probe is only noted in probe_error (no rule
    depends on it)."""
    from gate.exactness.oracle import TargetOracle
    from gate.models import loading as models

    progress = progress or (lambda *_: None)
    release: Release | None = getattr(session, "release", None)
    model, device = session.target, session.device
    info = next((x for x in session.models if x.role == "target"), None)
    fields = config_fields(model.config)
    ident = TargetIdentity(
        info.fingerprint if info else models.fingerprint(model),
        info.dtype if info else models.dtype_name(model),
        fields,
        config_digest(fields),
        PROBE_TOP_K,
    )
    m.target_identity = ident
    prompts = [s.prompt for s in release.probe] if release is not None and release.probe else list(PROBE_PROMPTS)
    ids: list[list[int]] | None = None
    logits: list[torch.Tensor] | None = None
    progress("target identity", 0, 3)
    try:
        ids = probe_ids(session.tokenizer, prompts)
        logits = probe_logits(model, ids, device)
        ident.probe = [compact(t, i, lg) for t, i, lg in zip(prompts, ids, logits, strict=False)]
    except Exception as e:  # noqa: BLE001
        ident.probe_error = _describe(e)
        ids = logits = None
        if release is not None:
            m.failures.append(
                Failure(
                    FailureStage.IDENTITY, "*", "*", "target identity: probe of the loaded target", ident.probe_error
                )
            )
    if release is None:
        return
    modifying = sorted(name for name, d in m.drafts.items() if d.modifies_target)
    if release.source is None:  # a fingerprint or a saved report
        probe = compare_sparse(release.probe, ids, logits) if release.probe and logits is not None else None
        ident.release = classify(ident, release, probe, release.fingerprint, release.config, modifying)
        return
    progress("target identity", 1, 3)
    try:
        ref = models.load_model(release.source, release.dtype, device)
    except Exception as e:  # noqa: BLE001
        why = _describe(e)
        m.failures.append(Failure(FailureStage.IDENTITY, "*", "*", "target identity: loading the release model", why))
        m.failures.append(
            Failure(FailureStage.DRIFT, "*", "*", "target drift: the release model could not be loaded", why)
        )
        return
    try:
        probe = None
        if logits is not None:
            try:
                probe = compare_full(probe_logits(ref, ids, device), logits)
            except Exception as e:  # noqa: BLE001
                m.failures.append(
                    Failure(FailureStage.IDENTITY, "*", "*", "target identity: probe of the release", _describe(e))
                )
        ident.release = classify(ident, release, probe, models.fingerprint(ref), config_fields(ref.config), modifying)
        progress("target identity", 2, 3)
        _drift(session, m, TargetOracle(ref, device))
    finally:
        del ref
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    progress("target identity", 3, 3)


@torch.inference_mode()
def _drift(session: Any, m: Measurements, release: Any) -> None:
    """Drift records along every continuation (see the module docstring); a continuation that
    fails is a Failure (stage "target drift") and the others go on."""
    laws = {law.name: law for law in session.laws}
    prompts = {p.id: p for p in session.prompts}
    for rec in _continuations(m, laws):
        prompt = list(prompts[rec.prompt_id].token_ids)
        ids = prompt + rec.output_ids
        try:
            planned = prompts[rec.prompt_id]
            law = bind(laws[rec.law], len(prompt), planned.response_format, getattr(session, "grammars", None))
            tv, kl, top1 = drift_along(
                session.oracle.target_logits(ids, len(prompt)).float().cpu(),
                release.target_logits(ids, len(prompt)).float().cpu(),
                law,
                ids,
                len(prompt),
            )
        except Exception as e:  # noqa: BLE001
            m.failures.append(Failure(FailureStage.DRIFT, "*", rec.law, f"target drift {rec.prompt_id}", _describe(e)))
            continue
        m.drift.append(
            DriftRecord(
                rec.law, rec.prompt_id, rec.category, tv, kl, top1, rec.context_length, constraint=rec.constraint
            )
        )
