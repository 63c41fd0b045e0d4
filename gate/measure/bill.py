"""The full resident resource bill and the budget statement.

Every line names the allocation, its formula with the numbers filled in, its bytes, and
whether it coexists with the others at the peak of a verification step (PRIMER, "The
resident resource bill"): weights of target and draft (shared storage once), target and
draft caches from each model's own config (gate.measure.kv), the temporary verification
positions (num_draft_tokens + 1 per sequence and branch, plus the draft's proposals),
target logits ((num_draft_tokens + 1) x vocab at the float32 sampling dtype) and the
draft probabilities kept for the residual, declared workspace, graph captures and
communication buffers, and a fragmentation allowance on top of their sum.
Known values at 16 bits: Llama-2-7B 512 KiB per token, Llama-3-8B 128 KiB per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from gate.measure.kv import CacheModel
from gate.records import BillLine, BillRecord, Budget

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
        lines.append(BillLine(
            "verification positions",
            f"({g} + 1) positions x {b.tree_branches} branches x {per_target} B/token (target) + {g} x {per_draft} B/token "
            f"(draft proposals), x {s} seq",
            ((g + 1) * b.tree_branches * per_target + g * per_draft) * s,
        ))
    lines.append(BillLine(
        "target logits",
        f"({g} + 1) positions x {b.tree_branches} branches x {b.vocab_size} vocab x {SAMPLING_DTYPE_BYTES} B x {s} seq",
        (g + 1) * b.tree_branches * b.vocab_size * SAMPLING_DTYPE_BYTES * s,
    ))
    if g and b.draft_has_distribution:
        lines.append(BillLine(
            "draft probabilities",
            f"{g} positions x {b.tree_branches} branches x {b.vocab_size} vocab x {SAMPLING_DTYPE_BYTES} B x {s} seq",
            g * b.tree_branches * b.vocab_size * SAMPLING_DTYPE_BYTES * s,
        ))
    for name, value in (("workspace", b.workspace_bytes), ("graph captures", b.graph_capture_bytes),
                        ("communication buffers", b.communication_bytes)):
        if value:
            lines.append(BillLine(name, "declared in the policy", value))
    if b.fragmentation:
        subtotal = sum(line.bytes for line in lines)
        lines.append(BillLine("fragmentation allowance", f"{b.fragmentation:g} x {subtotal} B", int(round(b.fragmentation * subtotal))))
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


def _total(b: BillInputs, **change: int) -> int:
    from dataclasses import replace

    return sum(line.bytes for line in bill_lines(replace(b, **change)) if line.coexists_at_peak)
