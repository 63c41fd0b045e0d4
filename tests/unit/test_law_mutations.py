"""Mutation tests for the declared law's history-dependent parts (issue 13): the reference
speculative sampler (reference) with the whole law applied to p and q, each position
with its own history and grammar mask, and the faults that take a part of the law away
from the verifier's p (a penalty on q only, a penalty on the history before the block,
min-p on q only, a grammar mask on q only). Each must fail gate's exactness decision at
the default sample size of tests/{unit,integration}/test_exactness.py (1,000 sequences x 5 tokens, gamma 3),
and the correct sampler under the same law must pass.

The decision is the one `gate exactness` makes (gate.exactness.verdict): a next-token G-test
at the first output position (the claim), next-token G-tests after output prefixes that
>= 50 samples share (evidence: they reach the positions after an accepted proposal, where
a stale history shows) and the PIT KS test over every token, each against the exact
target law at its position given the sample's prefix; Holm together at significance 0.01,
power 0.9, detect_tv 0.1. Positions after the first have prefix-dependent laws here, so
the per-position marginal tests of tests/{unit,integration}/test_exactness.py would not apply.

Also: the vLLM-order law computed by hand on a 5-token example, and the transformers
convention checked against transformers' own logits processors.

Everything is seeded; no timing assertions.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import gate.exactness.collect as mx
import gate.exactness.stats as ex
from gate.core.law import Law, history_counts, law_probs, process
from reference import (LAW_PART_FAULTS, LAW_PRESERVING, Fault, GrammarFn, history, position_law,
                            speculative_sample, table_logits, toy_grammar)
from gate.exactness.verdict import context_test
import unit.test_exactness as test_exactness
from unit.test_exactness import ALPHA, BATCH, DETECT_TV, GAMMA, LENGTH, POWER, V, explain, explicit_tables

memoized_power = test_exactness.memoized_power  # its fixtures, used here too (autouse: memoized power statements)

RULE = SimpleNamespace(significance=ALPHA, power=POWER, detect_tv=DETECT_TV)  # gate's default exactness rule
NEW_FAULTS = list(LAW_PART_FAULTS)

PENALTIES = Law("t1-rep2-pres1-freq1", 1.0, repetition_penalty=2.0, presence_penalty=1.0, frequency_penalty=1.0)
MIN_P = Law("t1-minp0.2", 1.0, min_p=0.2)
PLAIN = Law("t1", 1.0)  # under the toy grammar
ALL_PARTS = Law("t1-all", 1.0, min_p=0.1, repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.5,
                logit_bias=((0, 0.5),))  # every part at once, under the toy grammar


def no_penalties(law: Law) -> Law:
    return replace(law, repetition_penalty=None, presence_penalty=None, frequency_penalty=None)


def table_prompt(target: torch.Tensor) -> list[int]:
    """A prompt that contains the likely tokens: the target's most likely token at each of
    the first gamma + 1 positions (so the repetition penalty moves mass at the first)."""
    return list(dict.fromkeys(target[:GAMMA + 1].argmax(-1).tolist()))


def setup_for(fault: Fault, all_parts: bool) -> tuple[Law, GrammarFn | None]:
    """The law (and grammar) a fault is tested under: its own part set strongly, or every part."""
    if all_parts:
        return ALL_PARTS, toy_grammar(V)
    return {Fault.PENALTY_DRAFT_ONLY: (PENALTIES, None), Fault.PENALTY_STALE_HISTORY: (PENALTIES, None),
            Fault.MIN_P_DRAFT_ONLY: (MIN_P, None), Fault.GRAMMAR_DRAFT_ONLY: (PLAIN, toy_grammar(V))}[fault]


def exact_law(target: torch.Tensor, law: Law, prefix: list[int] | tuple[int, ...], prompt: list[int],
              grammar: GrammarFn | None) -> torch.Tensor:
    """The target's law [V] of the output token after `prefix` (table logits, the law with history)."""
    tokens = torch.tensor([list(prefix) + [0]], dtype=torch.long)
    at = torch.tensor([[len(prefix)]])
    return position_law(table_logits(target)(tokens, at), law, tokens, at, prompt, grammar)[0, 0]


def gate_decision(target: torch.Tensor, draft: torch.Tensor, law: Law, fault: Fault, prompt: list[int],
                  grammar: GrammarFn | None, seed: int, batch: int = BATCH, length: int = LENGTH
                  ) -> tuple[str, list[ex.ExactnessTest]]:
    """Sample with the reference sampler and decide as `gate exactness` does (module docstring)."""
    out = speculative_sample(target, draft, law, GAMMA, batch, length, torch.Generator().manual_seed(seed), fault,
                             prompt, grammar)
    assert int(out.min()) >= 0
    at = torch.arange(length).expand(batch, -1)
    probs = position_law(table_logits(target)(out, at), law, out, at, prompt, grammar)  # [batch, length, V]
    u = mx.randomized_pit(probs.reshape(-1, probs.shape[-1]), out.reshape(-1), torch.Generator().manual_seed(seed + 1))
    tests = [ex.pit_test(u.numpy(), ALPHA, POWER, DETECT_TV)]
    for prefix, nexts in mx.contexts(out.tolist()):
        nt = mx.sparse_counts("p0", nexts, exact_law(target, law, prefix, prompt, grammar), prefix=prefix)
        tests.append(context_test(nt, RULE))
    ex.decide(tests, ALPHA)
    return ex.overall(tests), tests


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a.double() - b.double()).abs().sum())


# 1. The reference sampler's law is gate's law -------------------------------------------


def test_batched_history_equals_gate_law_history_counts():
    """The reference's scatter_add history of every (row, position) is gate.core.law.history_counts
    of that sequence (prompt, then output) at that position."""
    g = torch.Generator().manual_seed(0)
    prompt = [3, 3, 7, 1]
    tokens = torch.randint(0, V, (6, 9), generator=g)
    at = torch.tensor([[0, 4, 8]] * 6)
    seen, counts = history(tokens, at, prompt, V)
    assert seen.shape == counts.shape == (6, 3, V)
    for b in range(6):
        ids = prompt + tokens[b].tolist()
        for j, a in enumerate(at[b].tolist()):
            s, c = history_counts(ids, len(prompt) + a, 1, len(prompt), V)
            s, c = s[0], c[0]
            assert torch.equal(seen[b, j], s) and torch.equal(counts[b, j], c)
    assert not seen[0, 0, 0] and seen[0, 0, 3] and counts[0, 0].sum() == 0  # at 0: the prompt only


@pytest.mark.parametrize("law", [PENALTIES, ALL_PARTS], ids=lambda law: law.name)
def test_position_law_equals_law_probs_of_the_bound_request(law):
    """Row by row, the reference's batched law is gate.core.law.law_probs of the bound request
    (teacher-forced over one sequence), grammar aside (law_probs takes a Matcher)."""
    target, _ = explicit_tables()
    prompt = table_prompt(target)
    tokens = torch.randint(0, V, (4, LENGTH), generator=torch.Generator().manual_seed(1))
    at = torch.arange(LENGTH).expand(4, -1)
    batched = position_law(table_logits(target)(tokens, at), law, tokens, at, prompt)
    for b in range(4):
        ids = prompt + tokens[b].tolist()
        single = law_probs(target[:LENGTH], law.bind(len(prompt)), ids, len(prompt))
        assert torch.allclose(batched[b], single, atol=1e-6)


def test_toy_grammar_depends_on_the_prefix_and_leaves_two_tokens():
    grammar = toy_grammar(V)
    tokens = torch.randint(0, V, (500, LENGTH), generator=torch.Generator().manual_seed(2))
    at = torch.arange(LENGTH).expand(500, -1)
    mask = grammar(tokens, at)
    assert mask.shape == (500, LENGTH, V) and int(mask.sum(-1).min()) >= 2
    assert (mask[:, 0] == (torch.arange(V) % 2 == 0)).all()  # the first token is even
    for t in range(1, LENGTH):
        assert len({tuple(m) for m in mask[:, t].tolist()}) > 1  # the same position, masks that differ by prefix
    prev = tokens[:, 1]
    assert not mask[torch.arange(500), 2, (prev + 1) % V].any() and not mask[torch.arange(500), 2, (prev + 2) % V].any()
    odd_zeros = (tokens[:, :3] == 0).sum(-1) % 2 == 1
    step = (V - 1 - tokens[:, 2]) % V
    assert torch.equal(mask[:, 3, V - 1], odd_zeros & (step != 1) & (step != 2))


def test_a_fault_in_a_part_the_law_lacks_is_refused():
    target, draft = explicit_tables()
    for fault in NEW_FAULTS:
        with pytest.raises(ValueError, match=fault.value):
            speculative_sample(target, draft, PLAIN, GAMMA, 4, LENGTH, torch.Generator().manual_seed(0), fault)
    assert not LAW_PRESERVING & set(NEW_FAULTS)


# 2. The faults change the law; gate's decision fails them, passes the correct sampler -


@pytest.mark.parametrize("fault", [f for f in NEW_FAULTS if f is not Fault.PENALTY_STALE_HISTORY], ids=lambda f: f.value)
def test_fault_moves_the_first_position_law_by_at_least_detect_tv(fault):
    """The output follows the verifier's p, so the first-position TV of the fault is the TV
    between the target's law with and without the part the fault takes from p."""
    target, _ = explicit_tables()
    law, grammar = setup_for(fault, False)
    prompt = table_prompt(target)
    right = exact_law(target, law, (), prompt, grammar)
    wrong_law = {Fault.PENALTY_DRAFT_ONLY: no_penalties(law), Fault.MIN_P_DRAFT_ONLY: replace(law, min_p=None)}.get(fault, law)
    wrong = exact_law(target, wrong_law, (), prompt, None if fault is Fault.GRAMMAR_DRAFT_ONLY else grammar)
    assert tv(right, wrong) >= DETECT_TV
    assert int((right > 0).sum()) >= 2  # the law keeps a real choice


def test_stale_history_moves_the_law_after_a_proposal():
    """The first position always starts a block (a stale history is the right one there);
    at the second, after the target's likeliest first token, the history without it (the
    prompt alone) gives a law >= detect_tv away, and the sampled output shows it."""
    target, draft = explicit_tables()
    prompt = table_prompt(target)
    first = int(exact_law(target, PENALTIES, (), prompt, None).argmax())
    right = exact_law(target, PENALTIES, (first,), prompt, None)
    stale = position_law(target[1][None, None], PENALTIES, torch.tensor([[first, 0]]), torch.tensor([[1]]), prompt, None,
                         history_at=torch.tensor([[0]]))[0, 0]  # the second position's logits, the prompt's history
    assert tv(right, stale) >= DETECT_TV
    out = speculative_sample(target, draft, PENALTIES, GAMMA, 10_000, 2, torch.Generator().manual_seed(3),
                             Fault.PENALTY_STALE_HISTORY, prompt)
    again = speculative_sample(target, draft, PENALTIES, GAMMA, 10_000, 2, torch.Generator().manual_seed(3), Fault.NONE,
                               prompt)
    freq = lambda o: torch.bincount(o[o[:, 0] == first, 1], minlength=V).double() / int((o[:, 0] == first).sum())  # noqa: E731
    assert tv(freq(out), right) > 0.05 > tv(freq(again), right)  # proposals are accepted often: most of it shows


@pytest.mark.parametrize("all_parts", [False, True], ids=["own-part", "all-parts"])
@pytest.mark.parametrize("fault", NEW_FAULTS, ids=lambda f: f.value)
def test_gate_fails_each_law_fault_at_5000_tokens(fault, all_parts):
    target, draft = explicit_tables()
    law, grammar = setup_for(fault, all_parts)
    verdict, tests = gate_decision(target, draft, law, fault, table_prompt(target), grammar, seed=100)
    assert sum(t.n for t in tests if t.name == "pit-ks") == BATCH * LENGTH
    assert verdict == ex.FAIL, explain(tests)


@pytest.mark.parametrize("law,grammar", [(PENALTIES, None), (MIN_P, None), (PLAIN, toy_grammar(V)),
                                         (ALL_PARTS, toy_grammar(V))], ids=["penalties", "min-p", "grammar", "all-parts"])
def test_gate_passes_the_correct_sampler_under_the_same_law(law, grammar):
    target, draft = explicit_tables()
    verdict, tests = gate_decision(target, draft, law, Fault.NONE, table_prompt(target), grammar, seed=100)
    assert verdict == ex.PASS, explain(tests)
    claims = [t for t in tests if t.role == ex.CLAIM]
    assert len(claims) == 1 and claims[0].n == BATCH and claims[0].detectable <= DETECT_TV, explain(tests)
    assert len(tests) > 2  # later positions were tested too (evidence)


# 3. The same on the tiny random Llama's teacher-forced logits --------------------------

TINY_PENALTIES = Law("t0.1-k8-rep2-pres1-freq1", 0.1, top_k=8, repetition_penalty=2.0, presence_penalty=1.0,
                     frequency_penalty=1.0)
TINY_MIN_P = Law("t0.1-k8-minp0.3", 0.1, top_k=8, min_p=0.3)
TINY_PLAIN = Law("t0.1-k8", 0.1, top_k=8)


def tiny_setup(fault: Fault) -> tuple[Law, GrammarFn | None]:
    return {Fault.PENALTY_DRAFT_ONLY: (TINY_PENALTIES, None), Fault.PENALTY_STALE_HISTORY: (TINY_PENALTIES, None),
            Fault.MIN_P_DRAFT_ONLY: (TINY_MIN_P, None), Fault.GRAMMAR_DRAFT_ONLY: (TINY_PLAIN, toy_grammar(96))}[fault]


# 4. The law itself, by hand --------------------------------------------------------------


def test_vllm_order_by_hand_on_five_tokens():
    """Raw logits [2, -1, 0.5, 1.5, -0.5]; prompt [0, 1], output so far [3, 3, 1]. vLLM's
    order: logit bias (+0.9 on token 4: 0.4), penalties (repetition 1.5 on prompt + output
    {0, 1, 3}: 2 -> 2/1.5, -1 -> -1.5, 1.5 -> 1.0; presence 0.2 and frequency 0.1 on the
    output {3: 2, 1: 1}: 1.0 - 0.2 - 0.2 = 0.6, -1.5 - 0.2 - 0.1 = -1.8), temperature 0.5
    ([2.667, -3.6, 1.0, 1.2, 0.8]), min-p 0.1 (token 1: e^-3.6 / e^2.667 = 0.002 < 0.1, cut;
    token 4: e^0.8 / e^2.667 = 0.155, kept), top-k 3 (cuts token 4), top-p 0.8 (of the
    rest, 0: 0.704, 3: 0.163, 2: 0.133; the smallest set reaching 0.8 is {0, 3})."""
    logits = torch.tensor([2.0, -1.0, 0.5, 1.5, -0.5])
    law = Law("hand", 0.5, top_k=3, top_p=0.8, min_p=0.1, repetition_penalty=1.5, presence_penalty=0.2,
              frequency_penalty=0.1, logit_bias=((4, 0.9),))
    ids = [0, 1, 3, 3, 1]
    got = law_probs(logits, law.bind(2), ids)
    x0, x3 = (2.0 / 1.5) / 0.5, (1.5 / 1.5 - 0.2 - 2 * 0.1) / 0.5
    expect = torch.tensor([np.exp(x0), 0.0, 0.0, np.exp(x3), 0.0], dtype=torch.float64)
    assert torch.allclose(got.double(), expect / expect.sum(), atol=1e-6)
    # each step matters: without the penalties token 3 keeps more mass, without top-p token 2 stays
    assert float(law_probs(logits, no_penalties(law))[3]) > float(got[3]) + 0.05
    assert float(law_probs(logits, replace(law, top_p=None).bind(2), ids)[2]) > 0
    # the repetition penalty of both signs, alone, at temperature 1
    rep = law_probs(logits, Law("rep", 1.0, repetition_penalty=1.5).bind(2), ids)
    assert torch.allclose(rep, torch.tensor([2.0 / 1.5, -1.5, 0.5, 1.0, -0.5]).softmax(-1), atol=1e-6)


def test_transformers_convention_puts_min_p_after_top_p():
    """Probabilities [0.5, 0.2, 0.15, 0.1, 0.05], min-p 0.25 (cut below 0.125), top-p 0.75.
    vLLM: min-p first keeps {0, 1, 2} (0.588, 0.235, 0.176 renormalised), then top-p keeps
    {0, 1}. transformers: top-p first keeps {0, 1, 2} (0.85 >= 0.75 with token 2, 0.7
    without), then min-p keeps them all. Without top-p both agree."""
    logits = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]).log()
    vllm = process(logits, Law("v", 1.0, top_p=0.75, min_p=0.25))
    hf = process(logits, Law("h", 1.0, top_p=0.75, min_p=0.25, convention="transformers"))
    assert torch.allclose(vllm, torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7, atol=1e-6)
    assert torch.allclose(hf, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85, atol=1e-6)
    assert torch.allclose(process(logits, Law("v", 1.0, min_p=0.25)),
                          process(logits, Law("h", 1.0, min_p=0.25, convention="transformers")))
    with pytest.raises(ValueError, match="presence or frequency"):
        Law("h", 1.0, presence_penalty=0.5, convention="transformers")


def test_transformers_convention_equals_transformers_logits_processors():
    """The transformers convention against transformers' own processors, in the order
    GenerationMixin._get_logits_processor builds them (sequence bias, repetition penalty,
    temperature, top-k, top-p, min-p), on random logits and histories."""
    from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                        SequenceBiasLogitsProcessor, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    g = torch.Generator().manual_seed(4)
    law = Law("hf", 0.7, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3, logit_bias=((5, 2.0), (9, -1.5)),
              convention="transformers")
    processors = [SequenceBiasLogitsProcessor({(5,): 2.0, (9,): -1.5}), RepetitionPenaltyLogitsProcessor(1.3),
                  TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)]
    for _ in range(5):
        ids = torch.randint(0, 32, (1, 12), generator=g)
        logits = torch.randn(1, 32, generator=g) * 3
        scores = logits.clone()
        for proc in processors:
            scores = proc(ids, scores)
        ours = law_probs(logits[0], law.bind(6), ids[0].tolist())
        assert torch.allclose(ours, scores.softmax(-1)[0], atol=1e-6)
