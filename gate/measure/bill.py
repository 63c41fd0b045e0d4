"""The resident resource bill (first slice): weights, KV caches, verification slots, logits.

KV cache bytes of a conventional decoder (PRIMER, "The resident resource bill"):
    2 (K and V) x layers x KV heads x head_dim x bytes per scalar x tokens x sequences
with KV heads, not query heads (grouped-query / multi-query attention), and head_dim
from the config when it states one (else hidden_size / num_attention_heads).
Known values at 16 bits: Llama-2-7B 512 KiB per token, Llama-3-8B 128 KiB per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.records import BillLine, BillRecord

SAMPLING_DTYPE_BYTES = 4  # gate (and most samplers) apply the law in float32


class ConfigError(ValueError):
    """A model config that does not describe a KV cache gate can bill."""


@dataclass(frozen=True)
class KVGeometry:
    """What one token's KV cache costs: 2 x num_layers x num_kv_heads x head_dim x bytes_per_scalar."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    bytes_per_scalar: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_scalar

    def formula(self, tokens: int, sequences: int = 1) -> str:
        return (f"2 x {self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim} head_dim x "
                f"{self.bytes_per_scalar} B x {tokens} tokens x {sequences} seq")


def kv_geometry(config: Any, bytes_per_scalar: int) -> KVGeometry:
    """KV geometry from a transformers config (or any object with the same attributes).

    Raises ConfigError when layers or heads are missing or zero, or when the KV heads do
    not divide the query heads."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not layers or not heads or layers < 0 or heads < 0:
        raise ConfigError(f"config needs positive num_hidden_layers and num_attention_heads (got {layers}, {heads})")
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if kv_heads < 1 or heads % kv_heads:
        raise ConfigError(f"num_key_value_heads ({kv_heads}) must divide num_attention_heads ({heads})")
    head_dim = getattr(config, "head_dim", None)
    if not head_dim:
        hidden = getattr(config, "hidden_size", None)
        if not hidden or hidden % heads:
            raise ConfigError(f"config states no head_dim and hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})")
        head_dim = hidden // heads
    return KVGeometry(int(layers), int(kv_heads), int(head_dim), int(bytes_per_scalar))


def build_bill(
    draft: str,
    target_geometry: KVGeometry,
    target_weight_bytes: int,
    vocab_size: int,
    context_tokens: int,
    num_draft_tokens: int,
    draft_geometry: KVGeometry | None,
    draft_weight_bytes: int,
    draft_has_distribution: bool,
    sequences: int = 1,
) -> BillRecord:
    """Predicted resident bytes at the peak of one verification step.

    context_tokens: the longest committed sequence (prompt + max_new_tokens).
    num_draft_tokens = 0 gives the fallback's bill (no draft, one position per step).
    draft_weight_bytes: bytes not already counted in the target (shared weights once).
    Logits are counted at the float32 sampling dtype: (num_draft_tokens + 1) x vocab for
    the target, num_draft_tokens x vocab of draft probabilities kept for the residual.
    """
    gamma = num_draft_tokens
    g = target_geometry
    lines = [
        BillLine("target weights", "parameters + buffers, shared storage once", target_weight_bytes),
        BillLine("target KV cache", g.formula(context_tokens, sequences), g.bytes_per_token * context_tokens * sequences),
    ]
    if gamma:
        lines.append(BillLine("draft weights", "parameters + buffers not shared with the target", draft_weight_bytes))
        if draft_geometry is not None:
            dg = draft_geometry
            lines.append(BillLine("draft KV cache", dg.formula(context_tokens, sequences), dg.bytes_per_token * context_tokens * sequences))
        lines.append(BillLine(
            "verification positions",
            f"({gamma} + 1) positions x {g.bytes_per_token} B/token (target KV) x {sequences} seq",
            (gamma + 1) * g.bytes_per_token * sequences,
        ))
    lines.append(BillLine(
        "target logits",
        f"({gamma} + 1) positions x {vocab_size} vocab x {SAMPLING_DTYPE_BYTES} B x {sequences} seq",
        (gamma + 1) * vocab_size * SAMPLING_DTYPE_BYTES * sequences,
    ))
    if gamma and draft_has_distribution:
        lines.append(BillLine(
            "draft probabilities",
            f"{gamma} positions x {vocab_size} vocab x {SAMPLING_DTYPE_BYTES} B x {sequences} seq",
            gamma * vocab_size * SAMPLING_DTYPE_BYTES * sequences,
        ))
    return BillRecord(draft, sequences, context_tokens, lines)
