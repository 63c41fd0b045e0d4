"""`gate bill` and `gate roofline`: the resident resource bill of a policy (or of model
configs given directly) and its place on the roofline, without running a model. Weights
are counted from the architecture built on the meta device (no weights loaded); `gate
check` bills the weights it actually loaded instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gate.drafts.early_exit import truncated_config
from gate.errors import PolicyValueError
from gate.measure.bill import BillInputs, build_bill
from gate.models.load import DTYPES
from gate.measure.kv import CacheModel, ConfigError, KVFormat, cache_model
from gate.records import FALLBACK, BillRecord



@dataclass(frozen=True)
class DraftBill:
    """What the bill needs of one draft: its cache (None: no cache) and the weight bytes it
    adds beyond the target's."""

    name: str
    num_draft_tokens: int
    cache: CacheModel | None
    own_weight_bytes: int
    has_distribution: bool


def kv_format(resources: Any, model_dtype: str) -> KVFormat:
    """The cache format the policy declares (auto: the model's own dtype)."""
    dtype = model_dtype if resources.kv_dtype == "auto" else resources.kv_dtype
    return KVFormat(dtype, resources.kv_scale_group)


def bills_for(resources: Any, context_tokens: int, vocab_size: int, target_cache: CacheModel, target_weight_bytes: int,
              drafts: list[DraftBill]) -> list[BillRecord]:
    """The fallback's bill and every draft's, with the budget statement when the policy
    declares a capacity."""
    capacity = resources.bytes_of("capacity") if resources.capacity else None
    common = dict(target_cache=target_cache, target_weight_bytes=target_weight_bytes, vocab_size=vocab_size,
                  context_tokens=context_tokens, sequences=resources.sequences, tree_branches=resources.tree_branches,
                  workspace_bytes=resources.bytes_of("workspace"), graph_capture_bytes=resources.bytes_of("graph_captures"),
                  communication_bytes=resources.bytes_of("communication_buffers"), fragmentation=resources.fragmentation)
    out = [build_bill(BillInputs(FALLBACK, **common), capacity)]
    for d in drafts:
        out.append(build_bill(BillInputs(d.name, num_draft_tokens=d.num_draft_tokens, draft_cache=d.cache,
                                         draft_weight_bytes=d.own_weight_bytes, draft_has_distribution=d.has_distribution,
                                         **common), capacity))
    return out


def meta_model(config: Any) -> torch.nn.Module:
    """The causal LM of `config` built on the meta device (no memory). Raises ConfigError
    for a config transformers cannot build as a causal LM."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - any failure means: not a causal LM gate can bill
        raise ConfigError(f"cannot build a causal LM from this config ({type(config).__name__}): {type(e).__name__}: {e}") from None


def estimate_weight_bytes(config: Any, dtype: str, quantization: str = "none") -> int:
    """Weight bytes of a causal LM built from `config` on the meta device (tied tensors once).

    int8_dynamic: every nn.Linear weight at 1 byte plus a per-tensor scale and zero point
    (16 bytes), biases and every other tensor at float32, as torch dynamic quantization keeps them.
    Raises ConfigError for a config that is not a causal LM."""
    model = meta_model(config)
    size = torch.empty(0, dtype=DTYPES[dtype]).element_size()
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # e.g. rotary inv_freq, kept float32
    if quantization != "int8_dynamic":
        return sum(p.numel() for p in model.parameters()) * size + buffers
    # int8 Linear weights (a tied head gets its own int8 copy; the embedding stays float32)
    total = 0
    counted: set[int] = set()
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            total += m.weight.numel() + 16 + (m.bias.numel() * 4 if m.bias is not None else 0)
            continue
        for p in m.parameters(recurse=False):
            if id(p) not in counted:
                counted.add(id(p))
                total += p.numel() * 4
    return total + buffers


def load_config(source: Any) -> Any:
    """The transformers config of a resolved model source (GGUF metadata included)."""
    from transformers import AutoConfig

    kwargs: dict[str, Any] = {"local_files_only": True}
    if source.gguf_file:
        kwargs["gguf_file"] = source.gguf_file
    return AutoConfig.from_pretrained(source.location, **kwargs)


def policy_bills(loaded: Any) -> list[BillRecord]:
    """The bills of a policy's fallback and drafts from configs alone. Raises
    PolicyValueError (with the YAML path) for a model or config gate cannot bill."""
    from gate.models.load import resolve_source

    policy = loaded.policy
    res = policy.resources
    source = resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
    config = _config(source, "target.model")
    target_cache = _cache(config, kv_format(res, policy.target.dtype), "target.model")
    target_bytes = _weights(config, policy.target.dtype, "none", "target.model")
    context = res.context_tokens or _longest(loaded) + max(policy.workload.max_new_tokens_list)
    drafts = []
    for name, d in policy.drafts.items():
        if d.kind == "prompt_lookup":
            drafts.append(DraftBill(name, d.num_draft_tokens, None, 0, False))
        elif d.kind == "early_exit":
            cfg = truncated_config(config, d.num_layers)
            drafts.append(DraftBill(name, d.num_draft_tokens, _cache(cfg, kv_format(res, policy.target.dtype), f"drafts.{name}"), 0, True))
        else:
            dtype = d.dtype or policy.target.dtype
            dcfg = config if d.model == "target" else _config(
                resolve_source(d.model, d.gguf_file, loaded.path.parent, f"drafts.{name}.model"), f"drafts.{name}.model")
            kv_dtype = "float32" if d.quantization == "int8_dynamic" else dtype
            drafts.append(DraftBill(name, d.num_draft_tokens, _cache(dcfg, kv_format(res, kv_dtype), f"drafts.{name}"),
                                    _weights(dcfg, dtype, d.quantization, f"drafts.{name}"), True))
    return bills_for(res, context, int(config.vocab_size), target_cache, target_bytes, drafts)


def _longest(loaded: Any) -> int:
    from gate.models.load import load_tokenizer, resolve_source
    from gate.session import load_prompts

    policy = loaded.policy
    source = resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
    return max(len(p.token_ids) for p in load_prompts(loaded, load_tokenizer(source)))


def _config(source: Any, yaml_path: str) -> Any:
    try:
        return load_config(source)
    except Exception as e:  # noqa: BLE001 - an unreadable config is bad input
        raise PolicyValueError(yaml_path, f"cannot read the model config of {source}: {type(e).__name__}: {e}") from None


def _meta(config: Any, yaml_path: str) -> torch.nn.Module:
    try:
        return meta_model(config)
    except ConfigError as e:
        raise PolicyValueError(yaml_path, str(e)) from None


def _weights(config: Any, dtype: str, quantization: str, yaml_path: str) -> int:
    try:
        return estimate_weight_bytes(config, dtype, quantization)
    except ConfigError as e:
        raise PolicyValueError(yaml_path, str(e)) from None


def _cache(config: Any, fmt: KVFormat, yaml_path: str) -> CacheModel:
    try:
        return cache_model(config, fmt)
    except ConfigError as e:
        raise PolicyValueError(yaml_path, str(e)) from None


def config_bills(target: Path, draft: Path | None, dtype: str, num_draft_tokens: int, context_tokens: int,
                 sequences: int, resources: Any) -> list[BillRecord]:
    """Bills from config.json files (or model folders holding one, or .gguf files) given on the command line.
    Raises ConfigError for a config gate cannot bill."""
    from transformers import AutoConfig

    def read(path: Path) -> Any:
        try:
            if path.suffix == ".gguf" and path.is_file():  # the architecture from the GGUF metadata, no tensor read
                return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
            return AutoConfig.from_pretrained(str(path), local_files_only=True)
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"cannot read a model config from {path}: {type(e).__name__}: {e}") from None

    tcfg = read(target)
    fmt = kv_format(resources, dtype)
    drafts = []
    if draft is not None:
        dcfg = read(draft)
        drafts.append(DraftBill("draft", num_draft_tokens, cache_model(dcfg, fmt), estimate_weight_bytes(dcfg, dtype), True))
    res = resources.model_copy(update={"sequences": sequences})
    return bills_for(res, context_tokens, int(tcfg.vocab_size), cache_model(tcfg, fmt), estimate_weight_bytes(tcfg, dtype), drafts)


@dataclass(frozen=True)
class RooflineRow:
    """The fallback's decode step and a draft's verification step at one batch size."""

    runner: str
    steps: list[Any]
    ridge_batch: float  # batch at which this runner's step reaches the compute roof
    cost_coefficient: float | None  # predicted draft step time / target step time (batch 1)
    by_law: dict[str, dict[str, float | None]]  # law -> alpha (mean overlap), predicted and measured speedup


def policy_roofline(loaded: Any, bandwidth: float, peak_flops: float, batches: list[int],
                    report: dict[str, Any] | None = None) -> list[RooflineRow]:
    """Place the fallback decode step and every model draft's verification step on the
    roofline, from the target's and drafts' parameter and cache bytes at the policy's
    context. With a gate check report, the predicted speedup from its measured acceptance
    rate and the roofline's cost coefficient stands beside the measured speedup."""
    from gate.measure.roofline import predicted_speedup, ridge_batch, step
    from gate.models.load import resolve_source

    policy = loaded.policy
    source = resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
    config = _config(source, "target.model")
    params = sum(p.numel() for p in _meta(config, "target.model").parameters())
    bills = {b.draft: b for b in policy_bills(loaded)}
    context = bills[FALLBACK].context_tokens
    kv = cache_model(config, kv_format(policy.resources, policy.target.dtype)).bytes_per_token
    width = _attention_width(config)
    weights = next(x.bytes for x in bills[FALLBACK].lines if x.name == "target weights")
    summary = {(r["runner"], r["law"]): r for r in (report or {}).get("summary", [])}
    rows = [RooflineRow(FALLBACK, [step("decode", params, weights, kv, context, b, 1, peak_flops, bandwidth, width) for b in batches],
                        ridge_batch(params, weights, kv, context, 1, peak_flops, bandwidth, width), None, {})]
    target_step = step("decode", params, weights, kv, context, 1, 1, peak_flops, bandwidth, width).time_s
    for name, d in policy.drafts.items():
        k = d.num_draft_tokens + 1
        steps = [step("verify", params, weights, kv, context, b, k, peak_flops, bandwidth, width) for b in batches]
        c = 0.0  # prompt lookup: no draft model to run
        if d.kind != "prompt_lookup":
            if d.kind == "early_exit":
                dcfg, dtype, quant = truncated_config(config, d.num_layers), policy.target.dtype, "none"
            else:
                dcfg = config if d.model == "target" else _config(
                    resolve_source(d.model, d.gguf_file, loaded.path.parent, f"drafts.{name}.model"), f"drafts.{name}.model")
                dtype, quant = d.dtype or policy.target.dtype, d.quantization
            dparams = sum(p.numel() for p in _meta(dcfg, f"drafts.{name}").parameters())
            dkv = cache_model(dcfg, kv_format(policy.resources, "float32" if quant == "int8_dynamic" else dtype)).bytes_per_token
            c = step("draft", dparams, _weights(dcfg, dtype, quant, f"drafts.{name}"), dkv, context, 1, 1, peak_flops,
                     bandwidth, _attention_width(dcfg)).time_s / target_step
        by_law: dict[str, dict[str, float | None]] = {}
        for (runner, law), r in summary.items():
            # alpha in Leviathan et al.'s formula is the per-proposal acceptance probability:
            # the mean overlap (PRIMER), not vLLM's accepted / proposed, which also counts
            # proposals made after the first rejection
            if runner == name and r.get("overlap_mean") is not None:
                alpha = r["overlap_mean"]
                by_law[law] = {"alpha": alpha, "predicted_speedup": predicted_speedup(alpha, d.num_draft_tokens, c),
                               "measured_speedup": r.get("speedup")}
        rows.append(RooflineRow(name, steps, ridge_batch(params, weights, kv, context, k, peak_flops, bandwidth, width), c, by_law))
    return rows


def _attention_width(config: Any) -> int:
    """layers x query heads x head_dim: attention FLOPs per token and context position / 4."""
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else 0)
    return int(config.num_hidden_layers) * heads * int(head_dim)
