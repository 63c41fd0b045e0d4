"""The tests of tests/unit/test_exactness.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import copy

import pytest
import torch

import gate.exactness.stats as ex
from conftest import tiny_llama
from gate.core.law import law_probs
from reference import LAW_PRESERVING
from unit.test_exactness import combined, explain, memoized_power, residual_support  # noqa: F401 - shared with that tier
from unit.test_exactness import GAMMA, PLAIN_FAULTS, TINY_LAW

ALPHA, POWER, DETECT_TV = 0.01, 0.9, 0.1
V, LENGTH, BATCH = 8, 5, 1000  # 5,000 sampled tokens per law


# 1. Explicit small distributions ------------------------------------------------------


# 2. Position-dependent distributions from tiny random-weight models ------------------


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


