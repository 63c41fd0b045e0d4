"""A draft that is a language model: a separate model, the target's weights at another
dtype or quantization, or (via early_exit.py) a truncated view of the target."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field

from gate.core.dtypes import DTYPES
from gate.core.errors import PolicyValueError
from gate.core.law import Law, law_probs
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
    ModelRef,
    Proposal,
    ServedContext,
    ServedDraft,
    VLLMContext,
    VLLMDraft,
    model_info,
)
from gate.models.cache import cache_tensor_bytes, crop_to, forward, new_cache, record_past


class ModelDraft(Draft):
    """Autoregressive proposals from a causal LM with its own KV cache.

    q at each proposal is the draft's next-token distribution processed by the declared
    law (the same processing the verifier applies to p)."""

    probability_info = "distribution"

    def __init__(
        self,
        name: str,
        kind: str,
        model: torch.nn.Module,
        num_draft_tokens: int,
        device: torch.device,
        vocab_size: int | None = None,
    ):
        self.name = name
        self.kind = kind
        self.model = model
        self.num_draft_tokens = num_draft_tokens
        self.device = device
        self.vocab_size = vocab_size  # the target's logits width; None: the draft's own
        self._cache: Any = None
        self._fed: list[int] = []

    def start(self) -> None:
        self._cache = new_cache(self.model.config)
        self._fed = []

    def propose(self, context: list[int], n: int, law: Law, generator: torch.Generator | None) -> Proposal:
        if self._cache is None:
            self.start()
        keep = _common_prefix(self._fed, context)
        keep = min(keep, len(context) - 1)  # at least one token to feed for fresh logits
        crop_to(self._cache, keep)  # also restricts sliding-window layers back to their window
        self._fed = self._fed[:keep]
        new = context[keep:]
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for _ in range(n):
            logits = forward(self.model, torch.tensor([new], device=self.device), self._cache, 1)
            if not self._fed:  # after the prefill: later proposals may be rolled back (gate.models.cache.record_past)
                record_past(self._cache)
            self._fed += new
            q = law_probs(self._aligned(logits[0, -1]), law, context + tokens)
            x = sample(q, generator)
            tokens.append(x)
            qs.append(q)
            new = [x]
        return Proposal(
            torch.tensor(tokens, device=self.device, dtype=torch.long), torch.stack(qs) if qs else torch.empty(0)
        )

    def teacher_forced(self, ids: list[int], start: int, law: Law, vocab_size: int) -> torch.Tensor:
        logits = forward(self.model, torch.tensor([ids[:-1]], device=self.device))[0]
        return law_probs(self._aligned(logits[start - 1 :]), law, ids, start)

    def _aligned(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [..., V_draft] on the target's vocabulary [..., V_target]: padded ids a
        model has beyond the shared tokenizer are dropped, missing ones get -inf (q = 0)."""
        v = self.vocab_size
        if v is None or logits.shape[-1] == v:
            return logits
        if logits.shape[-1] > v:
            return logits[..., :v]
        pad = torch.full(
            (*logits.shape[:-1], v - logits.shape[-1]), float("-inf"), dtype=logits.dtype, device=logits.device
        )
        return torch.cat([logits, pad], dim=-1)

    def cache_bytes(self) -> int:
        return cache_tensor_bytes(self._cache)

    def modules(self) -> list[torch.nn.Module]:
        return [self.model]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ModelDraftSpec(DraftSpecBase):
    """A separate model, or the target's own weights at another dtype or quantization.

    Gives a full distribution q: exact under rejection sampling (Leviathan et al. 2023, Thm 1)."""

    model_config = ConfigDict(title="ModelDraft")

    kind: Literal["model"]
    model: str = Field("target", description="'target' reuses the target's weights; else a source as for target.model.")
    gguf_file: str | None = None
    dtype: DType | None = Field(None, description="Default: the target's dtype.")
    quantization: Literal["none", "int8_dynamic"] = Field(
        "none",
        description="int8_dynamic: int8 weights with per-tensor scales on every Linear (torch dynamic "
        "quantization, CPU).",
    )


def _build(name: str, spec: ModelDraftSpec, ctx: BuildContext) -> BuiltDraft:
    """The model draft: the target deep-copied at the draft's dtype (model: target), or a
    separate model (gate validate has checked that its tokenizer matches the target's,
    tokenizer_sources); int8_dynamic quantized on CPU."""
    from gate.models import loading as models

    path = f"drafts.{name}"
    dtype = spec.dtype or ctx.target_dtype
    if spec.model == "target":
        model, label = copy.deepcopy(ctx.target).to(dtype=DTYPES[dtype]), "target"
    else:
        source = models.resolve_source(spec.model, spec.gguf_file, ctx.policy_dir, f"{path}.model")
        model, label = models.load_model(source, dtype, ctx.device), str(source)
    if spec.quantization == "int8_dynamic":
        if ctx.device.type != "cpu":
            raise PolicyValueError(
                f"{path}.quantization", "int8_dynamic (torch dynamic quantization) runs on the CPU only"
            )
        if dtype != "float32":
            raise PolicyValueError(f"{path}.dtype", "int8_dynamic quantizes float32 weights; leave dtype at float32")
        model = models.quantize_int8_dynamic(model)
    draft = ModelDraft(name, "model", model, spec.num_draft_tokens, ctx.device, vocab_size=ctx.vocab_size)
    kind = "model" + (f"+{spec.quantization}" if spec.quantization != "none" else "")
    return BuiltDraft(draft, model_info(name, label, kind, dtype, model))


def _model_config(name: str, spec: ModelDraftSpec, ctx: ConfigContext) -> DraftModelConfig:
    """The target's config (model: target) or the separate model's; int8_dynamic keeps its
    cache at float32."""
    dtype = spec.dtype or ctx.target_dtype
    config = (
        ctx.target_config
        if spec.model == "target"
        else ctx.read_config(spec.model, spec.gguf_file, f"drafts.{name}.model")
    )
    return DraftModelConfig(
        config, dtype, spec.quantization, "float32" if spec.quantization == "int8_dynamic" else dtype
    )


def _tokenizer_sources(name: str, spec: ModelDraftSpec) -> list[ModelRef]:
    return [] if spec.model == "target" else [ModelRef(spec.model, spec.gguf_file, f"drafts.{name}.model")]


def _policy_problems(name: str, spec: ModelDraftSpec, target: Any) -> list[tuple[str, str]]:
    """A draft that is the target itself; int8_dynamic on weights other than float32 (the
    draft's dtype, or the target's when it inherits it: refused at validate, not after the
    models load) or on a CUDA target (torch dynamic quantization runs on the CPU)."""
    if spec.model == "target" and spec.dtype in (None, target.dtype) and spec.quantization == "none":
        return [(f"drafts.{name}", "this draft is the target itself (same weights, dtype, quantization)")]
    if spec.quantization == "int8_dynamic":
        dtype = spec.dtype or target.dtype
        if dtype != "float32":
            at, whose = ("dtype", "") if spec.dtype else ("quantization", ", the target's, which it inherits")
            return [
                (
                    f"drafts.{name}.{at}",
                    f"int8_dynamic quantizes float32 weights, and the draft's dtype is {dtype}{whose}: give the "
                    "draft dtype: float32",
                )
            ]
        if target.device == "cuda":
            return [(f"drafts.{name}.quantization", "int8_dynamic (torch dynamic quantization) runs on the CPU only")]
    return []


def _llama_server(name: str, spec: ModelDraftSpec, ctx: ServedContext) -> ServedDraft:
    """llama-server runs a separate GGUF as the draft (-md, --spec-type draft-simple). It runs
    files as they are: the target's weights at another dtype or quantization need their own
    GGUF (e.g. written by llama.cpp's llama-quantize)."""
    from gate.models import loading as models

    path = f"drafts.{name}"
    if spec.model == "target":
        raise PolicyValueError(
            f"{path}.model",
            "llama-server runs GGUF files as they are: a draft of the target's "
            "weights at another dtype or quantization needs its own GGUF file; name it in model",
        )
    if spec.dtype is not None or spec.quantization != "none":
        key = "dtype" if spec.dtype is not None else "quantization"
        raise PolicyValueError(f"{path}.{key}", f"llama-server runs the GGUF's own tensor types; {key} does not apply")
    source = models.resolve_source(spec.model, spec.gguf_file, ctx.policy_dir, f"{path}.model")
    if not source.gguf_file:
        raise PolicyValueError(f"{path}.model", f"llama-server needs a GGUF file; {source} is not one")
    return ServedDraft(str(Path(source.location) / source.gguf_file), "draft-simple")


def _vllm(name: str, spec: ModelDraftSpec, ctx: VLLMContext) -> VLLMDraft:
    """vLLM's draft_model method on a Hugging Face directory: the draft's own, or one gate
    writes (gate.models.hf_export) from a GGUF. Refused: int8 dynamic quantization (gate's
    in-process scheme) and model: target (vLLM runs a draft at the target's dtype)."""
    from gate.models import loading as models
    from gate.models.hf_export import hf_directory

    path = f"drafts.{name}"
    if spec.quantization != "none":
        raise PolicyValueError(
            f"{path}.quantization",
            f"vLLM does not run gate's {spec.quantization} scheme; give a "
            "quantized checkpoint vLLM loads as the draft model instead",
        )
    if spec.model == "target":  # vLLM runs a draft model at the target's dtype: it would be the target itself
        raise PolicyValueError(
            f"{path}.model",
            "vLLM serves a draft model at the target's dtype: a draft of the "
            "target's weights at another dtype cannot be run; name a separate model",
        )
    source = models.resolve_source(spec.model, spec.gguf_file, ctx.policy_dir, f"{path}.model")
    try:
        folder = (
            hf_directory(source, dtype=spec.dtype or "float32", cache_dir=ctx.cache_dir)
            if spec.dtype or source.kind != "hf_dir"
            else Path(source.location)
        )
    except Exception as e:  # noqa: BLE001 - transformers' loaders raise many kinds: bad input, named
        raise PolicyValueError(f"{path}.model", f"cannot write the draft's model directory for vLLM: {e}") from None
    return VLLMDraft({"method": "draft_model", "model": str(folder), "num_speculative_tokens": spec.num_draft_tokens})


KIND = DraftKind(
    name="model",
    spec=ModelDraftSpec,
    probability_info="distribution",
    build=_build,
    model_config=_model_config,
    tokenizer_sources=_tokenizer_sources,
    policy_problems=_policy_problems,
    llama_server=_llama_server,
    vllm=_vllm,
)
