"""Writing GGUF files gate derives from a policy's models: an early-exit draft for
llama.cpp (the target's first k layers with its own final norm and output head), so
llama-server can run the same draft gate runs in-process.

GGUF layout: llama.cpp's gguf-py (the `gguf` package), GGUFReader / GGUFWriter. Tensors are
copied byte for byte (quantized blocks stay as they are); metadata is copied with its
declared types, and `<arch>.block_count` is set to k.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def truncated_gguf(source: str | Path, num_layers: int, cache_dir: str | Path) -> Path:
    """The GGUF of `source`'s first `num_layers` transformer blocks (shared embedding, final
    norm and head), written once under `cache_dir` (named by the source's path, size and
    mtime, and k) and reused after. Raises ValueError when the source has no block_count or
    `num_layers` is not below it; OSError when it cannot be read or written."""
    import gguf

    src = Path(source)
    st = src.stat()
    key = hashlib.sha256(f"{src.resolve()}|{st.st_size}|{st.st_mtime_ns}|{num_layers}".encode()).hexdigest()[:16]
    out = Path(cache_dir) / f"{src.stem}.first{num_layers}.{key}.gguf"
    if out.is_file():
        return out
    reader = gguf.GGUFReader(str(src))
    arch = str(reader.get_field("general.architecture").contents())
    blocks_key = f"{arch}.block_count"
    blocks = reader.get_field(blocks_key)
    if blocks is None:
        raise ValueError(f"{src} has no {blocks_key}: not a transformer GGUF gate can truncate")
    total = int(blocks.contents())
    if not 1 <= num_layers < total:
        raise ValueError(f"num_layers {num_layers} must be between 1 and {total - 1} (the target has {total} blocks)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), arch=arch, endianess=reader.endianess)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes the header and architecture itself
        if name == blocks_key:
            writer.add_uint32(name, num_layers)
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, f.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) >= num_layers:
            continue
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out
