"""The resident resource bill of a policy from its model configs, without loading weights
(the bill pass of `gate check` when it does not bill loaded weights, and `gate bill`): weights
counted from the architecture built on the meta device, the KV cache from the config's KV heads,
and what a served engine says it preallocated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gate.core.errors import PolicyValueError
from gate.drafts import registry as draft_kinds
from gate.drafts.interface import ConfigContext
from gate.measure.bill import SERVER_POOL_LINE, DraftBill, bills_for, estimate_weight_bytes, kv_format, meta_model
from gate.measure.kv import CacheModel, ConfigError, KVFormat, cache_model
from gate.models.loading import read_config
from gate.records import BillLine, BillRecord


def policy_bills(loaded: Any) -> list[BillRecord]:
    """The bills of a validated policy's fallback and drafts from configs alone (`loaded`:
    the gate.plan.matrix.Plan of gate.plan.validate; the default context is its longest planned prompt
    plus max_new_tokens). Raises PolicyValueError (with the YAML path) for a model or config
    gate cannot bill."""
    from gate.models.loading import resolve_source

    policy = loaded.policy
    res = policy.resources
    source = resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
    config = read_config(source, "target.model")
    target_cache = _cache(config, kv_format(res, policy.target.dtype), "target.model")
    target_bytes = weights_of(config, policy.target.dtype, "none", "target.model")
    context = res.context_tokens or _longest(loaded) + max(policy.workload.max_new_tokens_list)
    ctx = config_context(loaded, config)
    drafts = []
    for name, d in policy.drafts.items():
        at = f"drafts.{name}"
        m = draft_kinds.model_config(name, d, ctx)
        if m is None:  # no model: no cache; weights only where its files hold some (trained heads)
            own = draft_kinds.file_weight_bytes(name, d, loaded.path.parent)
            drafts.append(DraftBill(name, d.num_draft_tokens, None, own, draft_kinds.has_distribution(d)))
            continue
        own = (
            m.own_weight_bytes
            if m.own_weight_bytes is not None
            else 0
            if m.shares_target_weights
            else weights_of(m.config, m.dtype, m.quantization, at)
        )
        drafts.append(
            DraftBill(
                name,
                d.num_draft_tokens,
                _cache(m.config, kv_format(res, m.cache_dtype), at),
                own,
                draft_kinds.has_distribution(d),
                m.own_vocab_size,
            )
        )
    return bills_for(res, context, int(config.vocab_size), target_cache, target_bytes, drafts)


def add_server_pools(loaded: Any, bills: list[BillRecord], servers: list[Any]) -> None:
    """The served bill, in place: for each bill whose runner's server says what it
    preallocated (ServerRecord.kv_pool_tokens, e.g. vLLM's num_gpu_blocks x block_size), its
    weights at the served dtype (ServerRecord.served_dtype) and the line "server KV cache
    pool" = pool tokens x gate's per-token KV bytes (gate.measure.kv.cache_model, at the
    served dtype) of the target, plus those of the draft's own model where it runs one
    (vLLM keeps a draft model's KV in the same pool). The per-sequence KV lines then no
    longer coexist at the peak: they live inside the pool. The formula quotes the server's
    own byte count beside gate's. Raises PolicyValueError for a config gate cannot bill."""
    from gate.models.loading import resolve_source

    by_runner = {s.runner: s for s in servers if getattr(s, "kv_pool_tokens", None)}
    if not by_runner:
        return
    policy = loaded.policy
    source = resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
    config = read_config(source, "target.model")
    ctx = config_context(loaded, config)
    for bill in bills:
        server = by_runner.get(bill.draft)
        if server is None:
            continue
        dtype = server.served_dtype or policy.target.dtype
        per_token = _cache(config, kv_format(policy.resources, dtype), "target.model").bytes_per_token
        parts = [f"{per_token:,} B/token (target)"]
        spec = policy.drafts.get(bill.draft)
        drafted = draft_kinds.model_config(bill.draft, spec, ctx) if spec is not None else None
        if drafted is not None:
            own = _cache(drafted.config, kv_format(policy.resources, dtype), f"drafts.{bill.draft}").bytes_per_token
            per_token += own
            parts.append(f"{own:,} B/token (draft model)")
        for line in bill.lines:
            if line.name in ("target KV cache", "draft KV cache"):
                line.coexists_at_peak = False
                line.formula += " (inside the server's pool)"
            elif line.name in ("target weights", "draft weights"):
                was = drafted.dtype if line.name == "draft weights" and drafted is not None else policy.target.dtype
                scale = _DTYPE_BYTES.get(dtype, 0) / _DTYPE_BYTES.get(was, 1) if was != dtype else 0
                if scale:
                    line.bytes = int(round(line.bytes * scale))
                    line.formula += f", at the served dtype {dtype}"
        if drafted is not None and drafted.shares_target_weights:  # the server loads it as a model of its own
            own = weights_of(drafted.config, dtype, "none", f"drafts.{bill.draft}")
            line = next((x for x in bill.lines if x.name == "draft weights"), None)
            if line is None:
                line = BillLine("draft weights", "", 0)
                bill.lines.insert(next(i for i, x in enumerate(bill.lines) if x.name == "target KV cache") + 1, line)
            line.bytes, line.formula = (
                own,
                f"a model of its own to the server (its weights are the target's), at {dtype}",
            )
        said = f"; the server counts {server.kv_pool_bytes:,} B" if server.kv_pool_bytes else ""
        bill.lines.append(
            BillLine(
                SERVER_POOL_LINE,
                f"{server.kv_pool_tokens:,} tokens preallocated x ({' + '.join(parts)}) at {dtype}{said}",
                server.kv_pool_tokens * per_token,
            )
        )


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def config_context(loaded: Any, target_config: Any) -> ConfigContext:
    """What a draft kind reads to cost a draft from configs: the target's config and dtype,
    and a reader for the config of a model the policy names (errors at its YAML path)."""
    from gate.models.loading import resolve_source

    def read(model: str, gguf_file: str | None, yaml_path: str) -> Any:
        return read_config(resolve_source(model, gguf_file, loaded.path.parent, yaml_path), yaml_path)

    return ConfigContext(target_config, loaded.policy.target.dtype, read, loaded.path.parent)


def _longest(plan: Any) -> int:
    """The longest planned prompt (tokens): the workload is built once, by gate.plan.validate."""
    return max(len(p.token_ids) for p in plan.workload.prompts)


def meta_of(config: Any, yaml_path: str) -> torch.nn.Module:
    try:
        return meta_model(config)
    except ConfigError as e:
        raise PolicyValueError(yaml_path, str(e)) from None


def weights_of(config: Any, dtype: str, quantization: str, yaml_path: str) -> int:
    try:
        return estimate_weight_bytes(config, dtype, quantization)
    except ConfigError as e:
        raise PolicyValueError(yaml_path, str(e)) from None


def _cache(config: Any, fmt: KVFormat, yaml_path: str) -> CacheModel:
    try:
        return cache_model(config, fmt)
    except ConfigError as e:
        raise PolicyValueError(yaml_path, str(e)) from None


def config_bills(
    target: Path,
    draft: Path | None,
    dtype: str,
    num_draft_tokens: int,
    context_tokens: int,
    sequences: int,
    resources: Any,
) -> list[BillRecord]:
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
        drafts.append(
            DraftBill("draft", num_draft_tokens, cache_model(dcfg, fmt), estimate_weight_bytes(dcfg, dtype), True)
        )
    res = resources.model_copy(update={"sequences": sequences})
    return bills_for(
        res, context_tokens, int(tcfg.vocab_size), cache_model(tcfg, fmt), estimate_weight_bytes(tcfg, dtype), drafts
    )
