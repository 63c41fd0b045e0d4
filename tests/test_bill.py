"""The KV formula on known figures, the first bill's lines, and bad configs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gate.measure.bill import ConfigError, build_bill, kv_geometry

KIB = 1024


def cfg(**kw):
    return SimpleNamespace(**kw)


def test_llama2_7b_is_512_kib_per_token_at_16_bits():
    c = cfg(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, hidden_size=4096)
    assert kv_geometry(c, 2).bytes_per_token == 512 * KIB


def test_llama3_8b_uses_kv_heads_not_query_heads():
    c = cfg(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096)
    assert kv_geometry(c, 2).bytes_per_token == 128 * KIB


def test_smollm2_135m_from_its_config():
    # 30 layers, 9 query heads, 3 KV heads, hidden 576 -> head_dim 64
    c = cfg(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576, head_dim=64)
    assert kv_geometry(c, 4).bytes_per_token == 2 * 30 * 3 * 64 * 4 == 46080


def test_explicit_head_dim_wins_over_hidden_over_heads():
    c = cfg(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, hidden_size=32, head_dim=16)
    assert kv_geometry(c, 2).head_dim == 16


@pytest.mark.parametrize("c, words", [
    (cfg(num_hidden_layers=0, num_attention_heads=4, hidden_size=32), "num_hidden_layers"),
    (cfg(num_hidden_layers=2, num_attention_heads=0, hidden_size=32), "num_attention_heads"),
    (cfg(num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=4, hidden_size=48), "divide"),
    (cfg(num_hidden_layers=2, num_attention_heads=5, hidden_size=32), "head_dim"),
    (cfg(num_attention_heads=4, hidden_size=32), "num_hidden_layers"),
])
def test_bad_configs_give_clear_errors(c, words):
    with pytest.raises(ConfigError, match=words):
        kv_geometry(c, 2)


def test_bill_lines_for_a_draft_and_the_fallback():
    g = kv_geometry(cfg(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576, head_dim=64), 4)
    bill = build_bill("bf16", g, 1000, 49152, 300, 4, kv_geometry(cfg(num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, hidden_size=576, head_dim=64), 2), 500, True)
    lines = {line.name: line.bytes for line in bill.lines}
    assert lines["target KV cache"] == 46080 * 300
    assert lines["draft KV cache"] == 23040 * 300
    assert lines["verification positions"] == 5 * 46080
    assert lines["target logits"] == 5 * 49152 * 4
    assert lines["draft probabilities"] == 4 * 49152 * 4
    assert bill.total_bytes == sum(lines.values())
    fallback = build_bill("fallback", g, 1000, 49152, 300, 0, None, 0, False)
    assert {line.name for line in fallback.lines} == {"target weights", "target KV cache", "target logits"}
    assert fallback.total_bytes == 1000 + 46080 * 300 + 49152 * 4
    # the primer's example: vocab 128,256, gamma 4, fp32 target logits = 2.6 MB per sequence
    big = build_bill("x", g, 0, 128256, 1, 4, None, 0, False)
    assert next(line.bytes for line in big.lines if line.name == "target logits") == pytest.approx(2.6e6, rel=0.02)
