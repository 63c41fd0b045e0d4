"""The tests of tests/unit/test_bill.py's subject that need the real models, llama-server, vLLM or the browser; the subject and
what it must do are described there."""

from __future__ import annotations


import pytest

from gate.measure.bill import BillInputs, build_bill
from gate.measure.kv import cache_model
from unit.test_bill import cfg  # noqa: F401 - shared with that tier
from unit.test_bill import SMOLLM2


def test_smollm2_135m_from_its_config():
    assert cache_model(SMOLLM2, "float32").bytes_per_token == 2 * 30 * 3 * 64 * 4 == 46080


def test_sliding_window_caps_retained_tokens_and_alternating_layers():
    mistral = cfg(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, hidden_size=64, sliding_window=100)
    m = cache_model(mistral, "bfloat16")
    per = 2 * 4 * 2 * 8 * 2
    assert m.bytes(50) == per * 50 and m.bytes(5000) == per * 99
    gemma = cfg(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=8, hidden_size=64,
                sliding_window=100, layer_types=["sliding_attention", "full_attention"] * 2)
    g = cache_model(gemma, "bfloat16")
    layer = 2 * 2 * 8 * 2
    assert g.bytes(5000) == 2 * layer * 99 + 2 * layer * 5000
    assert "sliding" in g.formula(5000)


def _inputs(**kw):
    c = cache_model(SMOLLM2, "float32")
    d = cache_model(SMOLLM2, "bfloat16")
    base = dict(runner="bf16", target_cache=c, target_weight_bytes=1000, vocab_size=49152, context_tokens=300,
                num_draft_tokens=4, draft_cache=d, draft_weight_bytes=500, draft_has_distribution=True)
    base.update(kw)
    return BillInputs(**base)


def test_bill_lines_for_a_draft_and_the_fallback():
    bill = build_bill(_inputs())
    lines = {line.name: line.bytes for line in bill.lines}
    assert lines["target KV cache"] == 46080 * 300
    assert lines["draft KV cache"] == 23040 * 300
    assert lines["verification positions"] == 5 * 46080 + 4 * 23040
    assert lines["target logits"] == 5 * 49152 * 4
    assert lines["draft probabilities"] == 4 * 49152 * 4
    assert bill.total_bytes == sum(lines.values())
    fallback = build_bill(_inputs(runner="fallback", num_draft_tokens=0, draft_cache=None, draft_weight_bytes=0))
    assert {line.name for line in fallback.lines} == {"target weights", "target KV cache", "target logits"}
    assert fallback.total_bytes == 1000 + 46080 * 300 + 49152 * 4
    # the primer's example: vocab 128,256, gamma 4, fp32 target logits = 2.6 MB per sequence
    big = build_bill(_inputs(vocab_size=128256))
    assert next(x.bytes for x in big.lines if x.name == "target logits") == pytest.approx(2.6e6, rel=0.02)


def test_declared_lines_fragmentation_and_tree_branches():
    bill = build_bill(_inputs(workspace_bytes=10_000, communication_bytes=5_000, fragmentation=0.1, tree_branches=3))
    lines = {line.name: line.bytes for line in bill.lines}
    assert lines["workspace"] == 10_000 and lines["communication buffers"] == 5_000 and "graph captures" not in lines
    assert lines["target logits"] == 5 * 3 * 49152 * 4
    rest = sum(v for k, v in lines.items() if k != "fragmentation allowance")
    assert lines["fragmentation allowance"] == round(0.1 * rest)


def test_budget_statement_says_how_many_more_sequences_fit():
    one = build_bill(_inputs(sequences=1)).total_bytes
    two = build_bill(_inputs(sequences=2)).total_bytes
    per_seq = two - one
    capacity = one + 3 * per_seq + per_seq // 2
    budget = build_bill(_inputs(sequences=1), capacity_bytes=capacity).budget
    assert budget.headroom_bytes == capacity - one
    assert budget.bytes_per_extra_sequence == per_seq and budget.extra_sequences == 3
    assert budget.bytes_per_extra_context_token == 46080 + 23040
    over = build_bill(_inputs(), capacity_bytes=one - 1).budget
    assert over.headroom_bytes == -1 and over.extra_sequences == 0
