"""Mutation tests of gate's exactness statistics (gate.exactness.collect, gate.exactness.stats) against the
reference speculative sampler (reference) with injected faults.

The combined test is what `gate check` runs for a sampling law: the PIT Kolmogorov-Smirnov
test over every sampled token plus a next-token G-test at every position, Holm-corrected
together (decide) at significance 0.01, required to detect TV 0.1 with power 0.9.

Sample size: 5,000 sampled tokens per law, laid out as 1,000 sequences x 5 positions. At
500 sequences x 10 positions the per-position G-tests (500 samples each, judged at
0.01 / 11 after Holm) can only detect TV ~0.12, so the correct sampler would be
*inconclusive*, not pass; 1,000 samples per position (judged at 0.01 / 6) detect <= 0.09.

Everything is seeded; no timing assertions.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch

import gate.exactness.collect as mx
import gate.exactness.stats as ex
from conftest import tiny_llama
from gate.core.law import Law, law_probs
from reference import LAW_PART_FAULTS, LAW_PRESERVING, Fault, speculative_sample

ALPHA, POWER, DETECT_TV = 0.01, 0.9, 0.1
GAMMA = 3
V, LENGTH, BATCH = 8, 5, 1000  # 5,000 sampled tokens per law
LAWS = [Law("t0.8-k6", 0.8, top_k=6), Law("t1-p0.9", 1.0, top_p=0.9)]
TABLE_SEED = 2  # explicit tables: target randn * 1.5, draft = target + randn * 1.0
PLAIN_FAULTS = [f for f in Fault if f not in LAW_PART_FAULTS]  # the law-part faults: tests/test_law_mutations.py
FAULTS = [f for f in PLAIN_FAULTS if f not in LAW_PRESERVING]


@pytest.fixture(scope="module", autouse=True)
def memoized_power():
    """gtest_detectable / ks_detectable are pure functions of (n, df, alpha, power) but cost
    ~0.1 s per test through samples_needed; memoize them so the module stays fast."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ex, "gtest_detectable", functools.lru_cache(maxsize=None)(ex.gtest_detectable))
        mp.setattr(ex, "ks_detectable", functools.lru_cache(maxsize=None)(ex.ks_detectable))
        yield


def combined(target: torch.Tensor, draft: torch.Tensor, law: Law, fault: Fault, batch: int, length: int, seed: int,
             alpha: float = ALPHA) -> tuple[str, list[ex.ExactnessTest]]:
    """Sample with the reference sampler, run PIT-KS over all tokens plus a next-token
    G-test per position, Holm via decide; the overall verdict as gate's rule forms it."""
    tokens = speculative_sample(target, draft, law, GAMMA, batch, length, torch.Generator().manual_seed(seed), fault)
    assert int(tokens.min()) >= 0
    p = law_probs(target[:length], law)
    u = mx.randomized_pit(p.repeat(batch, 1), tokens.reshape(-1), torch.Generator().manual_seed(seed + 1))
    tests = [ex.pit_test(u.numpy(), alpha, POWER, DETECT_TV)]
    for t in range(length):
        counts = np.bincount(tokens[:, t].numpy(), minlength=p.shape[-1])
        tests.append(ex.next_token_test(counts, p[t].double().numpy(), alpha, POWER, DETECT_TV, name=f"next-token[{t}]"))
    ex.decide(tests, alpha)
    return ex.overall(tests), tests


def explain(tests: list[ex.ExactnessTest]) -> str:
    return "; ".join(f"{t.name}: p={t.pvalue:.3g} holm={t.adjusted_pvalue:.3g} n={t.n} df={t.df} "
                     f"detectable={t.detectable:.3f} {t.verdict}" for t in tests)


def residual_support(target: torch.Tensor, draft: torch.Tensor, law: Law) -> torch.Tensor:
    """Number of tokens with max(0, p - q) > 0, per position."""
    return ((law_probs(target, law) - law_probs(draft, law)).clamp_min(0.0) > 0).sum(-1)


# 1. Explicit small distributions ------------------------------------------------------


# 2. Position-dependent distributions from tiny random-weight models ------------------

TINY_LAW = Law("t0.1-k8", 0.1, top_k=8)  # random-init logits have std ~0.1: sharpen, keep 8 tokens


@pytest.fixture(scope="module")
def tiny_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced logits [LENGTH + gamma + 1, 96] of tiny_llama(0) (target) and of its
    early exit after layer 1 (same embeddings, final norm and head: a correlated draft)."""
    target = tiny_llama(0)
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:1]
    draft.config.num_hidden_layers = 1
    ids = torch.randint(4, 96, (1, LENGTH + GAMMA + 1), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return target(input_ids=ids).logits[0].float(), draft(input_ids=ids).logits[0].float()


def test_tiny_model_tables_are_informative(tiny_tables):
    target, draft = tiny_tables
    assert target.shape == draft.shape == (LENGTH + GAMMA + 1, 96)
    p, q = law_probs(target, TINY_LAW), law_probs(draft, TINY_LAW)
    assert ((p > 0).sum(-1) == 8).all()
    assert (residual_support(target, draft, TINY_LAW) >= 2).all()
    tv = 0.5 * (p - q).abs().sum(-1)
    assert (tv > 0.05).all() and (tv < 0.9).all()
    assert not torch.allclose(p[0], p[1])  # position dependent


@pytest.mark.parametrize("fault", PLAIN_FAULTS, ids=lambda f: f.value)
def test_combined_test_on_tiny_model_tables(tiny_tables, fault):
    target, draft = tiny_tables
    verdict, tests = combined(target, draft, TINY_LAW, fault, BATCH, LENGTH, seed=500)
    if fault in LAW_PRESERVING:
        assert verdict == ex.PASS, explain(tests)
    else:
        assert verdict == ex.FAIL, explain(tests)


# 3. False alarms ----------------------------------------------------------------------


# 4. Power claims, Holm, PIT, support -------------------------------------------------


# 5. Too few samples -------------------------------------------------------------------


