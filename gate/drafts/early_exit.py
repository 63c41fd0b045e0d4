"""Early exit: the first k decoder layers of the target, then its final norm and shared head.

The draft is a view: its modules are the target's own (no weights copied, billed once),
with a KV cache of its own for its k layers. Without training the exit, overlap is
usually low; that is what the gate is for.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field

from gate.core.errors import PolicyValueError
from gate.drafts.interface import (
    BuildContext,
    BuiltDraft,
    ConfigContext,
    DraftKind,
    DraftModelConfig,
    DraftSpecBase,
    ServedContext,
    ServedDraft,
    VLLMContext,
    VLLMDraft,
    model_info,
)
from gate.drafts.model import ModelDraft
from gate.models.hf_export import truncated_config


def early_exit_model(target: torch.nn.Module, num_layers: int, yaml_path: str) -> torch.nn.Module:
    """A causal LM of the target's class running its first `num_layers` layers.

    Supports decoder-only models laid out as `model.layers` with `model.norm` and
    `lm_head` (Llama, Mistral, Qwen2, Gemma and kin). Raises PolicyValueError otherwise,
    or when num_layers is not below the target's layer count.
    """
    inner = getattr(target, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "norm") or not hasattr(target, "lm_head"):
        raise PolicyValueError(
            yaml_path, f"early_exit needs a decoder laid out as model.layers (got {type(target).__name__})"
        )
    total = len(layers)
    if not 1 <= num_layers < total:
        raise PolicyValueError(
            yaml_path, f"num_layers must be between 1 and {total - 1} (the target has {total} layers)"
        )
    with torch.device("meta"):
        draft = type(target)(truncated_config(target.config, num_layers))
    # Share the target's modules: no copies, same parameters.
    for name, child in inner.named_children():
        setattr(draft.model, name, torch.nn.ModuleList(list(layers)[:num_layers]) if name == "layers" else child)
    draft.lm_head = target.lm_head
    return draft.eval()


def early_exit_draft(
    name: str, target: torch.nn.Module, num_layers: int, num_draft_tokens: int, device: torch.device, yaml_path: str
) -> ModelDraft:
    """A ModelDraft over `early_exit_model` (its weights are the target's: billed once)."""
    model = early_exit_model(target, num_layers, yaml_path)
    return ModelDraft(name, "early_exit", model, num_draft_tokens, device)


class EarlyExitDraftSpec(DraftSpecBase):
    """The first `num_layers` layers of the target with its final norm and shared head.

    Gives a full distribution q; its weights are the target's, counted once."""

    model_config = ConfigDict(title="EarlyExitDraft")

    kind: Literal["early_exit"]
    num_layers: int = Field(..., ge=1, description="Target layers the draft runs (must be fewer than the target has).")


def _build(name: str, spec: EarlyExitDraftSpec, ctx: BuildContext) -> BuiltDraft:
    draft = early_exit_draft(
        name, ctx.target, spec.num_layers, spec.num_draft_tokens, ctx.device, f"drafts.{name}.num_layers"
    )
    return BuiltDraft(
        draft, model_info(name, f"target[:{spec.num_layers}]", "early_exit", ctx.target_dtype, draft.model)
    )


def _model_config(name: str, spec: EarlyExitDraftSpec, ctx: ConfigContext) -> DraftModelConfig:
    """The target's config cut to num_layers, at the target's dtype; weights the target's own."""
    return DraftModelConfig(
        truncated_config(ctx.target_config, spec.num_layers), ctx.target_dtype, shares_target_weights=True
    )


def _check_target_config(name: str, spec: EarlyExitDraftSpec, config: Any) -> None:
    """num_layers must be below the target's layer count (when the config states it)."""
    layers = getattr(config, "num_hidden_layers", None)
    if layers and not spec.num_layers < layers:
        raise PolicyValueError(
            f"drafts.{name}.num_layers", f"must be below the target's {layers} layers (got {spec.num_layers})"
        )


def _llama_server(name: str, spec: EarlyExitDraftSpec, ctx: ServedContext) -> ServedDraft:
    """The same early exit for llama.cpp: a GGUF of the target's first num_layers blocks with
    its final norm and head (gate.models.gguf_edit), run as a separate draft model (-md)."""
    from gate.models.gguf_edit import truncated_gguf

    try:
        path = truncated_gguf(ctx.target_gguf, spec.num_layers, ctx.cache_dir)
    except (ValueError, OSError) as e:
        raise PolicyValueError(f"drafts.{name}.num_layers", f"cannot write the early-exit GGUF: {e}") from None
    return ServedDraft(str(path), "draft-simple")


def _vllm(name: str, spec: EarlyExitDraftSpec, ctx: VLLMContext) -> VLLMDraft:
    """The same early exit for vLLM: a model directory of the target's first num_layers
    layers with its final norm and head (gate.models.hf_export), run as a draft model."""
    from gate.models.hf_export import hf_directory

    try:
        path = hf_directory(ctx.target, num_layers=spec.num_layers, cache_dir=ctx.cache_dir)
    except Exception as e:  # noqa: BLE001 - transformers' loaders raise many kinds: bad input, named
        raise PolicyValueError(
            f"drafts.{name}.num_layers", f"cannot write the early-exit model directory: {e}"
        ) from None
    return VLLMDraft({"method": "draft_model", "model": str(path), "num_speculative_tokens": spec.num_draft_tokens})


KIND = DraftKind(
    name="early_exit",
    spec=EarlyExitDraftSpec,
    probability_info="distribution",
    build=_build,
    model_config=_model_config,
    check_target_config=_check_target_config,
    llama_server=_llama_server,
    vllm=_vllm,
)
