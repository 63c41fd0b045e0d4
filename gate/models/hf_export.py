"""Hugging Face model directories gate writes for engines that cannot read what the policy
names: vLLM has no GGUF loader on CPU, and an early-exit draft is a model of its own to a
server. A directory holds config.json, model.safetensors, the tokenizer files and
generation_config.json, as `save_pretrained` writes them.

GGUF weights are dequantized by transformers (its GGUF loader) and copied into a model
built fresh from the config before saving, so the saved directory carries no GGUF or
quantization state. Written once per source (path, size, mtime), dtype and layer count,
under a cache folder, atomically (a temporary folder renamed into place).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any


def truncated_config(config: Any, num_layers: int) -> Any:
    """A copy of a transformers config with only its first `num_layers` layers."""
    config = copy.deepcopy(config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:num_layers]
    return config


def hf_directory(
    source: Any, dtype: str = "float32", num_layers: int | None = None, cache_dir: str | Path | None = None
) -> Path:
    """A Hugging Face directory of the resolved model `source` (gate.models.loading.ModelSource)
    at weight dtype `dtype` ("float32", "bfloat16", "float16"), or of its first `num_layers`
    decoder layers with its final norm and head (an early-exit draft; None: all layers).
    An `hf_dir` source at all layers is returned as it is. Cached under `cache_dir`
    (default $GATE_CACHE/hf or ~/.cache/gate/hf). Raises ValueError when num_layers is not
    below the model's layer count or the model is not laid out as model.layers; OSError when
    it cannot be written."""
    from gate.models import store
    from gate.models.loading import dequantize, load_config, load_model, load_tokenizer, write_hf_directory

    if source.kind == "hf_dir" and num_layers is None:
        return Path(source.location)
    out = store.export_folder(source, dtype, num_layers, cache_dir)
    if store.complete(out):
        return out
    config = load_config(source)
    total = int(getattr(config, "num_hidden_layers", 0) or 0)
    if num_layers is not None and not 1 <= num_layers < total:
        raise ValueError(
            f"num_layers must be between 1 and {total - 1} (the model has {total} layers), got {num_layers}"
        )
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)  # a folder that cannot be made fails before the work, not after
    # a GGUF is dequantized here; a float32 directory of all its layers is what load_model keeps too
    model = (dequantize if source.gguf_file else load_model)(source, dtype, torch.device("cpu"))
    state = model.state_dict()
    if num_layers is not None:
        config = truncated_config(config, num_layers)
        if not any(k.startswith("model.layers.") for k in state):
            raise ValueError(f"{type(model).__name__} is not laid out as model.layers: gate cannot cut it")
        state = {
            k: v for k, v in state.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers
        }
    write_hf_directory(out, config, state, dtype, load_tokenizer(source))
    return out
