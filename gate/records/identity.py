"""The target's identity: probe sequences, the comparison with a release, drift, tokenizers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProbeSequence:
    """The target's logits on one fixed probe prompt (gate.loop.identity.PROBE_PROMPTS),
    stored compactly: at every position i of `token_ids` (the logits predicting token i + 1,
    the last one included), the `top_ids[i]` most likely token ids, their raw logits
    `top_logits[i]` (float32, descending) and `logsumexp[i]` over the whole vocabulary, so
    the probability of a stored token is exp(logit - logsumexp) and the mass outside them is
    1 - the stored probabilities' sum (gate.loop.identity.sparse_tv bounds TV with it)."""

    prompt: str
    token_ids: list[int]
    top_ids: list[list[int]]
    top_logits: list[list[float]]
    logsumexp: list[float]


@dataclass
class ReleaseComparison:
    """The loaded target against the pinned release (policy `target.release`).

    classification: "unchanged target" (identical weights and config, or a probe within
    `tolerance_logits`: the drafts are verified proposals and exactness against the
    release's law is the criterion) or "updated target" (its exactness is judged against
    its own law, its quality against the release by drift). `reason`: one sentence with the
    figures; `differences`: what differs (fingerprint, config fields, probe tokens, probe
    logits). Probe figures (None: not compared, e.g. a release given by fingerprint only):
    `probe_max_abs_logit_diff` max |logit_loaded - logit_release| over the positions compared
    and over the release's stored top tokens (a report) or the whole vocabulary (a release
    model); `probe_tv_max`/`probe_tv_mean` TV of the raw law (temperature 1) per position,
    exact for a release model; from a report their guaranteed lower bounds, with
    `probe_tv_error` the widest interval high - low (gate.loop.identity.sparse_tv)."""

    release: str  # how the release was given: "fingerprint", "report <path>" or "model <source>"
    fingerprint: str | None  # the release's weights fingerprint (gate.models.loading.fingerprint)
    config_digest: str | None  # the release's architecture digest (None: not known, fingerprint only)
    classification: str
    reason: str
    differences: list[str] = field(default_factory=list)
    tolerance_logits: float = 0.0
    probe_positions: int = 0
    probe_max_abs_logit_diff: float | None = None
    probe_tv_max: float | None = None
    probe_tv_mean: float | None = None
    probe_tv_error: float | None = None  # widest TV interval from a stored probe; 0 when exact (release model)
    modifying_drafts: list[str] = field(default_factory=list)  # drafts whose kind ships a changed target

    @property
    def updated(self) -> bool:
        return self.classification == "updated target"


@dataclass
class TargetIdentity:
    """The loaded target's identity, written in every in-process report so that a saved
    report can pin a release later: `fingerprint` (gate.models.loading.fingerprint of the loaded
    weights, at `dtype`), `config` (its architecture fields, gate.loop.identity.ARCH_KEYS)
    and `config_digest` (first 16 hex digits of sha256 over them), and the logit `probe` on
    the fixed prompts (top `probe_top_k` per position). `probe_error`: why the probe could not
    be taken (then `probe` is empty); `release`: the comparison with the pinned release."""

    fingerprint: str
    dtype: str
    config: dict[str, Any]
    config_digest: str
    probe_top_k: int
    probe: list[ProbeSequence] = field(default_factory=list)
    probe_error: str | None = None
    release: ReleaseComparison | None = None


@dataclass
class DriftRecord:
    """The loaded (updated) target's law p against the release's law r under one declared
    law, per position of one fallback continuation (the ones overlap is measured along),
    both teacher-forced on the same tokens and processed by the same law.

    tv[i] = 1/2 sum_x |p_i(x) - r_i(x)| (in [0, 1]); kl[i] = KL(p_i || r_i) = sum_x p_i(x)
    log(p_i(x) / r_i(x)) in nats, terms with p_i(x) = 0 counting 0; None where it is
    infinite (p_i puts mass on a token r_i excludes: a greedy argmax that moved, or a top-k /
    top-p set that changed); top1[i] = argmax p_i == argmax r_i."""

    law: str
    prompt_id: str
    category: str
    tv: list[float]
    kl: list[float | None]
    top1: list[bool]
    context_length: int | None = None
    draft: str = "target"  # what drifted: the run's target (rules on drift apply to every draft's scope)
    constraint: str | None = None  # the workload.constraints label of the prompt variant, else None


@dataclass
class TokenizerComparison:
    """The target's tokenizer against a draft's (gate.measure.tokenizers.compare_tokenizers),
    as llama.cpp's draft checks compare them: vocabulary sizes, the first id whose token
    differs and both tokens there (None: no id differs), the special ids (BOS, EOS, PAD, UNK),
    the ids each adds before plain text (`*_adds_prefix`: [BOS] for a tokenizer that adds
    one, [] for none: an add-BOS difference), and `shared_tokens`, the tokens of the draft
    whose decoded text is also one target token's (special tokens left out): the support a
    shared-vocabulary mapping can propose on. `identical`: same vocabulary and special ids."""

    draft: str
    target_class: str
    draft_class: str
    target_vocab_size: int
    draft_vocab_size: int
    identical: bool
    first_differing_id: int | None
    first_differing_target: str | None
    first_differing_draft: str | None
    target_bos_token_id: int | None
    draft_bos_token_id: int | None
    target_eos_token_id: int | None
    draft_eos_token_id: int | None
    target_pad_token_id: int | None
    draft_pad_token_id: int | None
    target_unk_token_id: int | None
    draft_unk_token_id: int | None
    target_adds_prefix: list[int]
    draft_adds_prefix: list[int]
    shared_tokens: int
