"""A draft model with its own tokenizer: proposals made in the draft's vocabulary and
translated into the target's ids before verification.

Two mappings (policy field `mapping`):

- ``retokenize`` (universal assisted decoding: Timor et al. 2025, "Accelerating LLM
  Inference with Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies";
  transformers' ``assistant_tokenizer``). Algorithm, per verification step:
  1. translate the context: the target's committed ids are decoded to text (the leading BOS
     the target's tokenizer adds and PAD ids left out; other special tokens as their text) and encoded by the draft's
     tokenizer, after the prefix (BOS) the draft's tokenizer adds before plain text; the draft's KV cache is kept over
     the common prefix
     with what it was fed before (as gate.drafts.model.ModelDraft does);
  2. the draft samples up to n tokens in its own vocabulary under the declared law (stopping
     at its EOS) without its penalties, logit bias and grammar, which are defined on target
     ids (own_law); the target's p carries them;
  3. translate the proposal: its text is the draft's decoding of (context tail + proposal)
     minus the decoding of the tail (so a leading space survives SentencePiece decoding);
     it is encoded by the target's tokenizer after the decoded tail of the target context,
     and the ids after the tail are the proposal (when the tail itself does not re-encode to
     the same ids, the text is encoded alone); a draft EOS becomes the target's EOS; at most
     n target tokens are kept. The last target token is kept even where the text ends inside
     a word (a next draft token could have extended it): it is verified like any other, and
     where it is wrong the target rejects it, a lost verification position, never a wrong
     output; dropping it would cost a position in every step where it is right.
  Probability information: a point mass. The proposed target ids are a deterministic
  function of the draft's samples, and no probability of them under the target vocabulary is
  known (many draft paths give the same text), so q = one-hot(x) for the verifier.
  Correctness: speculative verification of a point mass x accepts with probability p(x) and
  otherwise samples from p with x removed, renormalised; the committed token's law is
  r(y)p(y) + sum_{x != y} r(x) (1 - p(x)) p(y) / (1 - p(x)) = p(y) for ANY law r by which x
  was chosen, as long as x is drawn before, and independently of, the verifier's uniforms.
  Conditioning on the draft's samples, the whole block is a deterministic proposal and the
  argument applies position by position (Leviathan et al. 2023, Thm 1, with q one-hot).
  The draft's draws come from the request's generator before the verifier draws its own.

- ``shared_vocab`` (token-level intersection; Timor et al. 2025, "SLEM/TLI"): the tokens
  whose decoded text is one token in both vocabularies (special tokens left out; where
  several ids of one vocabulary share a text, the id its tokenizer gives that text alone,
  e.g. Gemma's '0' piece, not its byte-fallback '<0x30>'). Algorithm: the context is translated as above; at
  each proposal the draft's logits are restricted to the shared tokens, placed at their
  target ids (-inf elsewhere), and the declared law is applied to them: q is a full
  distribution over the target vocabulary, zero outside the shared tokens, equal to the
  draft's law restricted to them and renormalised (plain temperature; with top-k/top-p the
  law's cut is taken among the shared tokens; penalties, logit bias and grammar apply on target ids, with the
  target-id history). The draft samples x ~ q and continues from
  the draft id with that text. Probability information: a distribution. Correctness: any
  q with x ~ q is exact under rejection sampling (Leviathan et al. 2023, Thm 1); tokens
  outside the shared set are never proposed but still reach the output through the residual.

Overlap on target positions (teacher_forced): at target position i the draft's context is
the translation of ids[:i]; its first proposal there is taken, as in a step. retokenize: the
first target token of the translated proposal of one draft token (greedy: the draft's argmax;
sampled laws: one draw from a generator seeded with TEACHER_FORCED_SEED, so overlap is
reproducible), as a point mass (overlap = p(that token)); shared_vocab: the mapped q.

Mapping cost: each Proposal carries `mapping_ms` (wall time of the translation work: decoding
and encoding the context and the proposal, mapping logits; not the draft's forwards) and
`draft_tokens` (tokens drafted in the draft's vocabulary), which the runner records per step
(the metrics mapping_ms, mapping_share and translation_loss).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field

from gate.core.errors import PolicyValueError
from gate.core.law import AnyLaw, Law, RequestLaw, law_probs
from gate.core.speculative import sample
from gate.drafts.interface import (
    BuildContext,
    BuiltDraft,
    ConfigContext,
    Draft,
    DraftKind,
    DraftModelConfig,
    DraftSpecBase,
    DType,
    Proposal,
    bill_from_modules,
    model_info,
)
from gate.drafts.model import _common_prefix
from gate.measure.bill import DraftBill
from gate.measure.kv import KVFormat
from gate.measure.tokenizers import (
    added_prefix,
    canonical,
    compare_tokenizers,
    shared_token_map,
    special_ids,
    token_texts,
)
from gate.models.cache import cache_tensor_bytes, crop_to, forward, new_cache, record_past
from gate.records import TokenizerComparison

Mapping = Literal["retokenize", "shared_vocab"]
TAIL_TOKENS = 8  # context tokens decoded with a proposal, so its text is cut at the right boundary
TEACHER_FORCED_SEED = 0  # the generator of sampled first proposals in teacher_forced (reproducible overlap)


def own_law(law: AnyLaw) -> Law:
    """The law a retokenizing draft samples its own tokens under: the declared law without
    its penalties, logit bias and grammar, which are defined on target token ids. Its
    proposals are point masses verified against the target's p under the whole law, so the
    output law is exact whatever law chose them (module docstring)."""
    base = law.law if isinstance(law, RequestLaw) else law
    return Law(base.name, base.temperature, base.top_k, base.top_p, base.min_p, convention=base.convention)


class Translator:
    """Both tokenizers and the maps between them (pure apart from calling the tokenizers).

    `target`, `draft`: transformers tokenizers; `target_vocab_size`: the width of the target's
    logits (may exceed len(target)); `draft_vocab_size`: the draft's logits width.
    `target_texts`/`draft_texts`: token_texts() when already computed."""

    def __init__(
        self,
        target: Any,
        draft: Any,
        target_vocab_size: int,
        draft_vocab_size: int,
        target_texts: list[str] | None = None,
        draft_texts: list[str] | None = None,
    ):
        self.target, self.draft = target, draft
        self.target_vocab_size, self.draft_vocab_size = target_vocab_size, draft_vocab_size
        self.target_prefix = added_prefix(
            target
        )  # what the target's tokenizer puts before text (its BOS), not translated
        self.skip_target = {i for i in (target.pad_token_id,) if i is not None and i != target.eos_token_id}
        self.draft_prefix = added_prefix(draft)
        self.draft_eos = draft.eos_token_id
        self.target_eos = target.eos_token_id
        self._target_texts, self._draft_texts = target_texts, draft_texts
        self._shared: tuple[torch.Tensor, torch.Tensor] | None = None
        self._draft_of: dict[int, int] = {}

    def texts(self) -> tuple[list[str], list[str]]:
        """token_texts of the target's and the draft's tokenizer (computed once)."""
        if self._target_texts is None:
            self._target_texts = token_texts(self.target)
        if self._draft_texts is None:
            self._draft_texts = token_texts(self.draft)
        return self._target_texts, self._draft_texts

    def draft_context(self, target_ids: list[int]) -> list[int]:
        """The draft's ids for a target context [T]: its text re-encoded, after the prefix
        (BOS) the draft's tokenizer adds before plain text (once: not when the text's own
        leading special token already encodes to it)."""
        text = self.target.decode(
            self._plain(target_ids, 0), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        ids = list(self.draft(text, add_special_tokens=False)["input_ids"])
        p = len(self.draft_prefix)
        return (
            ids if p and ids[:p] == self.draft_prefix else self.draft_prefix + ids
        )  # the text may start with it already

    def _plain(self, target_ids: list[int], start: int) -> list[int]:
        """target_ids[start:] without the prefix the target's tokenizer adds at position 0 (its
        BOS: the draft adds its own) and PAD ids. A chat template's leading special token that
        the tokenizer does not add itself (SmolLM2's <|im_start|>) is text and is kept."""
        p = len(self.target_prefix)
        if start < p and target_ids[:p] == self.target_prefix:
            start = p
        return [i for i in target_ids[start:] if i not in self.skip_target]

    def proposal_text(self, draft_context: list[int], drafted: list[int]) -> str:
        """The text the draft's tokens `drafted` add after `draft_context` (EOS left out)."""
        drafted = [x for x in drafted if x != self.draft_eos]
        tail = [i for i in draft_context[-TAIL_TOKENS:] if i not in self.draft_prefix]
        base = self.draft.decode(tail, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        full = self.draft.decode(tail + drafted, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if full.startswith(base):
            return full[len(base) :]
        return self.draft.decode(drafted, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def to_target(self, target_context: list[int], text: str) -> list[int]:
        """Target ids that spell `text` after `target_context`: the text encoded after the
        decoded context tail, the ids after the tail (the text alone when the tail does not
        re-encode to itself). Ids beyond the target's logits width are dropped."""
        if not text:
            return []
        tail = self._plain(target_context, max(0, len(target_context) - TAIL_TOKENS))
        base = self.target.decode(tail, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        ids = list(self.target(base + text, add_special_tokens=False)["input_ids"])
        if ids[: len(tail)] == tail and len(ids) > len(tail):
            ids = ids[len(tail) :]
        else:
            ids = list(self.target(text, add_special_tokens=False)["input_ids"])
        return [i for i in ids if i < self.target_vocab_size]

    def retokenize(self, target_context: list[int], draft_context: list[int], drafted: list[int], n: int) -> list[int]:
        """A step's proposal in target ids (at most `n`): see the module docstring, step 3."""
        text = self.proposal_text(draft_context, drafted)
        ids = self.to_target(target_context, text)
        ended = bool(drafted) and drafted[-1] == self.draft_eos
        if ended and self.target_eos is not None:
            ids.append(self.target_eos)
        return ids[:n]

    def shared(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(draft ids [S], target ids [S]) of the shared tokens (see the module docstring)."""
        if self._shared is None:
            t_texts, d_texts = self.texts()
            d_ids, t_ids = shared_token_map(
                t_texts,
                d_texts,
                special_ids(self.target),
                special_ids(self.draft),
                canonical(self.target),
                canonical(self.draft),
            )
            pairs = [
                (d, t)
                for d, t in zip(d_ids, t_ids, strict=False)
                if d < self.draft_vocab_size and t < self.target_vocab_size
            ]
            if self.draft_eos is not None and self.target_eos is not None:
                pairs.append((self.draft_eos, self.target_eos))  # the end of text is shared whatever its spelling
            self._shared = (
                torch.tensor([d for d, _ in pairs], dtype=torch.long),
                torch.tensor([t for _, t in pairs], dtype=torch.long),
            )
            self._draft_of = {t: d for d, t in pairs}
        return self._shared

    def mapped_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., V_draft] restricted to the shared tokens, at their target ids:
        [..., V_target], -inf outside the shared set."""
        d_ids, t_ids = self.shared()
        out = torch.full(
            (*logits.shape[:-1], self.target_vocab_size), float("-inf"), dtype=logits.dtype, device=logits.device
        )
        out[..., t_ids.to(logits.device)] = logits[..., d_ids.to(logits.device)]
        return out

    def draft_of(self, target_id: int) -> int:
        """The draft id of a shared target id (KeyError for one outside the shared set)."""
        self.shared()
        return self._draft_of[target_id]


class CrossTokenizerDraft(Draft):
    """A causal LM with its own tokenizer; proposals translated by `translator` under
    `mapping` (module docstring). One request at a time (start() resets its cache)."""

    kind = "cross_tokenizer"

    def __init__(
        self,
        name: str,
        model: torch.nn.Module,
        translator: Translator,
        mapping: Mapping,
        num_draft_tokens: int,
        device: torch.device,
        comparison: TokenizerComparison | None = None,
    ):
        self.name = name
        self.model = model
        self.translator = translator
        self.mapping = mapping
        self.num_draft_tokens = num_draft_tokens
        self.device = device
        self.probability_info = "distribution" if mapping == "shared_vocab" else "point_mass"
        self.tokenizer_comparison = comparison  # the report's tokenizer comparison (gate.loop.run collects it)
        self.draft_vocab_size = translator.draft_vocab_size
        self._cache: Any = None
        self._fed: list[int] = []

    def start(self) -> None:
        self._cache = new_cache(self.model.config)
        self._fed = []

    def _logits_after(self, draft_ids: list[int]) -> torch.Tensor:
        """The draft's logits [V_draft] after `draft_ids`, feeding only what its cache lacks."""
        if self._cache is None:
            self.start()
        keep = min(_common_prefix(self._fed, draft_ids), len(draft_ids) - 1)  # at least one token for fresh logits
        crop_to(self._cache, keep)  # also restricts sliding-window layers back to their window
        self._fed = self._fed[:keep]
        new = draft_ids[keep:]
        logits = forward(self.model, torch.tensor([new], device=self.device), self._cache, 1)[0, -1]
        if not self._fed:  # after the prefill: later proposals may be rolled back (gate.models.cache.record_past)
            record_past(self._cache)
        self._fed += new
        return logits

    def propose(self, context: list[int], n: int, law: Law, generator: torch.Generator | None) -> Proposal:
        clock = time.perf_counter()
        draft_ctx = self.translator.draft_context(context)
        mapping_s = time.perf_counter() - clock
        if self.mapping == "retokenize":
            drafted: list[int] = []
            ids = list(draft_ctx)
            for _ in range(n):
                x = sample(law_probs(self._logits_after(ids), own_law(law)), generator)
                drafted.append(x)
                ids.append(x)
                if x == self.translator.draft_eos:
                    break
            clock = time.perf_counter()
            tokens = self.translator.retokenize(context, draft_ctx, drafted, n)
            t = torch.tensor(tokens, dtype=torch.long, device=self.device)
            q = torch.nn.functional.one_hot(t, self.translator.target_vocab_size).float() if tokens else torch.empty(0)
            mapping_s += time.perf_counter() - clock
            return Proposal(t, q, mapping_s * 1e3, len(drafted))
        chosen: list[int] = []
        qs: list[torch.Tensor] = []
        ids = list(draft_ctx)
        for _ in range(n):
            logits = self._logits_after(ids)
            clock = time.perf_counter()
            q = law_probs(self.translator.mapped_logits(logits), law, context + chosen)
            mapping_s += time.perf_counter() - clock
            x = sample(q, generator)
            chosen.append(x)
            qs.append(q)
            ids.append(self.translator.draft_of(x))
            if x == self.translator.target_eos:
                break
        t = torch.tensor(chosen, dtype=torch.long, device=self.device)
        return Proposal(t, torch.stack(qs) if qs else torch.empty(0), mapping_s * 1e3, len(chosen))

    def teacher_forced(self, ids: list[int], start: int, law: Law, vocab_size: int) -> torch.Tensor:
        """q [len(ids) - start, vocab_size] on target positions (module docstring, "Overlap")."""
        generator = torch.Generator(device=self.device).manual_seed(TEACHER_FORCED_SEED)
        rows = torch.zeros(len(ids) - start, vocab_size, device=self.device)
        self.start()
        try:
            for row, i in enumerate(range(start, len(ids))):
                draft_ctx = self.translator.draft_context(ids[:i])
                logits = self._logits_after(draft_ctx)
                if self.mapping == "shared_vocab":
                    q = law_probs(self.translator.mapped_logits(logits), law, ids[:i])
                    rows[row, : min(vocab_size, q.shape[-1])] = q[:vocab_size]
                    continue
                x = sample(law_probs(logits, own_law(law)), generator)
                first = self.translator.to_target(ids[:i], self.translator.proposal_text(draft_ctx, [x]))
                if x == self.translator.draft_eos and self.translator.target_eos is not None:
                    first = [self.translator.target_eos]
                if first and first[0] < vocab_size:
                    rows[row, first[0]] = 1.0
        finally:
            self.start()
        return rows

    def cache_bytes(self) -> int:
        return cache_tensor_bytes(self._cache)

    def modules(self) -> list[torch.nn.Module]:
        return [self.model]


class CrossTokenizerDraftSpec(DraftSpecBase):
    """A separate model whose tokenizer differs from the target's (universal assisted
    decoding). mapping retokenize: proposals decoded and re-encoded into target ids, a point
    mass (exact for any proposal drawn independently of the verifier's uniforms); mapping
    shared_vocab: q restricted to the tokens both vocabularies share, a full distribution
    (exact by Leviathan et al. 2023, Thm 1). See gate.drafts.cross_tokenizer."""

    model_config = ConfigDict(title="CrossTokenizerDraft")

    kind: Literal["cross_tokenizer"]
    model: str = Field(..., description="The draft model: a source as for target.model (e.g. 'gemma3-270m').")
    gguf_file: str | None = None
    dtype: DType | None = Field(None, description="Default: the target's dtype.")
    mapping: Mapping = Field(
        "retokenize",
        description="retokenize: decode the draft's tokens and re-encode them into target "
        "ids (a point mass q); shared_vocab: q restricted to the tokens both vocabularies share "
        "(a full distribution).",
    )

    @property
    def probability_info(self) -> str:
        """What q the mapping gives: "point_mass" (retokenize) or "distribution" (shared_vocab)."""
        return "distribution" if self.mapping == "shared_vocab" else "point_mass"


@lru_cache(maxsize=8)
def _tokenizer(location: str, gguf_file: str | None, kind: str, label: str) -> Any:
    """A draft's tokenizer, loaded once per process (gate validate and gate check both need it;
    Gemma's GGUF tokenizer takes ~15 s to build)."""
    from gate.models.loading import ModelSource, load_tokenizer

    return load_tokenizer(ModelSource(kind, location, gguf_file, label))


def _draft_tokenizer(name: str, spec: CrossTokenizerDraftSpec, policy_dir: Path) -> Any:
    from gate.models import loading as models

    at = f"drafts.{name}.model"
    source = models.resolve_source(spec.model, spec.gguf_file, policy_dir, at)
    try:
        return _tokenizer(source.location, source.gguf_file, source.kind, source.label)
    except Exception as e:  # noqa: BLE001 - a tokenizer that cannot be read is bad input
        raise PolicyValueError(at, f"cannot load the tokenizer of {source}: {type(e).__name__}: {e}") from None


# Draft models loaded by this process and still in use, by (location, gguf file, dtype, device).
_LOADED: weakref.WeakValueDictionary[tuple, torch.nn.Module] = weakref.WeakValueDictionary()


def _build(name: str, spec: CrossTokenizerDraftSpec, ctx: BuildContext) -> BuiltDraft:
    """Load the draft model and its tokenizer, compare the tokenizers (for the report) and
    build the translator. Raises PolicyValueError at the draft's YAML path."""
    from gate.models import loading as models

    path = f"drafts.{name}"
    if ctx.tokenizer is None:
        raise PolicyValueError(f"{path}.kind", "a cross_tokenizer draft needs the target's tokenizer")
    dtype = spec.dtype or ctx.target_dtype
    source = models.resolve_source(spec.model, spec.gguf_file, ctx.policy_dir, f"{path}.model")
    tokenizer = _draft_tokenizer(name, spec, ctx.policy_dir)
    key = (source.location, source.gguf_file, dtype, str(ctx.device))
    model = _LOADED.get(key)
    if model is None:  # two mappings of one model (examples/gemma) share its weights; each draft has its own cache
        model = _LOADED[key] = models.load_model(source, dtype, ctx.device)
    head = model.get_output_embeddings()
    draft_vocab = int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)
    translator = Translator(ctx.tokenizer, tokenizer, ctx.vocab_size, draft_vocab)
    t_texts, d_texts = translator.texts()
    comparison = compare_tokenizers(name, ctx.tokenizer, tokenizer, t_texts, d_texts)
    draft = CrossTokenizerDraft(name, model, translator, spec.mapping, spec.num_draft_tokens, ctx.device, comparison)
    return BuiltDraft(draft, model_info(name, str(source), f"cross_tokenizer+{spec.mapping}", dtype, model))


def _model_config(name: str, spec: CrossTokenizerDraftSpec, ctx: ConfigContext) -> DraftModelConfig:
    """The draft model's own config (its own layers, KV heads, head_dim) and vocabulary."""
    config = ctx.read_config(spec.model, spec.gguf_file, f"drafts.{name}.model")
    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    return DraftModelConfig(config, spec.dtype or ctx.target_dtype, own_vocab_size=int(vocab) if vocab else None)


def _loaded_bill(
    name: str, draft: Draft, target: torch.nn.Module, kv_format_of: Callable[[str], KVFormat]
) -> DraftBill:
    """As any model draft (its own cache and weights), plus its logits at its own vocabulary."""
    return replace(
        bill_from_modules(name, draft, target, kv_format_of), vocab_size=getattr(draft, "draft_vocab_size", None)
    )


def _check_tokenizer(name: str, spec: CrossTokenizerDraftSpec, target_tokenizer: Any, policy_dir: Path) -> None:
    """gate validate: the draft's model and tokenizer can be found and loaded (a different
    tokenizer is the point of this kind: no mismatch error). Raises PolicyValueError."""
    _draft_tokenizer(name, spec, policy_dir)


KIND = DraftKind(
    name="cross_tokenizer",
    spec=CrossTokenizerDraftSpec,
    translates_tokenizer=True,
    # retokenize's; shared_vocab says "distribution" (CrossTokenizerDraftSpec.probability_info)
    probability_info="point_mass",
    build=_build,
    model_config=_model_config,
    loaded_bill=_loaded_bill,
    check_tokenizer=_check_tokenizer,
)
