"""How many bytes a model's cache holds per sequence, layer by layer, from its config.

A conventional attention layer keeps 2 (K and V) x KV heads x head_dim scalars per
retained token (PRIMER, "The resident resource bill"); KV heads, not query heads, for
grouped-query and multi-query attention; head_dim from the config when it states one.
What changes the estimate, per layer:
- sliding-window layers retain at most `window` tokens (transformers' dynamic cache keeps
  window - 1 between steps: `retained = min(tokens, window - 1)`, which is what its
  tensors hold); models may alternate local and global layers (`layer_types`);
- multi-head latent attention (MLA, DeepSeek-V2/V3) keeps one compressed latent of
  kv_lora_rank + qk_rope_head_dim scalars per token, as vLLM and SGLang store it;
- recurrent / state-space layers (Mamba, gated delta-net) keep a fixed state per sequence,
  independent of length;
- quantized KV (int8, fp8, int4) costs its scalar size plus scale tensors: one scale (and
  one zero point for integer formats) per `group` scalars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KV_DTYPE_BITS = {"float32": 32, "bfloat16": 16, "float16": 16, "fp8": 8, "int8": 8, "int4": 4}


class ConfigError(ValueError):
    """A model config that does not describe a cache gate can bill."""


@dataclass(frozen=True)
class KVFormat:
    """The scalar format of cached keys and values.

    dtype: float32, bfloat16, float16, fp8, int8 or int4. For the quantized ones,
    `group_size` scalars share one scale of `scale_bytes` (and, for int8/int4, one zero
    point of the same size); group_size None means one group per head vector (head_dim)."""

    dtype: str = "bfloat16"
    group_size: int | None = None
    scale_bytes: int = 2

    @property
    def quantized(self) -> bool:
        return self.dtype in ("fp8", "int8", "int4")

    def vector_bytes(self, n: int) -> float:
        """Bytes of one cached vector of n scalars, scales included."""
        data = n * KV_DTYPE_BITS[self.dtype] / 8
        if not self.quantized:
            return data
        groups = -(-n // (self.group_size or n))
        per_group = self.scale_bytes * (2 if self.dtype.startswith("int") else 1)
        return data + groups * per_group


@dataclass(frozen=True)
class LayerCache:
    """One layer's cache. kind: full, sliding, latent or recurrent (or hybrid: attention plus state).

    token_bytes: bytes per retained token (0 for purely recurrent layers);
    window: retained-token cap of sliding layers; state_bytes: fixed bytes per sequence."""

    kind: str
    token_bytes: float
    window: int | None = None
    state_bytes: int = 0

    def retained(self, tokens: int) -> int:
        return min(tokens, self.window - 1) if self.window else tokens

    def bytes(self, tokens: int) -> float:
        return self.token_bytes * self.retained(tokens) + self.state_bytes


@dataclass(frozen=True)
class CacheModel:
    """Every layer's cache for one model: bytes for `tokens` retained tokens per sequence."""

    layers: tuple[LayerCache, ...]
    fmt: KVFormat
    num_kv_heads: int
    head_dim: int

    def bytes(self, tokens: int, sequences: int = 1) -> int:
        """Cache bytes for `sequences` sequences of `tokens` tokens each."""
        return int(round(sum(layer.bytes(tokens) for layer in self.layers) * sequences))

    @property
    def bytes_per_token(self) -> int:
        """Bytes per token while no window is full (what one more token costs at short context)."""
        return int(round(sum(layer.token_bytes for layer in self.layers)))

    def formula(self, tokens: int, sequences: int = 1) -> str:
        """The bill line's formula, grouped by layer kind, with the numbers filled in."""
        parts = []
        for kind in ("full", "sliding", "latent", "recurrent", "hybrid"):
            group = [layer for layer in self.layers if layer.kind == kind]
            if not group:
                continue
            one = group[0]
            if kind in ("full", "hybrid"):
                text = (
                    f"{len(group)} layers x 2 x {self.num_kv_heads} KV heads x {self.head_dim} head_dim x "
                    f"{self._scalar()} x {tokens} tokens"
                )
                if kind == "hybrid":
                    text += f" + {len(group)} x {one.state_bytes} B state"
            elif kind == "sliding":
                text = (
                    f"{len(group)} sliding layers x 2 x {self.num_kv_heads} KV heads x {self.head_dim} head_dim x "
                    f"{self._scalar()} x min({tokens}, {one.window} - 1) tokens"
                )
            elif kind == "latent":
                text = f"{len(group)} MLA layers x {one.token_bytes:g} B latent x {tokens} tokens"
            else:
                text = f"{len(group)} recurrent layers x {one.state_bytes} B state"
            parts.append(text)
        return " + ".join(parts) + f", x {sequences} seq"

    def _scalar(self) -> str:
        if not self.fmt.quantized:
            return f"{KV_DTYPE_BITS[self.fmt.dtype] // 8} B"
        vector = self.fmt.vector_bytes(self.head_dim)
        return f"{self.fmt.dtype} ({vector:g} B per {self.head_dim}-vector with scales)/{self.head_dim}"


def _layer_types(config: Any, n: int) -> list[str]:
    types = getattr(config, "layer_types", None)
    if types:
        if len(types) != n:
            raise ConfigError(f"layer_types lists {len(types)} layers but num_hidden_layers is {n}")
        return list(types)
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) is not False:
        return ["sliding_attention"] * n
    return ["full_attention"] * n


def _recurrent_state_bytes(config: Any, scalar_bytes: int) -> int:
    """Fixed per-sequence state of one recurrent layer: Mamba (conv + SSM state) or gated
    delta-net (conv + recurrent matrix per value head)."""
    hidden = getattr(config, "hidden_size", None)
    if getattr(config, "mamba_d_state", None) and getattr(config, "mamba_expand", None) and hidden:
        d_inner = config.mamba_expand * hidden
        d_conv = getattr(config, "mamba_d_conv", 4)
        return int(d_inner * (d_conv + config.mamba_d_state) * scalar_bytes)
    if getattr(config, "linear_num_value_heads", None) and getattr(config, "linear_key_head_dim", None):
        v_heads, k_dim, v_dim = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
        k_heads = getattr(config, "linear_num_key_heads", v_heads)
        conv = (2 * k_heads * k_dim + v_heads * v_dim) * getattr(config, "linear_conv_kernel_dim", 4)
        return int((v_heads * k_dim * v_dim + conv) * scalar_bytes)
    raise ConfigError(
        "config has recurrent (linear_attention / mamba) layers but no state dimensions gate knows "
        "(mamba_d_state + mamba_expand, or linear_num_value_heads + linear_key_head_dim)"
    )


def cache_model(config: Any, fmt: KVFormat | str = "bfloat16") -> CacheModel:
    """The per-layer cache of a transformers config (or any object with its attributes).

    Raises ConfigError for missing or zero layers or heads, KV heads that do not divide the
    query heads, an unknown layer type, or recurrent layers without state dimensions."""
    fmt = KVFormat(fmt) if isinstance(fmt, str) else fmt
    if fmt.dtype not in KV_DTYPE_BITS:
        raise ConfigError(f"unknown KV dtype {fmt.dtype!r}; known: {', '.join(KV_DTYPE_BITS)}")
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
            raise ConfigError(
                f"config states no head_dim and hidden_size ({hidden}) is not a multiple of num_attention_heads "
                f"({heads})"
            )
        head_dim = hidden // heads
    attention = 2 * kv_heads * fmt.vector_bytes(head_dim)
    window = getattr(config, "sliding_window", None)
    latent = getattr(config, "kv_lora_rank", None)
    state_scalar = 4 if fmt.dtype == "float32" else 2
    out = []
    for t in _layer_types(config, int(layers)):
        if latent:
            out.append(LayerCache("latent", fmt.vector_bytes(latent + (getattr(config, "qk_rope_head_dim", 0) or 0))))
        elif t in ("full_attention", "attention", "global_attention"):
            out.append(LayerCache("full", attention))
        elif t in ("sliding_attention", "local_attention", "chunked_attention"):
            if not window:
                raise ConfigError("config has sliding_attention layers but no sliding_window")
            out.append(LayerCache("sliding", attention, window=int(window)))
        elif t in ("linear_attention", "mamba", "recurrent"):
            out.append(LayerCache("recurrent", 0.0, state_bytes=_recurrent_state_bytes(config, state_scalar)))
        elif t == "hybrid":
            out.append(LayerCache("hybrid", attention, state_bytes=_recurrent_state_bytes(config, state_scalar)))
        else:
            raise ConfigError(f"unknown layer type {t!r} in layer_types")
    return CacheModel(tuple(out), fmt, int(kv_heads), int(head_dim))


def sliding_window(config: Any) -> int | None:
    """The smallest sliding window among a model's layers (tokens); None without one, or
    for a layout gate cannot read (the bill reports that). gate's in-process loop rolls the
    target's cache back after rejected proposals, which transformers' sliding-window cache
    cannot do once its window is full: a workload must stay below it."""
    try:
        windows = [layer.window for layer in cache_model(config).layers if layer.window]
    except ConfigError:
        return None
    return min(windows) if windows else None
