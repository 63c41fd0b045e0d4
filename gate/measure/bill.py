"""The full resident resource bill and the budget statement.

Every line names the allocation, its formula with the numbers filled in, its bytes, and
whether it coexists with the others at the peak of a verification step (PRIMER, "The
resident resource bill"): weights of target and draft (shared storage once), target and
draft caches from each model's own config (gate.measure.kv), the temporary verification
positions (num_draft_tokens + 1 per sequence and branch, plus the draft's proposals),
target logits ((num_draft_tokens + 1) x vocab at the float32 sampling dtype) and the
draft probabilities kept for the residual (a draft with its own tokenizer adds its logits at
its own vocabulary size), declared workspace, graph captures and
communication buffers, and a fragmentation allowance on top of their sum.
Known values at 16 bits: Llama-2-7B 512 KiB per token, Llama-3-8B 128 KiB per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.measure.kv import CacheModel, ConfigError, KVFormat
from gate.records import FALLBACK, BillLine, BillRecord, Budget

SERVER_POOL_LINE = "server KV cache pool"
"""The served bill's line for the KV cache a server preallocated (gate.loop.bill.add_server_pools)."""

SAMPLING_DTYPE_BYTES = 4  # gate (and most samplers) apply the law in float32


@dataclass(frozen=True)
class BillInputs:
    """What a bill is computed from. Bytes throughout; `draft_weight_bytes` counts only
    storage not already billed to the target (an early-exit draft adds 0).
    num_draft_tokens 0 gives the non-speculative fallback's bill."""

    runner: str
    target_cache: CacheModel
    target_weight_bytes: int
    vocab_size: int
    context_tokens: int
    sequences: int = 1
    num_draft_tokens: int = 0
    draft_cache: CacheModel | None = None
    draft_weight_bytes: int = 0
    draft_has_distribution: bool = False
    tree_branches: int = 1
    workspace_bytes: int = 0
    graph_capture_bytes: int = 0
    communication_bytes: int = 0
    fragmentation: float = 0.0
    draft_vocab_size: int | None = None  # a draft with its own tokenizer (cross_tokenizer): its logits' width


def bill_lines(b: BillInputs) -> list[BillLine]:
    """The bill's lines for inputs `b` (see the module docstring)."""
    g, s, t = b.num_draft_tokens, b.sequences, b.context_tokens
    lines = [
        BillLine("target weights", "parameters + buffers, shared storage once", b.target_weight_bytes),
        BillLine("target KV cache", b.target_cache.formula(t, s), b.target_cache.bytes(t, s)),
    ]
    if g:
        lines.append(BillLine("draft weights", "parameters + buffers not shared with the target", b.draft_weight_bytes))
        if b.draft_cache is not None:
            lines.append(BillLine("draft KV cache", b.draft_cache.formula(t, s), b.draft_cache.bytes(t, s)))
        per_target, per_draft = b.target_cache.bytes_per_token, b.draft_cache.bytes_per_token if b.draft_cache else 0
        lines.append(
            BillLine(
                "verification positions",
                f"({g} + 1) positions x {b.tree_branches} branches x {per_target} B/token (target) + {g} x "
                f"{per_draft} B/token "
                f"(draft proposals), x {s} seq",
                ((g + 1) * b.tree_branches * per_target + g * per_draft) * s,
            )
        )
    lines.append(
        BillLine(
            "target logits",
            f"({g} + 1) positions x {b.tree_branches} branches x {b.vocab_size} vocab x {SAMPLING_DTYPE_BYTES} B x "
            f"{s} seq",
            (g + 1) * b.tree_branches * b.vocab_size * SAMPLING_DTYPE_BYTES * s,
        )
    )
    if g and b.draft_has_distribution:
        lines.append(
            BillLine(
                "draft probabilities",
                f"{g} positions x {b.tree_branches} branches x {b.vocab_size} vocab x {SAMPLING_DTYPE_BYTES} B x {s} "
                "seq",
                g * b.tree_branches * b.vocab_size * SAMPLING_DTYPE_BYTES * s,
            )
        )
    if g and b.draft_vocab_size:  # the draft samples over its own vocabulary before translating (cross_tokenizer)
        lines.append(
            BillLine(
                "draft logits",
                f"{g} positions x {b.tree_branches} branches x {b.draft_vocab_size} draft vocab x "
                f"{SAMPLING_DTYPE_BYTES} B x {s} seq",
                g * b.tree_branches * b.draft_vocab_size * SAMPLING_DTYPE_BYTES * s,
            )
        )
    for name, value in (
        ("workspace", b.workspace_bytes),
        ("graph captures", b.graph_capture_bytes),
        ("communication buffers", b.communication_bytes),
    ):
        if value:
            lines.append(BillLine(name, "declared in the policy", value))
    if b.fragmentation:
        subtotal = sum(line.bytes for line in lines)
        lines.append(
            BillLine(
                "fragmentation allowance", f"{b.fragmentation:g} x {subtotal} B", int(round(b.fragmentation * subtotal))
            )
        )
    return lines


def build_bill(b: BillInputs, capacity_bytes: int | None = None) -> BillRecord:
    """The bill at `b.sequences` sequences of `b.context_tokens` tokens, and, given the
    device capacity, the budget statement: headroom, bytes one more sequence costs, how many
    more sequences fit and how much more context per sequence."""
    record = BillRecord(b.runner, b.sequences, b.context_tokens, bill_lines(b))
    if capacity_bytes is not None:
        total = record.total_bytes
        one_more = _total(b, sequences=b.sequences + 1) - total
        one_token = _total(b, context_tokens=b.context_tokens + 1) - total
        headroom = capacity_bytes - total
        record.budget = Budget(
            capacity_bytes=capacity_bytes,
            headroom_bytes=headroom,
            bytes_per_extra_sequence=one_more,
            extra_sequences=max(0, headroom // one_more) if one_more > 0 else 0,
            bytes_per_extra_context_token=one_token,
            extra_context_tokens=max(0, headroom // one_token) if one_token > 0 else 0,
        )
    return record


def _total(b: BillInputs, **change: Any) -> int:
    from dataclasses import replace

    return sum(line.bytes for line in bill_lines(replace(b, **change)) if line.coexists_at_peak)


# ---------------------------------------------------------------------------------------
# Assembling the bills of a policy's fallback and drafts (gate check, gate bill).


@dataclass(frozen=True)
class DraftBill:
    """What the bill needs of one draft: its cache (None: no cache) and the weight bytes it
    adds beyond the target's; `vocab_size`: the width of its own logits when it has its own
    tokenizer (a cross_tokenizer draft; None: it samples on the target's vocabulary)."""

    name: str
    num_draft_tokens: int
    cache: CacheModel | None
    own_weight_bytes: int
    has_distribution: bool
    vocab_size: int | None = None


def kv_format(resources: Any, model_dtype: str) -> KVFormat:
    """The cache format the policy declares (auto: the model's own dtype)."""
    dtype = model_dtype if resources.kv_dtype == "auto" else resources.kv_dtype
    return KVFormat(dtype, resources.kv_scale_group)


def bills_for(
    resources: Any,
    context_tokens: int,
    vocab_size: int,
    target_cache: CacheModel,
    target_weight_bytes: int,
    drafts: list[DraftBill],
) -> list[BillRecord]:
    """The fallback's bill and every draft's, with the budget statement when the policy
    declares a capacity. `resources`: the policy's ResourcesSpec; bytes and tokens throughout."""
    capacity = resources.bytes_of("capacity") if resources.capacity else None
    common = dict(
        target_cache=target_cache,
        target_weight_bytes=target_weight_bytes,
        vocab_size=vocab_size,
        context_tokens=context_tokens,
        sequences=resources.sequences,
        tree_branches=resources.tree_branches,
        workspace_bytes=resources.bytes_of("workspace"),
        graph_capture_bytes=resources.bytes_of("graph_captures"),
        communication_bytes=resources.bytes_of("communication_buffers"),
        fragmentation=resources.fragmentation,
    )
    out = [build_bill(BillInputs(FALLBACK, **common), capacity)]
    for d in drafts:
        out.append(
            build_bill(
                BillInputs(
                    d.name,
                    num_draft_tokens=d.num_draft_tokens,
                    draft_cache=d.cache,
                    draft_weight_bytes=d.own_weight_bytes,
                    draft_has_distribution=d.has_distribution,
                    draft_vocab_size=d.vocab_size,
                    **common,
                ),
                capacity,
            )
        )
    return out


def meta_model(config: Any) -> Any:
    """The causal LM (torch.nn.Module) of `config` built on the meta device (no memory).
    Raises ConfigError for a config transformers cannot build as a causal LM."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model: torch.nn.Module = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
            return model
    except Exception as e:  # noqa: BLE001 - any failure means: not a causal LM gate can bill
        raise ConfigError(
            f"cannot build a causal LM from this config ({type(config).__name__}): {type(e).__name__}: {e}"
        ) from None


def estimate_weight_bytes(config: Any, dtype: str, quantization: str = "none") -> int:
    """Weight bytes of a causal LM built from `config` on the meta device (tied tensors once).

    int8_dynamic: every nn.Linear weight at 1 byte plus a per-tensor scale and zero point
    (16 bytes), biases and every other tensor at float32, as torch dynamic quantization keeps them.
    Raises ConfigError for a config that is not a causal LM."""
    import torch

    from gate.core.dtypes import DTYPES

    model = meta_model(config)
    size = torch.empty(0, dtype=DTYPES[dtype]).element_size()
    buffers: int = sum(b.numel() * b.element_size() for b in model.buffers())  # e.g. rotary inv_freq, kept float32
    if quantization != "int8_dynamic":
        return int(sum(p.numel() for p in model.parameters()) * size + buffers)
    # int8 Linear weights (a tied head gets its own int8 copy; the embedding stays float32)
    total: int = 0
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
