"""The tests of tests/unit/test_bill.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations


import pytest
import torch

from gate.measure.kv import cache_model
from gate.models.cache import cache_tensor_bytes, new_cache


def _real_cache_bytes(model, tokens: int) -> int:
    cache = new_cache(model.config)
    with torch.inference_mode():
        model(input_ids=torch.randint(0, model.config.vocab_size, (1, tokens)), **{_kw(model): cache}, use_cache=True)
    return cache_tensor_bytes(cache)


def _kw(model):
    from gate.models.cache import cache_kwarg

    return cache_kwarg(type(model))


@pytest.mark.parametrize("name, overrides", [
    ("llama", {}),
    ("llama-mqa-head-dim", {"num_key_value_heads": 1, "head_dim": 16}),
    ("mistral-sliding", {"sliding_window": 8}),
])
@pytest.mark.parametrize("tokens", [5, 30])
def test_kv_lines_equal_real_cache_tensors(name, overrides, tokens):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128)
    base.update(overrides)
    torch.manual_seed(0)
    model = (MistralForCausalLM(MistralConfig(**base)) if "mistral" in name else LlamaForCausalLM(LlamaConfig(**base))).eval()
    assert _real_cache_bytes(model, tokens) == cache_model(model.config, "float32").bytes(tokens)


