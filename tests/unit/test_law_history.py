"""Issue 13: the law's history-dependent parts (penalties) and grammar constraints, applied to
p and q with each position's own history, in gate.core.law and in the in-process speculative loop.

A tiny random Llama over a byte-level tokenizer (one token per byte, so JSON grammars are
real) is the target; a noisy copy of it is the draft. Sampled exactness of the loop under a
constraint and penalties is checked against the law itself with a G-test on first steps."""

from __future__ import annotations


import pytest
import torch
from conftest import byte_tokenizer

from gate.constraints import grammar_engine
from gate.constraints.interface import ResponseFormat
from gate.core.law import Law, history_counts, law_logits, law_probs

CPU = torch.device("cpu")
V = 259
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["id", "ok"], "additionalProperties": False}
JSON_FORMAT = ResponseFormat.of_schema(SCHEMA)


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def engine(tok):
    return grammar_engine(tok, V)


def test_history_counts_count_prompt_and_output_apart():
    ids = [5, 6, 5, 7, 7, 8]  # prompt [5, 6, 5], output [7, 7, 8]
    seen, counts = history_counts(ids, start=3, rows=4, prompt_len=3, vocab_size=10)
    # row t has seen ids[:3 + t]
    assert seen[0].nonzero().flatten().tolist() == [5, 6]
    assert seen[3].nonzero().flatten().tolist() == [5, 6, 7, 8]
    assert counts[0].sum() == 0  # no output yet: presence and frequency penalise nothing in the prompt
    assert counts[1, 7] == 1 and counts[2, 7] == 2 and counts[2, 8] == 0 and counts[3, 8] == 1
    assert counts[2, 5] == 0  # token 5 is only in the prompt


def test_rows_are_each_processed_with_their_own_history():
    g = torch.Generator().manual_seed(0)
    law = Law("all", 0.8, top_k=20, top_p=0.95, min_p=0.02, repetition_penalty=1.4, presence_penalty=0.5,
              frequency_penalty=0.3, logit_bias=((3, 2.0), (9, -1.0))).bind(prompt_len=4)
    ids = torch.randint(0, 30, (12,), generator=g).tolist()
    logits = torch.randn(8, 30, generator=g) * 3
    rows = law_probs(logits, law, ids, 4)
    for t in range(8):
        one = law_probs(logits[t], law, ids[:4 + t])
        assert torch.allclose(rows[t], one, atol=1e-6), t
    assert torch.allclose(rows.sum(-1), torch.ones(8), atol=1e-5)


def test_vllm_penalties_by_hand():
    # logits of 5 tokens; prompt [0], output so far [1, 1]; next position
    logits = torch.tensor([2.0, 1.0, -1.0, 0.5, 0.0])
    law = Law("pen", 0.0, repetition_penalty=2.0, presence_penalty=0.25, frequency_penalty=0.5).bind(prompt_len=1)
    got = law_logits(logits, law, [0, 1, 1])
    # repetition on tokens 0 and 1 (prompt and output): 2 -> 1, 1 -> 0.5; then token 1 (output, count 2): -0.5*2 - 0.25
    want = torch.tensor([1.0, 0.5 - 1.0 - 0.25, -1.0, 0.5, 0.0])
    assert torch.allclose(got, want)
    negative = Law("neg", 0.0, repetition_penalty=2.0).bind(0)
    assert law_logits(torch.tensor([-1.0, 1.0]), negative, [0]).tolist() == [-2.0, 1.0]  # x <= 0 is multiplied


def test_a_law_with_history_needs_its_ids_and_output_penalties_need_the_prompt_length():
    with pytest.raises(ValueError, match="history"):
        law_probs(torch.zeros(5), Law("rp", 1.0, repetition_penalty=1.2))
    with pytest.raises(ValueError, match="bind"):
        law_probs(torch.zeros(5), Law("fp", 1.0, frequency_penalty=0.5), [1, 2])
    with pytest.raises(ValueError, match="presence or frequency"):
        Law("tf", 1.0, presence_penalty=0.5, convention="transformers")


def test_min_p_position_differs_between_the_conventions():
    # vLLM: min-p before top-p; transformers: after. With these logits the kept sets differ.
    logits = torch.log(torch.tensor([0.40, 0.30, 0.20, 0.06, 0.04]))
    vllm = law_probs(logits, Law("v", 1.0, top_p=0.75, min_p=0.2))
    hf = law_probs(logits, Law("h", 1.0, top_p=0.75, min_p=0.2, convention="transformers"))
    # vLLM: min-p keeps {0, 1, 2} (>= 0.08), renormalised (0.44, 0.33, 0.22); top-p 0.75 then drops 2
    assert (vllm > 0).tolist() == [True, True, False, False, False]
    # transformers: top-p on the raw law drops 3 and 4 (cumulative 0.10 <= 0.25); min-p keeps the rest
    assert (hf > 0).tolist() == [True, True, True, False, False]
    assert torch.allclose(hf[:3], torch.tensor([0.4, 0.3, 0.2]) / 0.9)


def test_the_grammar_masks_every_row_and_a_forbidden_prefix_leaves_the_row_unconstrained(tok, engine):
    ids = tok.encode("x") + tok.encode('{"id": 1')  # a one-token prompt, then output
    law = Law("t", 1.0).bind(1, engine.matcher(JSON_FORMAT))
    logits = torch.zeros(len(ids) - 1 + 1, V)
    p = law_probs(logits, law, ids, 1)
    assert (p[0] > 0).nonzero().flatten().tolist() == tok.encode("{")
    for t in range(p.shape[0]):
        assert torch.isclose(p[t].sum(), torch.tensor(1.0))
        assert p[t, ids[1 + t]] > 0 if 1 + t < len(ids) else True  # the committed text is allowed
    bad = tok.encode("x") + tok.encode("[") + tok.encode("1")
    q = law_probs(torch.zeros(2, V), Law("t", 1.0).bind(1, engine.matcher(JSON_FORMAT)), bad, 1)
    assert q[0, bad[1]] == 0  # '[' is forbidden: a proposal of it is rejected (p(x) = 0)
    assert torch.allclose(q[1], torch.full((V,), 1.0 / V))  # after it: never reached, unconstrained


def test_the_engine_compiles_each_kind_and_names_what_it_refuses(tok, engine):
    assert engine.check(JSON_FORMAT) is None
    assert engine.check(ResponseFormat("regex", "[0-9]{3}")) is None
    assert engine.check(ResponseFormat.of_choices(["yes", "no"])) is None
    assert "regex" in (engine.check(ResponseFormat("regex", "(ab")) or "")
    m = engine.matcher(ResponseFormat("regex", "[0-9]{3}"))
    digits = set(tok.encode("0123456789"))
    assert set(m.allowed([]).nonzero().flatten().tolist()) == digits
    three = tok.encode("123")
    assert m.allowed(three).nonzero().flatten().tolist() == [tok.eos_token_id]  # complete: EOS only
    assert m.allowed(tok.encode("12a")) is None  # a prefix the grammar forbids
    assert set(m.allowed(three[:1]).nonzero().flatten().tolist()) == digits  # rolled back to a shorter prefix
    assert len(m.mask_ms) >= 3 and all(t >= 0 for t in m.mask_ms)
    choice = engine.matcher(ResponseFormat.of_choices(["ab", "ba"]))
    assert set(choice.allowed([]).nonzero().flatten().tolist()) == set(tok.encode("ab"))
    with pytest.raises(ValueError, match="regex"):
        engine.matcher(ResponseFormat("regex", "(ab"))


def test_a_tokenizer_the_engine_cannot_read_is_one_clear_error():
    from conftest import tiny_tokenizer

    message = grammar_engine(tiny_tokenizer(), 96).check(JSON_FORMAT)
    assert message and "cannot read the target's tokenizer" in message


def test_a_draft_silent_under_one_constraint_gets_a_note():
    from gate.commands.check import speculation_notes
    from gate.measure import speculation
    from gate.records import Measurements, RequestRecord

    def rec(draft, constraint, proposed):
        return RequestRecord(draft=draft, law="g", prompt_id=f"p#{constraint}", category="c", max_new_tokens=4, repetition=0,
                             prompt_tokens=3, output_ids=[5, 6, 7], token_times_ms=[1.0, 2.0, 3.0], step_committed=[1, 2],
                             step_proposed=[0, proposed], step_accepted=[0, 0], stop_reason="length", e2el_ms=3.0,
                             num_draft_tokens=3, kv_cache_tokens=6, kv_cache_bytes=0, draft_kv_cache_bytes=0,
                             constraint=constraint)

    m = Measurements(environment=None, laws=["g"])
    m.requests = [rec("fallback", "none", 0), rec("d", "none", 3), rec("d", "prompt", 0), rec("e", "none", 3), rec("e", "prompt", 2)]
    notes = speculation_notes(m)
    assert len(notes) == 1 and "draft d made no proposal" in notes[0] and "'prompt'" in notes[0]
    m.requests = [rec("fallback", "none", 0), rec("d", "none", 0), rec("d", "prompt", 0)]
    m.speculation = speculation.check(m, {"d": speculation.every_step(3)})
    # two 3-token outputs at K=3 imply no proposing step: nothing to propose, not speculation off
    assert speculation_notes(m) == ["nothing to propose: draft d made 0 draft tokens (per-request counts) over 2 requests "
                                    "(6 output tokens) under g, and its outputs imply 0 proposing steps (a draft with a model "
                                    "proposes at every verification step, and a step commits at most num_draft_tokens + 1 = 4 "
                                    "tokens): the draft found nothing to propose on these prompts; its verdicts stand as "
                                    "measured"]


