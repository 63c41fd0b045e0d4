"""Target identity (gate.loop.identity): unchanged vs updated target against a pinned release,
with the probe and the drift along the workload. Tiny random-weight models, CPU only."""

from __future__ import annotations

import math

import pytest
import torch

from gate.core.law import Law
from gate.loop import identity

LOOKUP = "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n"
LAWS = "  - temperature: 0\n  - {temperature: 1.0, top_k: 8}\n"
DRIFT_RULES = (
    "  - id: drift-tv\n    metric: target_drift_tv\n    aggregation: mean\n    comparison: '<='\n    threshold: 0.05\n"
    "  - id: drift-top1\n    metric: target_drift_top1\n    aggregation: mean\n    comparison: '>='\n    threshold: 0.5\n"
    "  - id: drift-kl\n    metric: target_drift_kl\n    aggregation: mean\n    comparison: '<='\n    threshold: 0.5\n")


# --- the pure functions -------------------------------------------------------------------------------------------

def test_tv_and_kl_on_known_values():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]])
    assert identity.tv_distance(p, q).tolist() == [0.0, 1.0]  # identical laws: 0; disjoint: 1 (the bound)
    kl = identity.kl_divergence(p, q).tolist()
    assert kl[0] == 0.0 and math.isinf(kl[1])  # p puts mass where q has none: +inf
    r = torch.tensor([[0.75, 0.25]])
    s = torch.tensor([[0.5, 0.5]])
    assert identity.tv_distance(r, s).item() == pytest.approx(0.25)
    assert identity.kl_divergence(r, s).item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    # zeros of p count 0 (0 log 0 = 0), whatever q is there
    assert identity.kl_divergence(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]])).item() == pytest.approx(math.log(2))


def test_random_laws_tv_bounded_kl_nonnegative():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(50, 40, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(50, 40, generator=g) * 3, -1)
    tv, kl = identity.tv_distance(p, q), identity.kl_divergence(p, q)
    assert ((tv > 0) & (tv <= 1)).all() and (kl >= 0).all()
    assert (tv <= torch.sqrt(kl / 2) + 1e-9).all()  # Pinsker's inequality
    assert identity.kl_divergence(p, p).abs().max().item() < 1e-12


def test_sparse_tv_brackets_the_exact_tv():
    g = torch.Generator().manual_seed(1)
    release, loaded = torch.randn(7, 60, generator=g) * 2, torch.randn(7, 60, generator=g) * 2
    for k in (3, 10, 60):
        seq = identity.compact("x", list(range(7)), release, k)
        low, high = identity.sparse_tv(seq, loaded)
        exact = identity.tv_distance(torch.softmax(release.double(), -1), torch.softmax(loaded.double(), -1))
        assert (low <= exact + 1e-9).all() and (exact <= high + 1e-9).all()
        if k == 60:  # the whole vocabulary stored: the bounds meet
            assert torch.allclose(low, high) and torch.allclose(low, exact)


def test_drift_along_under_greedy_and_sampling_laws():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(5, 30, generator=g) * 3
    tv, kl, top1 = identity.drift_along(a, a.clone(), Law("t1", 1.0))
    assert max(tv) == 0 and max(kl) == 0 and all(top1)
    b = a.clone()
    b[0] = -b[0]  # the argmax moves at position 0 only
    tv, kl, top1 = identity.drift_along(b, a, Law("greedy", 0.0))
    assert tv[0] == 1.0 and kl[0] is None and top1[0] is False  # greedy: one-hot laws, an infinite KL is None
    assert tv[1:] == [0.0] * 4 and kl[1:] == [0.0] * 4 and all(top1[1:])


# --- end to end through gate check ----------------------------------------------------------------------------------


# --- bad input ------------------------------------------------------------------------------------------------------


