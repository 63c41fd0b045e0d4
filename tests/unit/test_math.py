"""Pure math on hand-computed values: the law, overlap, the verification step, counters."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from gate.core.law import Law, law_probs
from gate.measure.overlap import overlap, position_overlaps
from gate.records import RequestRecord, SpecDecodeCounters
from gate.core.speculative import verify

GREEDY = Law("greedy", 0.0)


def test_identical_laws_overlap_one_disjoint_zero():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    assert overlap(p, p).item() == pytest.approx(1.0)
    assert overlap(torch.tensor([0.5, 0.5, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.7, 0.3])).item() == 0.0
    # hand computed: min(.5,.2)+min(.3,.3)+min(.2,.5) = .2+.3+.2
    assert overlap(p[:3], torch.tensor([0.2, 0.3, 0.5])).item() == pytest.approx(0.7)


def test_point_mass_overlap_is_p_of_the_token_and_no_proposal_is_none():
    p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    ov, top1 = position_overlaps(p, q)
    assert ov[0] == pytest.approx(0.3) and top1[0] is False
    assert ov[1] is None and top1[1] is None


def test_greedy_law_is_one_hot_argmax_ties_to_lowest_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, -1.0]])
    assert law_probs(logits, GREEDY).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_temperature_top_k_top_p_as_hugging_face_warpers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    law = Law("t", 0.7, top_k=20, top_p=0.8)
    ours = law_probs(logits, law)
    x = TemperatureLogitsWarper(0.7)(None, logits.clone())
    x = TopKLogitsWarper(20)(None, x)
    x = TopPLogitsWarper(0.8)(None, x)
    assert torch.allclose(ours, x.softmax(-1), atol=1e-6)
    assert ((ours > 0).sum(-1) <= 20).all()


def _verify_many(p, q, n=20000, seed=0):
    """Empirical law of the first committed token of one-proposal steps."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[1])
    for _ in range(n):
        x = torch.multinomial(q[0], 1, generator=g)
        v = verify(p, q, x, g)
        counts[int(x.item()) if v.accepted else v.next_token] += 1
    return counts


def test_verification_reproduces_the_target_law():
    # residual max(0, p - q) has two tokens in its support (0 and 3)
    p = torch.tensor([[0.4, 0.1, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.5, 0.3, 0.1]])
    counts = _verify_many(p, q)
    result = stats.chisquare(counts.numpy(), (p[0] * counts.sum()).numpy())
    assert result.pvalue > 1e-3
    # the accept probability is the overlap sum min(p, q) = 0.1+0.1+0.2+0.1 = 0.5


def test_greedy_verification_accepts_while_equal_to_argmax():
    p = law_probs(torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0]]), GREEDY)
    q = law_probs(torch.tensor([[0.0, 2.0, 1.0], [0.0, 3.0, 0.0]]), GREEDY)
    v = verify(p, q, torch.tensor([1, 1]), None)
    assert (v.accepted, v.next_token) == (1, 0)  # second proposal wrong: corrected to argmax 0
    v = verify(p, law_probs(torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]), GREEDY), torch.tensor([1, 0]), None)
    assert (v.accepted, v.next_token) == (2, 2)  # all accepted: bonus = argmax of the last row


def test_counters_pool_and_identities():
    a = SpecDecodeCounters.from_steps([0, 4, 4, 2, 0], [0, 4, 1, 2, 0])
    b = SpecDecodeCounters.from_steps([4, 4], [0, 3])
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens) == (3, 10, 7)
    assert a.num_accepted_tokens_per_pos == [3, 2, 1, 1]
    assert a.accepted_length_histogram == [0, 1, 1, 0, 1]
    total = a + b
    assert (total.num_drafts, total.num_draft_tokens, total.num_accepted_tokens) == (5, 18, 10)
    assert total.acceptance_rate == pytest.approx(10 / 18)
    # vLLM identity: mean acceptance length = 1 + sum of per-position acceptance rates
    assert total.mean_acceptance_length == pytest.approx(1 + sum(total.acceptance_rate_per_pos))
    assert sum(total.accepted_length_histogram) == total.num_drafts
    assert math.isnan(SpecDecodeCounters().acceptance_rate)


def _record(times, committed):
    n = sum(committed)
    return RequestRecord("d", "greedy", "p", "c", n, 0, 5, list(range(n)), times, committed, [0] * len(committed),
                         [0] * len(committed), "length", times[-1] + 1.0, 4, 0, 0, 0)


def test_itl_conventions_and_tpot():
    # prefill commits 1 at 10 ms, a step commits 3 at 40 ms, another 1 at 55 ms; E2E 56 ms
    r = _record([10.0, 40.0, 40.0, 40.0, 55.0], [1, 3, 1])
    assert r.ttft_ms == 10.0
    assert r.itl_ms == [30.0, 0.0, 0.0, 15.0]
    assert r.itl_chunk_ms == [30.0, 15.0]
    assert r.tpot_ms == pytest.approx((56.0 - 10.0) / 4)
    assert r.committed_tokens_per_s == pytest.approx(5 / 0.056)
