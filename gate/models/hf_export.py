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
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_CACHE = Path(os.environ.get("GATE_CACHE") or Path.home() / ".cache" / "gate") / "hf"
METADATA_CACHE = DEFAULT_CACHE.parent / "gguf-metadata"  # tokenizers and configs built from GGUF metadata (gate.models.loading)


def _versioned(text: str) -> str:
    """First 16 hex digits of sha256 over `text` and the transformers version: what
    transformers reads from a GGUF may change with it."""
    import transformers

    return hashlib.sha256(f"{text}|transformers {transformers.__version__}".encode()).hexdigest()[:16]


# Files under the system's temporary folder are temporary by nature (tests write tiny GGUFs there): what is built
# from them is not kept, so the caches hold only models that stay.
UNCACHED_ROOTS: tuple[str, ...] = (tempfile.gettempdir(),)


def kept(location: str) -> bool:
    """Whether what is built from a model at `location` is worth keeping in the caches (not
    under UNCACHED_ROOTS)."""
    path = Path(location).resolve()
    return not any(path.is_relative_to(Path(root).resolve()) for root in UNCACHED_ROOTS)


def metadata_folder(location: str, gguf_file: str, size: int, mtime_ns: int, what: str) -> Path:
    """Where `what` ("tokenizer" or "config") of the GGUF file `location`/`gguf_file` (of that
    size and mtime) is kept once built from its metadata."""
    path = Path(location) / gguf_file
    return METADATA_CACHE / f"{Path(gguf_file).stem}.{_versioned(f'{path.resolve()}|{size}|{mtime_ns}')}.{what}"


def truncated_config(config: Any, num_layers: int) -> Any:
    """A copy of a transformers config with only its first `num_layers` layers."""
    config = copy.deepcopy(config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:num_layers]
    return config


def _key(source: Any, dtype: str, num_layers: int | None) -> str:
    path = Path(source.location) / (source.gguf_file or "config.json")
    st = path.stat()
    return _versioned(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{dtype}|{num_layers}")


def hf_directory(source: Any, dtype: str = "float32", num_layers: int | None = None,
                 cache_dir: str | Path | None = None) -> Path:
    """A Hugging Face directory of the resolved model `source` (gate.models.loading.ModelSource)
    at weight dtype `dtype` ("float32", "bfloat16", "float16"), or of its first `num_layers`
    decoder layers with its final norm and head (an early-exit draft; None: all layers).
    An `hf_dir` source at all layers is returned as it is. Cached under `cache_dir`
    (default $GATE_CACHE/hf or ~/.cache/gate/hf). Raises ValueError when num_layers is not
    below the model's layer count or the model is not laid out as model.layers; OSError when
    it cannot be written."""
    from transformers import AutoModelForCausalLM

    from gate.models.loading import DTYPES, _quiet, dequantize, load_config, load_model, load_tokenizer

    if source.kind == "hf_dir" and num_layers is None:
        return Path(source.location)
    folder = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    stem = Path(source.gguf_file or source.location).stem
    out = folder / (f"{stem}.{dtype}" + (f".first{num_layers}" if num_layers else "") + f".{_key(source, dtype, num_layers)}")
    if (out / "config.json").is_file() and any((out / f).is_file() for f in ("model.safetensors",
                                                                           "model.safetensors.index.json")):
        return out
    config = load_config(source)
    total = int(getattr(config, "num_hidden_layers", 0) or 0)
    if num_layers is not None and not 1 <= num_layers < total:
        raise ValueError(f"num_layers must be between 1 and {total - 1} (the model has {total} layers), got {num_layers}")
    import torch

    folder.mkdir(parents=True, exist_ok=True)  # a folder that cannot be made fails before the work, not after
    # a GGUF is dequantized here, once (load_model reads what this writes); other sources load as they are
    model = (dequantize if source.gguf_file else load_model)(source, dtype, torch.device("cpu"))
    state = model.state_dict()
    if num_layers is not None:
        config = truncated_config(config, num_layers)
        if not any(k.startswith("model.layers.") for k in state):
            raise ValueError(f"{type(model).__name__} is not laid out as model.layers: gate cannot cut it")
        state = {k: v for k, v in state.items()
                 if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers}
    config.dtype = DTYPES[dtype]
    with torch.device("cpu"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not getattr(config, "tie_word_embeddings", False)]
    if missing or unexpected:
        raise ValueError(f"the weights do not fit a fresh {type(fresh).__name__}: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=folder))
    try:
        with _quiet():
            fresh.save_pretrained(tmp, safe_serialization=True)
        load_tokenizer(source).save_pretrained(tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # another process wrote it first
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
