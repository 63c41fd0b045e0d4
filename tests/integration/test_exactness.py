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

import pytest
import torch

import gate.exactness.stats as ex
from conftest import tiny_llama
from gate.core.law import Law, law_probs
from reference import LAW_PART_FAULTS, LAW_PRESERVING, Fault
from unit.test_exactness import combined, explain, memoized_power, residual_support  # noqa: F401 - shared with that tier

ALPHA, POWER, DETECT_TV = 0.01, 0.9, 0.1
GAMMA = 3
V, LENGTH, BATCH = 8, 5, 1000  # 5,000 sampled tokens per law
LAWS = [Law("t0.8-k6", 0.8, top_k=6), Law("t1-p0.9", 1.0, top_p=0.9)]
TABLE_SEED = 2  # explicit tables: target randn * 1.5, draft = target + randn * 1.0
PLAIN_FAULTS = [f for f in Fault if f not in LAW_PART_FAULTS]  # the law-part faults: tests/{unit,integration}/test_law_mutations.py
FAULTS = [f for f in PLAIN_FAULTS if f not in LAW_PRESERVING]


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


