"""Where gate keeps what it builds from model files: Hugging Face directories (dequantized
GGUF weights, early-exit cuts, exports for engines that cannot read GGUF) and the tokenizers
and configs built from a GGUF's metadata. Keys name the source file by path, size and mtime
and the transformers version (what transformers reads from a GGUF may change with it).
Nothing here loads a model; gate.models.loading and gate.models.hf_export read and write.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("GATE_CACHE") or Path.home() / ".cache" / "gate")
DEFAULT_CACHE = ROOT / "hf"  # Hugging Face directories
METADATA_CACHE = ROOT / "gguf-metadata"  # tokenizers and configs built from GGUF metadata
# Files under the system's temporary folder are temporary by nature (tests write tiny GGUFs there): what is
# built from them is not kept, so the caches hold only models that stay.
UNCACHED_ROOTS: tuple[str, ...] = (tempfile.gettempdir(),)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def versioned(text: str) -> str:
    """First 16 hex digits of sha256 over `text` and the transformers version."""
    import transformers

    return hashlib.sha256(f"{text}|transformers {transformers.__version__}".encode()).hexdigest()[:16]


def kept(location: str) -> bool:
    """Whether what is built from a model at `location` is worth keeping (not under UNCACHED_ROOTS)."""
    path = Path(location).resolve()
    return not any(path.is_relative_to(Path(root).resolve()) for root in UNCACHED_ROOTS)


def metadata_folder(location: str, gguf_file: str, size: int, mtime_ns: int, what: str) -> Path:
    """Where `what` ("tokenizer" or "config") of the GGUF file `location`/`gguf_file` (of that
    size and mtime) is kept once built from its metadata."""
    path = Path(location) / gguf_file
    return METADATA_CACHE / f"{Path(gguf_file).stem}.{versioned(f'{path.resolve()}|{size}|{mtime_ns}')}.{what}"


def export_folder(source: Any, dtype: str, num_layers: int | None, cache_dir: str | Path | None = None) -> Path:
    """Where the Hugging Face directory of model `source` (gate.models.loading.ModelSource) at
    `dtype`, cut to its first `num_layers` layers (None: all), is kept (under `cache_dir`,
    default DEFAULT_CACHE)."""
    folder = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    path = Path(source.location) / (source.gguf_file or "config.json")
    st = path.stat()
    key = versioned(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{dtype}|{num_layers}")
    stem = Path(source.gguf_file or source.location).stem
    return folder / (f"{stem}.{dtype}" + (f".first{num_layers}" if num_layers else "") + f".{key}")


def complete(folder: Path) -> bool:
    """Whether a Hugging Face directory holds its config and weights."""
    return (folder / "config.json").is_file() and any((folder / f).is_file() for f in WEIGHT_FILES)


def save_atomically(folder: Path, save: Callable[[Path], Any], must: bool = False) -> None:
    """save(a temporary folder beside `folder`), then that folder renamed to `folder`, so no
    reader sees half a directory. Another process that wrote it first wins. A cache that
    cannot be written is skipped silently, unless `must` (then OSError is raised)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    except OSError:
        if must:
            raise
        return
    try:
        save(tmp)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process wrote it first
            if must and not folder.exists():
                raise
    except OSError:
        if must:
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
