"""The tests of tests/unit/test_speculative_loop.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama, tiny_tokenizer

from gate.drafts.early_exit import early_exit_draft
from gate.drafts.model import ModelDraft
from gate.drafts.prompt_lookup import PromptLookupDraft
from gate.runners.stop import StopStrings
from gate.runners.transformers import TransformersRunner
from gate.core.law import Law
from gate.measure.kv import cache_model
from gate.records import SpecDecodeCounters
from unit.test_speculative_loop import CPU, GREEDY, PROMPT


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
    engine = TransformersRunner(target, set(), CPU)
    draft = _drafts(target)[name]
    fallback = engine._generate(PROMPT, None, GREEDY, 40, None)
    spec = engine._generate(PROMPT, draft, GREEDY, 40, None)
    assert spec.output_ids == fallback.output_ids
    assert len(spec.output_ids) == 40 and spec.stop_reason == "length"
    assert sum(spec.step_committed) == 40 == len(spec.token_times_ms)
    # committed per step = accepted + 1 (the correction or bonus) on every step here
    assert spec.step_committed == [a + 1 for a in spec.step_accepted]
    assert all(0 <= a <= n for a, n in zip(spec.step_accepted, spec.step_proposed))
    assert all(n <= draft.num_draft_tokens for n in spec.step_proposed)


def test_partly_accepted_blocks_occur_and_still_match(target):
    engine = TransformersRunner(target, set(), CPU)
    spec = engine._generate(PROMPT, _drafts(target)["exit"], GREEDY, 40, None)
    partial = [(a, n) for a, n in zip(spec.step_accepted, spec.step_proposed) if 0 < a < n]
    assert partial, "the early-exit draft should be partly accepted on some steps"
    assert spec.output_ids == engine._generate(PROMPT, None, GREEDY, 40, None).output_ids


def test_same_weights_are_always_fully_accepted(target):
    engine = TransformersRunner(target, set(), CPU)
    spec = engine._generate(PROMPT, _drafts(target)["same"], GREEDY, 41, None)
    c = SpecDecodeCounters.from_steps(spec.step_proposed, spec.step_accepted)
    assert c.acceptance_rate == 1.0
    assert c.mean_acceptance_length == pytest.approx(5.0)  # gamma 4 + bonus
    assert spec.step_committed == [1] + [5] * 8


def test_eos_inside_an_accepted_block_ends_the_output_there(target):
    reference = TransformersRunner(target, set(), CPU)._generate(PROMPT, None, GREEDY, 30, None).output_ids
    # pick a token whose first occurrence falls inside a fully accepted block (not at its end)
    # (the 'same' draft has gamma 4: token 0 comes from the prefill, then blocks of 5 at 1-5, 6-10, ...)
    eos = next(t for i, t in enumerate(reference) if i >= 1 and (i - 1) % 5 != 4 and t not in reference[:i])
    cut = reference.index(eos)
    engine = TransformersRunner(target, {eos}, CPU)
    spec = engine._generate(PROMPT, _drafts(target)["same"], GREEDY, 30, None)
    assert spec.output_ids == reference[: cut + 1]
    assert spec.stop_reason == "eos"
    assert sum(spec.step_committed) == cut + 1
    # the last step proposed 4 and all were accepted, but it commits only up to the EOS,
    # which is a draft token: every committed token of that step counts as accepted
    assert spec.step_proposed[-1] == 4
    assert spec.step_accepted[-1] == spec.step_committed[-1] < 5
    fallback = engine._generate(PROMPT, None, GREEDY, 30, None)
    assert fallback.output_ids == spec.output_ids


def test_eos_inside_a_block_counts_committed_tokens_per_step_and_crops_the_cache(target):
    """Issue 10 item 4 (vLLM #56101): a step cut by an EOS commits fewer than 1 + accepted
    tokens; the mean acceptance length is committed tokens per step, vLLM's formula beside it,
    and the measured target cache holds no proposal past the EOS."""
    reference = TransformersRunner(target, set(), CPU)._generate(PROMPT, None, GREEDY, 30, None).output_ids
    eos = next(t for i, t in enumerate(reference) if i >= 1 and (i - 1) % 5 != 4 and t not in reference[:i])
    spec = TransformersRunner(target, {eos}, CPU)._generate(PROMPT, _drafts(target)["same"], GREEDY, 30, None)
    c = SpecDecodeCounters.from_steps(spec.step_proposed, spec.step_accepted, spec.step_committed)
    steps = [k for k, n in zip(spec.step_committed, spec.step_proposed) if n]
    assert c.num_committed_tokens == sum(steps) == len(spec.output_ids) - 1  # all but the prefill's token
    assert c.mean_acceptance_length == pytest.approx(sum(steps) / len(steps))
    assert c.vllm_mean_acceptance_length == pytest.approx(1 + c.num_accepted_tokens / c.num_drafts)
    assert c.vllm_mean_acceptance_length - c.mean_acceptance_length == pytest.approx(1 / c.num_drafts)  # one cut step
    assert spec.kv_cache_tokens <= len(PROMPT) + len(spec.output_ids)
    layout = cache_model(target.config, "float32")
    assert spec.kv_cache_bytes == layout.bytes(spec.kv_cache_tokens)
    # summed over requests the counters still add up, and the identity with per-position rates holds for vLLM's figure
    total = c + c
    assert total.num_committed_tokens == 2 * c.num_committed_tokens
    assert total.vllm_mean_acceptance_length == pytest.approx(1 + sum(total.acceptance_rate_per_pos))


def test_max_new_tokens_caps_proposals(target):
    engine = TransformersRunner(target, set(), CPU)
    spec = engine._generate(PROMPT, _drafts(target)["same"], GREEDY, 3, None)
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
    engine = TransformersRunner(target, set(), CPU)
    spec = engine._generate(PROMPT, ModelDraft("d", "model", draft, 3, CPU), GREEDY, 20, None)
    g = cache_model(target.config, "float32")
    assert spec.kv_cache_tokens == len(PROMPT) + 20 - 1  # the last token is never fed
    assert spec.kv_cache_bytes == g.bytes_per_token * spec.kv_cache_tokens
    dg = cache_model(draft.config, "float32")
    assert spec.draft_kv_cache_bytes % dg.bytes_per_token == 0 and spec.draft_kv_cache_bytes > 0


def test_sampling_is_seeded_and_reproducible(target):
    engine = TransformersRunner(target, set(), CPU)
    law = Law("t0.8", 0.8, top_k=20)
    draft = _drafts(target)["other"]
    a = engine._generate(PROMPT, draft, law, 30, torch.Generator().manual_seed(3))
    b = engine._generate(PROMPT, draft, law, 30, torch.Generator().manual_seed(3))
    assert a.output_ids == b.output_ids and a.step_accepted == b.step_accepted


# --- stop strings and very short outputs ----------------------------------------------------


def _text(ids):
    return tiny_tokenizer().decode(ids, skip_special_tokens=True)


def test_a_stop_string_inside_an_accepted_block_ends_the_output_and_the_counters(target):
    engine = TransformersRunner(target, set(), CPU)
    reference = engine._generate(PROMPT, None, GREEDY, 30, None).output_ids
    words = tiny_tokenizer().convert_ids_to_tokens(reference)
    # a stop string spanning two tokens whose first completion falls inside a fully accepted
    # block of the 'same' draft (gamma 4: token 0 from the prefill, then blocks of 5 at 1-5, 6-10, ...)
    # and not on the block's bonus token, so the draft itself proposed the stop string
    stop, cut = next((s, k) for i in range(2, len(reference)) if min(reference[i - 1], reference[i]) >= 4
                     for s in [f"{words[i - 1][1:]} {words[i]}"]
                     for k in [next(k for k in range(1, len(reference) + 1) if s in _text(reference[:k]))]
                     if k == i + 1 and (i - 1) % 5 != 4)
    stopped = TransformersRunner(target, set(), CPU, StopStrings(tiny_tokenizer(), [stop]))
    spec = stopped._generate(PROMPT, _drafts(target)["same"], GREEDY, 30, None)
    assert spec.output_ids == reference[:cut] and spec.stop_reason == "stop" and spec.stop_string == stop
    assert sum(spec.step_committed) == cut == len(spec.token_times_ms)
    # the last step proposed 4 and all were accepted by the rejection rule, but the output ends
    # at the stop string: only the committed draft tokens count as accepted
    assert spec.step_proposed[-1] == 4 and spec.step_accepted[-1] == spec.step_committed[-1] < 5
    full = engine._generate(PROMPT, _drafts(target)["same"], GREEDY, 30, None)
    steps = len(spec.step_accepted)
    counters = SpecDecodeCounters.from_steps(spec.step_proposed, spec.step_accepted)
    assert counters.num_accepted_tokens == sum(full.step_accepted[: steps - 1]) + spec.step_committed[-1]
    assert counters.num_accepted_tokens < sum(full.step_accepted[:steps])
    assert counters.mean_acceptance_length < SpecDecodeCounters.from_steps(full.step_proposed, full.step_accepted).mean_acceptance_length
    assert _text(spec.output_ids).endswith(stop)
    fallback = stopped._generate(PROMPT, None, GREEDY, 30, None)
    assert fallback.output_ids == spec.output_ids and fallback.stop_reason == "stop"


def test_prompt_lookup_proposing_the_stop_string_is_cut_there(target):
    # the prompt repeats itself, so prompt lookup proposes its continuation; greedy decoding of
    # the tiny model then decides which proposals are accepted
    engine = TransformersRunner(target, set(), CPU)
    draft = _drafts(target)["lookup"]
    full = engine._generate(PROMPT, draft, GREEDY, 30, None)
    accepted_at = [sum(full.step_committed[:s]) + j for s in range(len(full.step_committed))
                   for j in range(full.step_accepted[s])]  # output positions of accepted proposals
    if not accepted_at:
        pytest.skip("prompt lookup had no accepted proposal on this model")
    i = accepted_at[0]
    stop = tiny_tokenizer().convert_ids_to_tokens(full.output_ids[i])
    cut = next(k for k in range(1, len(full.output_ids) + 1) if stop in _text(full.output_ids[:k]))
    spec = TransformersRunner(target, set(), CPU, StopStrings(tiny_tokenizer(), [stop]))._generate(PROMPT, draft, GREEDY, 30, None)
    assert spec.output_ids == full.output_ids[:cut] and spec.stop_reason == "stop"
    assert sum(spec.step_accepted) <= sum(full.step_accepted) and sum(spec.step_committed) == cut


def test_eos_comes_before_a_stop_string_at_the_same_token(target):
    reference = TransformersRunner(target, set(), CPU)._generate(PROMPT, None, GREEDY, 20, None).output_ids
    words = tiny_tokenizer().convert_ids_to_tokens(reference)
    # a token whose word first appears in the text exactly there: the EOS and the stop string complete together
    i = next(i for i in range(1, len(reference)) if reference[i] >= 4 and words[i] not in _text(reference[:i])
             and words[i] in _text(reference[: i + 1]))
    engine = TransformersRunner(target, {reference[i]}, CPU, StopStrings(tiny_tokenizer(), [words[i]]))
    g = engine._generate(PROMPT, _drafts(target)["same"], GREEDY, 20, None)
    assert g.output_ids == reference[: i + 1] and g.stop_reason == "eos" and g.stop_string is None


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("name", ["same", "lookup", "exit"])
def test_very_short_outputs_with_a_draft(target, name, n):
    engine = TransformersRunner(target, set(), CPU)
    spec = engine._generate(PROMPT, _drafts(target)[name], GREEDY, n, None)
    assert spec.output_ids == engine._generate(PROMPT, None, GREEDY, n, None).output_ids
    assert len(spec.output_ids) == n == sum(spec.step_committed) and spec.stop_reason == "length"
    # proposals never run past max_new_tokens: the prefill token, then at most n - 1 - 1 proposals
    assert all(p <= n - 1 - sum(spec.step_committed[:s]) for s, p in enumerate(spec.step_proposed))
    if n == 1:
        assert spec.step_proposed == [0] and SpecDecodeCounters.from_steps(spec.step_proposed, spec.step_accepted).num_drafts == 0


def test_a_stop_string_in_the_first_token_ends_the_output_at_once(target):
    first = TransformersRunner(target, set(), CPU)._generate(PROMPT, None, GREEDY, 5, None).output_ids[0]
    word = tiny_tokenizer().convert_ids_to_tokens(first)
    g = TransformersRunner(target, set(), CPU, StopStrings(tiny_tokenizer(), [word]))._generate(
        PROMPT, _drafts(target)["same"], GREEDY, 5, None)
    assert g.output_ids == [first] and g.stop_reason == "stop" and g.step_proposed == [0]
