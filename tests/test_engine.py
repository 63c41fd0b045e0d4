"""gate's speculative loop on tiny random Llamas: greedy output equals the fallback token for
token, counters add up, EOS inside an accepted block ends the output, cache bytes match the bill."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_llama
from gate.drafts.early_exit import early_exit_draft
from gate.drafts.model import ModelDraft
from gate.drafts.prompt_lookup import PromptLookupDraft, lookup
from gate.engines.transformers import TransformersEngine
from gate.law import Law
from gate.measure.kv import cache_model
from gate.records import SpecDecodeCounters

CPU = torch.device("cpu")
GREEDY = Law("greedy", 0.0)
PROMPT = [1, 5, 7, 9, 5, 7, 9, 11, 3, 5, 7]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


def _drafts(target):
    return {
        "other": ModelDraft("other", "model", tiny_llama(1), 4, CPU),
        "same": ModelDraft("same", "model", tiny_llama(0), 4, CPU),
        "bf16": ModelDraft("bf16", "model", tiny_llama(0).to(torch.bfloat16), 3, CPU),
        "exit": early_exit_draft("exit", target, 1, 3, CPU, "drafts.exit.num_layers"),
        "lookup": PromptLookupDraft("lookup", 3, 4, target.config.vocab_size, CPU),
    }


@pytest.mark.parametrize("name", ["other", "same", "bf16", "exit", "lookup"])
def test_greedy_speculative_equals_fallback_token_for_token(target, name):
    engine = TransformersEngine(target, set(), CPU)
    draft = _drafts(target)[name]
    fallback = engine.generate(PROMPT, None, GREEDY, 40, None)
    spec = engine.generate(PROMPT, draft, GREEDY, 40, None)
    assert spec.output_ids == fallback.output_ids
    assert len(spec.output_ids) == 40 and spec.stop_reason == "length"
    assert sum(spec.step_committed) == 40 == len(spec.token_times_ms)
    # committed per step = accepted + 1 (the correction or bonus) on every step here
    assert spec.step_committed == [a + 1 for a in spec.step_accepted]
    assert all(0 <= a <= n for a, n in zip(spec.step_accepted, spec.step_proposed))
    assert all(n <= draft.num_draft_tokens for n in spec.step_proposed)


def test_partly_accepted_blocks_occur_and_still_match(target):
    engine = TransformersEngine(target, set(), CPU)
    spec = engine.generate(PROMPT, _drafts(target)["exit"], GREEDY, 40, None)
    partial = [(a, n) for a, n in zip(spec.step_accepted, spec.step_proposed) if 0 < a < n]
    assert partial, "the early-exit draft should be partly accepted on some steps"
    assert spec.output_ids == engine.generate(PROMPT, None, GREEDY, 40, None).output_ids


def test_same_weights_are_always_fully_accepted(target):
    engine = TransformersEngine(target, set(), CPU)
    spec = engine.generate(PROMPT, _drafts(target)["same"], GREEDY, 41, None)
    c = SpecDecodeCounters.from_steps(spec.step_proposed, spec.step_accepted)
    assert c.acceptance_rate == 1.0
    assert c.mean_acceptance_length == pytest.approx(5.0)  # gamma 4 + bonus
    assert spec.step_committed == [1] + [5] * 8


def test_eos_inside_an_accepted_block_ends_the_output_there(target):
    reference = TransformersEngine(target, set(), CPU).generate(PROMPT, None, GREEDY, 30, None).output_ids
    # pick a token whose first occurrence falls inside a fully accepted block (not at its end)
    # (the 'same' draft has gamma 4: token 0 comes from the prefill, then blocks of 5 at 1-5, 6-10, ...)
    eos = next(t for i, t in enumerate(reference) if i >= 1 and (i - 1) % 5 != 4 and t not in reference[:i])
    cut = reference.index(eos)
    engine = TransformersEngine(target, {eos}, CPU)
    spec = engine.generate(PROMPT, _drafts(target)["same"], GREEDY, 30, None)
    assert spec.output_ids == reference[: cut + 1]
    assert spec.stop_reason == "eos"
    assert sum(spec.step_committed) == cut + 1
    # the last step proposed 4 and all were accepted, but it commits only up to the EOS,
    # which is a draft token: every committed token of that step counts as accepted
    assert spec.step_proposed[-1] == 4
    assert spec.step_accepted[-1] == spec.step_committed[-1] < 5
    fallback = engine.generate(PROMPT, None, GREEDY, 30, None)
    assert fallback.output_ids == spec.output_ids


def test_max_new_tokens_caps_proposals(target):
    engine = TransformersEngine(target, set(), CPU)
    spec = engine.generate(PROMPT, _drafts(target)["same"], GREEDY, 3, None)
    assert len(spec.output_ids) == 3
    # after the first token 2 more fit: 1 proposal plus the bonus token
    assert spec.step_proposed == [0, 1] and spec.step_committed == [1, 2]


@pytest.mark.parametrize("overrides", [
    {},  # GQA: 4 query heads, 2 KV heads
    {"num_key_value_heads": 1, "head_dim": 16},  # MQA with head_dim != hidden / heads (32 / 4 = 8)
    {"num_key_value_heads": 4},  # MHA
])
def test_measured_cache_bytes_equal_the_kv_formula(overrides):
    target = tiny_llama(0, **overrides)
    draft = tiny_llama(1, num_hidden_layers=1, **overrides)
    engine = TransformersEngine(target, set(), CPU)
    spec = engine.generate(PROMPT, ModelDraft("d", "model", draft, 3, CPU), GREEDY, 20, None)
    g = cache_model(target.config, "float32")
    assert spec.kv_cache_tokens == len(PROMPT) + 20 - 1  # the last token is never fed
    assert spec.kv_cache_bytes == g.bytes_per_token * spec.kv_cache_tokens
    dg = cache_model(draft.config, "float32")
    assert spec.draft_kv_cache_bytes % dg.bytes_per_token == 0 and spec.draft_kv_cache_bytes > 0


def test_sampling_is_seeded_and_reproducible(target):
    engine = TransformersEngine(target, set(), CPU)
    law = Law("t0.8", 0.8, top_k=20)
    draft = _drafts(target)["other"]
    a = engine.generate(PROMPT, draft, law, 30, torch.Generator().manual_seed(3))
    b = engine.generate(PROMPT, draft, law, 30, torch.Generator().manual_seed(3))
    assert a.output_ids == b.output_ids and a.step_accepted == b.step_accepted


def test_prompt_lookup_matches_transformers_rule():
    # suffix [5, 7] first occurs at index 1 -> proposes what followed it
    assert lookup([1, 5, 7, 9, 4, 5, 7], 3, 2) == [9, 4]
    assert lookup([1, 2, 3], 3, 4) == []
    assert lookup([4, 4], 2, 3) == [4]
