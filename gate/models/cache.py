"""KV cache helpers: a fresh cache, its length, and the bytes its tensors really hold."""

from __future__ import annotations

from typing import Any, Literal

import torch


def new_cache(config: Any) -> Any:
    """An empty transformers DynamicCache laid out for `config`."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:  # older transformers without the config argument
        return DynamicCache()


def cache_tensor_bytes(cache: Any) -> int:
    """Sum of numel x element size over every key and value tensor the cache holds (bytes)."""
    if cache is None:
        return 0
    total = 0
    for t in _cache_tensors(cache):
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    return total


def _cache_tensors(cache: Any) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is not None:
        out = []
        for layer in layers:
            out += [getattr(layer, "keys", None), getattr(layer, "values", None)]
        return out
    return list(getattr(cache, "key_cache", [])) + list(getattr(cache, "value_cache", []))


def crop_to(cache: Any, length: int) -> None:
    """Drop cached positions beyond `length` (rejected proposals). A negative argument to
    DynamicCache.crop means 'remove that many', which every transformers release accepts.
    A cache recording its past (record_past) is cropped even with nothing to drop: crop(0)
    restricts its sliding-window layers back to their window."""
    extra = int(cache.get_seq_length()) - length
    if extra > 0:
        cache.crop(-extra)
    elif _recording(cache):
        cache.crop(0)


def record_past(cache: Any) -> None:
    """After a prefill: make the cache's fixed-size layers (sliding-window attention, linear
    attention) keep the states a rejected proposal must be rolled back to, until crop_to
    restricts them again (transformers' activate_past_recording, which its own assisted
    generation calls after the prefill: before it, a long prefill would keep every state).
    Without it, cropping a sliding layer past its window raises. Nothing for a cache without
    such layers, or a transformers release without the method."""
    activate = getattr(cache, "activate_past_recording", None)
    if activate is not None:
        activate()


def _recording(cache: Any) -> bool:
    return any(getattr(layer, "record_past", False) for layer in getattr(cache, "layers", []))


def forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    cache: Any = None,
    logits_to_keep: int = 0,
    hidden: bool | Literal["all"] = False,
) -> Any:
    """Logits [batch, positions, V] of a causal LM, feeding `cache` when given.

    transformers renamed `past_key_values` to `cache`; the model's signature decides.
    logits_to_keep=0 keeps every position. hidden=True returns (logits, hidden states)
    instead, the hidden states [batch, positions, H] being the input of the model's output
    embeddings (lm_head) at the kept positions: the last layer's state after the final norm,
    captured by a forward hook, so no extra forward and no per-layer states are kept.
    hidden="all": the same states at every fed position, whatever logits_to_keep keeps (the
    output of the decoder's final norm, `model.get_decoder().norm`; ValueError without one)."""
    kwargs: dict[str, Any] = {"use_cache": cache is not None}
    if cache is not None:
        kwargs[cache_kwarg(type(model))] = cache
    if logits_to_keep:
        kwargs["logits_to_keep"] = logits_to_keep
    if not hidden:
        return model(input_ids=input_ids, **kwargs).logits
    seen: list[torch.Tensor] = []
    if hidden == "all":
        norm = getattr(model.get_decoder(), "norm", None)
        if norm is None:
            raise ValueError(f"{type(model).__name__} has no final norm (model.norm) to read every hidden state from")
        handle = norm.register_forward_hook(lambda m, args, out: seen.append(out))
    else:
        handle = model.get_output_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0]))
    try:
        logits = model(input_ids=input_ids, **kwargs).logits
    finally:
        handle.remove()
    return logits, seen[-1]


_KWARG: dict[type, str] = {}


def cache_kwarg(cls: type) -> str:
    """The name a model class's forward takes its KV cache by: "cache" (newer transformers) or "past_key_values"."""
    if cls not in _KWARG:
        import inspect

        params = inspect.signature(cls.forward).parameters
        _KWARG[cls] = "cache" if "cache" in params else "past_key_values"
    return _KWARG[cls]
