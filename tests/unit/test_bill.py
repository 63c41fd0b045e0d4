"""The resident resource bill: KV formulas on known figures, layer kinds (sliding windows,
alternating local/global, MLA latents, recurrent state), quantized KV, the real cache tensors
of tiny models, the bill's lines and the budget statement, and bad configs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gate.measure.kv import ConfigError, KVFormat, cache_model

KIB = 1024


def cfg(**kw):
    return SimpleNamespace(**kw)


LLAMA2_7B = cfg(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, hidden_size=4096)
LLAMA3_8B = cfg(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096)
SMOLLM2 = cfg(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576, head_dim=64)


def test_llama2_7b_is_512_kib_per_token_at_16_bits():
    assert cache_model(LLAMA2_7B, "float16").bytes_per_token == 512 * KIB


def test_llama3_8b_uses_kv_heads_not_query_heads():
    assert cache_model(LLAMA3_8B, "bfloat16").bytes_per_token == 128 * KIB


def test_explicit_head_dim_wins_over_hidden_over_heads():
    c = cfg(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, hidden_size=32, head_dim=16)
    assert cache_model(c, "bfloat16").bytes_per_token == 2 * 2 * 1 * 16 * 2


def test_mla_latent_and_recurrent_state():
    deepseek = cfg(num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, head_dim=64, hidden_size=7168,
                   kv_lora_rank=512, qk_rope_head_dim=64)
    assert cache_model(deepseek, "bfloat16").bytes_per_token == 61 * (512 + 64) * 2
    jamba = cfg(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, hidden_size=64,
                layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                mamba_d_state=16, mamba_expand=2, mamba_d_conv=4)
    j = cache_model(jamba, "bfloat16")
    state = 2 * 64 * (4 + 16) * 2
    attn = 2 * 2 * 8 * 2
    assert j.bytes(10) == 3 * state + attn * 10
    assert j.bytes(10_000) - j.bytes(10) == attn * 9_990  # state does not grow with length


def test_quantized_kv_counts_scales():
    int8 = cache_model(LLAMA3_8B, KVFormat("int8", None, 2))
    # per head vector of 128: 128 B data + scale and zero point (2 x 2 B)
    assert int8.bytes_per_token == 32 * 2 * 8 * (128 + 4)
    fp8 = cache_model(LLAMA3_8B, KVFormat("fp8", 32, 4))
    assert fp8.bytes_per_token == 32 * 2 * 8 * (128 + 4 * 4)


@pytest.mark.parametrize("c, words", [
    (cfg(num_hidden_layers=0, num_attention_heads=4, hidden_size=32), "num_hidden_layers"),
    (cfg(num_hidden_layers=2, num_attention_heads=0, hidden_size=32), "num_attention_heads"),
    (cfg(num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=4, hidden_size=48), "divide"),
    (cfg(num_hidden_layers=2, num_attention_heads=5, hidden_size=32), "head_dim"),
    (cfg(num_attention_heads=4, hidden_size=32), "num_hidden_layers"),
    (cfg(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, layer_types=["full_attention"]), "layer_types"),
    (cfg(num_hidden_layers=1, num_attention_heads=4, hidden_size=32, layer_types=["linear_attention"]), "state dimensions"),
    (cfg(num_hidden_layers=1, num_attention_heads=4, hidden_size=32, layer_types=["sliding_attention"]), "sliding_window"),
])
def test_bad_configs_give_clear_errors(c, words):
    with pytest.raises(ConfigError, match=words):
        cache_model(c, "bfloat16")


