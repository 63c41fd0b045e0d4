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

import functools
import math

import numpy as np
import pytest
import torch
from scipy import stats

import gate.exactness.collect as mx
import gate.exactness.stats as ex
from gate.core.law import Law, law_probs
from reference import LAW_PART_FAULTS, LAW_PRESERVING, Fault, speculative_sample

ALPHA, POWER, DETECT_TV = 0.01, 0.9, 0.1
GAMMA = 3
V, LENGTH, BATCH = 8, 5, 1000  # 5,000 sampled tokens per law
LAWS = [Law("t0.8-k6", 0.8, top_k=6), Law("t1-p0.9", 1.0, top_p=0.9)]
TABLE_SEED = 2  # explicit tables: target randn * 1.5, draft = target + randn * 1.0
PLAIN_FAULTS = [f for f in Fault if f not in LAW_PART_FAULTS]  # the law-part faults: tests/{unit,integration}/test_law_mutations.py
FAULTS = [f for f in PLAIN_FAULTS if f not in LAW_PRESERVING]


@pytest.fixture(scope="module", autouse=True)
def memoized_power():
    """gtest_detectable / ks_detectable are pure functions of (n, df, alpha, power) but cost
    ~0.1 s per test through samples_needed; memoize them so the module stays fast."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ex, "gtest_detectable", functools.lru_cache(maxsize=None)(ex.gtest_detectable))
        mp.setattr(ex, "ks_detectable", functools.lru_cache(maxsize=None)(ex.ks_detectable))
        yield


def explicit_tables(length: int = LENGTH, seed: int = TABLE_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits [length + gamma + 1, V], position dependent."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(length + GAMMA + 1, V, generator=g) * 1.5
    draft = target + torch.randn(length + GAMMA + 1, V, generator=g) * 1.0
    return target, draft


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


@pytest.mark.parametrize("law", LAWS, ids=lambda law: law.name)
def test_explicit_tables_are_informative(law):
    target, draft = explicit_tables()
    p, q = law_probs(target, law), law_probs(draft, law)
    assert ((p > 0).sum(-1) >= 3).all()  # several tokens in the law's support
    assert (residual_support(target, draft, law) >= 2).all()  # a residual draw is a real choice everywhere
    tv = 0.5 * (p - q).abs().sum(-1)
    assert (tv > 0.05).all() and (tv < 0.9).all()  # drafts neither perfect nor useless


@pytest.mark.parametrize("fault", PLAIN_FAULTS, ids=lambda f: f.value)
@pytest.mark.parametrize("law", LAWS, ids=lambda law: law.name)
def test_combined_test_catches_every_fault_at_5000_tokens(law, fault):
    target, draft = explicit_tables()
    verdict, tests = combined(target, draft, law, fault, BATCH, LENGTH, seed=100)
    assert sum(t.n for t in tests[1:]) == tests[0].n == BATCH * LENGTH
    if fault in LAW_PRESERVING:
        assert verdict == ex.PASS, explain(tests)
        assert all(t.detectable <= DETECT_TV for t in tests), explain(tests)
    else:
        assert verdict == ex.FAIL, explain(tests)


# 2. Position-dependent distributions from tiny random-weight models ------------------

TINY_LAW = Law("t0.1-k8", 0.1, top_k=8)  # random-init logits have std ~0.1: sharpen, keep 8 tokens


# 3. False alarms ----------------------------------------------------------------------


def test_false_alarm_rate_of_the_correct_sampler():
    """200 independent runs of 200 sequences x 5 positions (1,000 tokens), alternating the
    two laws: the combined test at significance 0.05 fails at most 0.05 + 3 SE of them.
    (At 100 samples per position the asymptotic G-test is slightly liberal in the tail:
    measured family-wise rate ~0.06 over 800 runs; at 200 it is ~0.05.)"""
    target, draft = explicit_tables()
    runs, level = 200, 0.05
    failures = sum(combined(target, draft, LAWS[r % 2], Fault.NONE, 200, LENGTH, seed=10_000 + 7 * r, alpha=level)[0]
                   == ex.FAIL for r in range(runs))
    bound = level + 3 * math.sqrt(level * (1 - level) / runs)
    assert failures / runs <= bound, f"{failures} of {runs} correct runs failed"


# 4. Power claims, Holm, PIT, support -------------------------------------------------


@pytest.mark.parametrize("n", [300, 1000])
def test_gtest_power_at_least_favourable_alternative(n):
    """At TV d = gtest_detectable(n, df), Cauchy-Schwarz is tight when |q - p| = 2 d p with
    each sign on half the mass: the noncentrality is exactly 4 n d^2, so the empirical
    power must reach the stated power (up to sampling error)."""
    p = np.array([0.3, 0.2, 0.25, 0.25])
    df = 3
    d = ex.gtest_detectable(n, df, ALPHA, POWER)
    q = p * np.array([1 + 2 * d, 1 + 2 * d, 1 - 2 * d, 1 - 2 * d])
    assert 0.5 * np.abs(q - p).sum() == pytest.approx(d)
    assert n * (((q - p) ** 2) / p).sum() == pytest.approx(4 * n * d * d)
    runs = 2000
    counts = np.random.default_rng(n).multinomial(n, q, size=runs)
    tests = [ex.next_token_test(c, p, ALPHA, POWER, DETECT_TV) for c in counts]
    assert {t.df for t in tests} == {df} and all(t.detectable == pytest.approx(d) for t in tests)
    rate = np.mean([t.pvalue < ALPHA for t in tests])
    assert rate >= POWER - 3 * math.sqrt(POWER * (1 - POWER) / runs), rate


def test_gtest_power_moving_mass_between_the_two_most_likely_tokens():
    n = 1000
    p = np.array([0.4, 0.3, 0.2, 0.1])
    d = ex.gtest_detectable(n, 3, ALPHA, POWER)
    q = p + np.array([-d, d, 0.0, 0.0])
    runs = 1000
    counts = np.random.default_rng(1).multinomial(n, q, size=runs)
    rate = np.mean([ex.next_token_test(c, p, ALPHA, POWER, DETECT_TV).pvalue < ALPHA for c in counts])
    assert rate >= POWER - 3 * math.sqrt(POWER * (1 - POWER) / runs), rate


def test_gtest_null_rejection_rate():
    n, p, runs = 1000, np.array([0.4, 0.3, 0.2, 0.1]), 1000
    counts = np.random.default_rng(2).multinomial(n, p, size=runs)
    rate = np.mean([ex.next_token_test(c, p, 0.05, POWER, DETECT_TV).pvalue < 0.05 for c in counts])
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs), rate


@pytest.mark.parametrize("n", [300, 2000])
def test_ks_power_at_stated_pit_distance(n):
    """PIT values whose CDF is D = ks_detectable(n) from uniform at x = 1/2 (density
    1 + 2D below 1/2, 1 - 2D above): rejected with at least the stated power."""
    D = ex.ks_detectable(n, ALPHA, POWER)
    assert 0 < D < 0.5
    rng = np.random.default_rng(n)
    runs, rejected = 400, 0
    for _ in range(runs):
        low = rng.random(n) < 0.5 + D
        u = np.where(low, 0.5 * rng.random(n), 0.5 + 0.5 * rng.random(n))
        t = ex.pit_test(u, ALPHA, POWER, DETECT_TV)
        assert t.detectable == pytest.approx(D)
        rejected += t.pvalue < ALPHA
    assert rejected / runs >= POWER - 3 * math.sqrt(POWER * (1 - POWER) / runs)


def test_stated_power_shrinks_with_n_and_samples_needed_is_consistent():
    for detectable, needed, args in [(ex.gtest_detectable, ex.gtest_samples_needed, (3, ALPHA, POWER)),
                                     (ex.ks_detectable, ex.ks_samples_needed, (ALPHA, POWER))]:
        values = [detectable(n, *args) for n in (100, 1000, 10_000)]
        assert values[0] > values[1] > values[2]
        n = needed(DETECT_TV, *args)
        assert detectable(n, *args) <= DETECT_TV < detectable(n - 1, *args)


def test_holm_against_hand_computation():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> max(0.06, 0.04)
    assert ex.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert ex.holm([0.5, 0.6]) == [1.0, 1.0]
    assert ex.holm([0.01, 0.01, 0.2]) == pytest.approx([0.03, 0.03, 0.2])
    assert ex.holm([]) == []


def test_decide_uses_holm_adjusted_pvalues():
    tests = [ex.ExactnessTest(f"t{i}", "g", 3, 1.0, pv, 10_000, DETECT_TV, POWER) for i, pv in enumerate([0.004, 0.006])]
    for t in tests:
        t.state_power(ALPHA)
    ex.decide(tests, ALPHA)
    # 0.004 x 2 = 0.008 < 0.01 fails; 0.006 is adjusted to max(0.008, 0.006 x 1) = 0.008 and fails too
    assert [t.verdict for t in tests] == [ex.FAIL, ex.FAIL]
    tests = [ex.ExactnessTest(f"t{i}", "g", 3, 1.0, pv, 10_000, DETECT_TV, POWER) for i, pv in enumerate([0.006, 0.5])]
    ex.decide(tests, ALPHA)
    assert [t.verdict for t in tests] == [ex.PASS, ex.PASS]  # 0.012 >= 0.01; 10,000 samples detect TV 0.1
    assert all(t.detectable == pytest.approx(ex.gtest_detectable(10_000, 3, ALPHA / 2, POWER)) for t in tests)


def test_decide_keeps_one_token_law_and_states_samples_needed_at_the_holm_level():
    one = ex.next_token_test([200, 0, 0], [1.0, 0.0, 0.0], ALPHA, POWER, DETECT_TV)
    few = ex.next_token_test([3, 0, 0, 0], [0.25] * 4, ALPHA, POWER, DETECT_TV)  # nothing detectable yet
    pit = ex.pit_test(np.random.default_rng(0).random(50), ALPHA, POWER, DETECT_TV)
    ex.decide([one, few, pit], ALPHA)
    assert one.verdict == ex.PASS and one.detectable == 0.0  # any other token would have failed at once
    assert few.verdict == ex.INCONCLUSIVE and math.isinf(few.detectable)
    assert few.samples_needed == ex.gtest_samples_needed(DETECT_TV, 3, ALPHA / 3, POWER)
    assert pit.samples_needed == ex.ks_samples_needed(DETECT_TV, ALPHA / 3, POWER)


def test_randomized_pit_is_uniform_under_the_null_with_ties_and_truncation():
    g = torch.Generator().manual_seed(0)
    T = 4000
    logits = torch.randn(T, 12, generator=g) * 2.0
    logits[:, 6:] = logits[:, :1]  # ties with the first token
    probs = law_probs(logits, Law("t", 0.9, top_k=9, top_p=0.95))
    tokens = torch.multinomial(probs, 1, generator=g).squeeze(-1)
    u = mx.randomized_pit(probs, tokens, g).numpy()
    assert not np.isnan(u).any() and (u >= 0).all() and (u <= 1).all()
    assert stats.kstest(u, "uniform").pvalue > 0.01
    t = ex.pit_test(u, ALPHA, POWER, DETECT_TV)
    assert t.pvalue > 0.01 and t.n == T


def test_randomized_pit_of_an_impossible_token_is_nan_and_fails():
    probs = law_probs(torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]] * 3), Law("k2", 1.0, top_k=2))
    u = mx.randomized_pit(probs, torch.tensor([0, 1, 4]), torch.Generator().manual_seed(0))
    assert not math.isnan(u[0]) and not math.isnan(u[1]) and math.isnan(u[2])
    assert 0 <= float(u[0]) <= float(probs[0, 0]) <= float(u[1]) <= 1  # rank 0 then rank 1
    t = ex.pit_test(u.numpy(), ALPHA, POWER, DETECT_TV)
    assert t.pvalue == 0.0
    assert ex.decide([t], ALPHA)[0].verdict == ex.FAIL


def test_next_token_test_fails_on_a_sample_outside_the_support():
    p = law_probs(torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5]), Law("k3", 1.0, top_k=3)).double().numpy()
    counts = np.round(p * 5000).astype(int)
    clean = ex.next_token_test(counts, p, ALPHA, POWER, DETECT_TV)
    counts[4] += 1  # one sample beyond top-k
    bad = ex.next_token_test(counts, p, ALPHA, POWER, DETECT_TV)
    assert clean.pvalue > 0.5 and bad.pvalue == 0.0 and "outside" in bad.note
    assert [t.verdict for t in ex.decide([clean, bad], ALPHA)] == [ex.PASS, ex.FAIL]


def test_next_token_test_with_tiny_counts_uses_the_exact_test():
    p = np.full(6, 1 / 6)
    t = ex.next_token_test([7, 0, 0, 0, 0, 0], p, ALPHA, POWER, DETECT_TV, rng=np.random.default_rng(0))
    assert "Monte Carlo" in t.note and t.pvalue < 0.001  # 7 draws on one of 6 equally likely tokens
    t = ex.next_token_test([2, 1, 1, 1, 1, 1], p, ALPHA, POWER, DETECT_TV, rng=np.random.default_rng(0))
    assert t.pvalue > 0.5


def test_stated_gtest_power_counts_the_pooled_mass():
    """Mass moved inside the pooled cell is invisible to the G-test: the stated detectable
    TV must not claim such an alternative (it adds the pooled mass)."""
    n = 1000
    p = np.array([0.45, 0.45] + [0.1 / 80] * 80)  # 80 rare tokens (expected 1.25 each) are pooled
    q = p.copy()
    q[2:] = 0.0
    q[2] = 0.1  # all the rare mass on one rare token: TV ~0.099, not detectable by the pooled test
    tv = 0.5 * np.abs(q - p).sum()
    counts = np.random.default_rng(3).multinomial(n, q, size=200)
    tests = [ex.next_token_test(c, p, ALPHA, POWER, DETECT_TV) for c in counts]
    assert np.mean([t.pvalue < ALPHA for t in tests]) < POWER  # the test indeed misses it ...
    assert tests[0].detectable >= tv and tests[0].pooled_mass == pytest.approx(0.1)  # ... and does not claim it


# 5. Too few samples -------------------------------------------------------------------


def test_too_few_samples_is_inconclusive_never_pass():
    target, draft = explicit_tables()
    verdict, tests = combined(target, draft, LAWS[0], Fault.NONE, 10, LENGTH, seed=7)  # 50 tokens
    assert verdict == ex.INCONCLUSIVE, explain(tests)
    assert tests[0].n == 50 and tests[0].samples_needed > 50
    assert all(t.verdict == ex.INCONCLUSIVE and t.samples_needed > t.n for t in tests[1:]), explain(tests)
    assert tests[0].verdict == ex.NOT_REJECTED and tests[0].samples_needed > tests[0].n  # the PIT: evidence only
    assert "needs" in tests[1].note
    verdicts = {combined(target, draft, LAWS[s % 2], Fault.NONE, 10, LENGTH, seed=1000 + s)[0] for s in range(20)}
    assert ex.PASS not in verdicts


def test_an_inconclusive_claim_says_what_it_needs_without_a_sentinel():
    """A claim whose pooled rare tokens alone hold more than the required TV cannot reach it at
    this pooling: it says so, not "needs 1000000000 samples"; a claim with too few samples to
    detect anything says that, not "detects inf"."""
    pooled = ex.ExactnessTest("next-token[p]", "g", 3, 1.0, 0.5, 50, 0.3, POWER, pooled_mass=0.48)
    few = ex.ExactnessTest("next-token[q]", "g", 3, 1.0, 0.5, 2, 0.3, POWER)
    ex.decide([pooled, few], ALPHA)
    assert pooled.verdict == ex.INCONCLUSIVE and "1000000000" not in pooled.note
    assert "needs more samples (the rare tokens pooled at 50 samples hold 0.480 of the law)" in pooled.note
    assert few.verdict == ex.INCONCLUSIVE and "inf" not in few.note, few.note


def test_the_gtest_sample_size_is_the_smallest_that_detects_the_effect() -> None:
    from gate.exactness.stats import gtest_detectable, gtest_samples_needed

    for df in (1, 4, 20):
        for effect in (0.05, 0.1, 0.3):
            n = gtest_samples_needed(effect, df, 1e-4, 0.9)
            assert gtest_detectable(n, df, 1e-4, 0.9) <= effect < gtest_detectable(n - 1, df, 1e-4, 0.9)
    assert gtest_samples_needed(0.0, 4, 0.01, 0.9) == 10**9
    assert gtest_detectable(3, 4, 0.01, 0.9) == float("inf")  # even TV 1 is out of reach at 3 samples


def test_the_permutation_p_value_holds_its_level_and_stops_early_where_far_from_extreme() -> None:
    import numpy as np

    from gate.exactness.stats import MAX_PERMUTATION_TABLES, _permutation_g

    rng = np.random.default_rng(0)
    law = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    ps, drawn = [], []
    for _ in range(400):  # both rows from one law: the null
        table = np.stack([rng.multinomial(60, law), rng.multinomial(60, law)])
        table = table[:, table.sum(axis=0) > 0]
        _, p, n = _permutation_g(table)
        ps.append(p)
        drawn.append(n)
    rate = np.mean(np.asarray(ps) <= 0.05)
    assert rate <= 0.05 + 3 * (0.05 * 0.95 / 400) ** 0.5  # valid: rejects at most its level (3 standard errors)
    assert np.median(drawn) < 200  # Besag & Clifford: a typical null table stops after a few dozen draws
    # a table far out in the tail draws the most and resolves a p-value below any Holm threshold gate uses
    _, p, n = _permutation_g(np.array([[60, 0, 0], [0, 30, 30]]))
    assert n == MAX_PERMUTATION_TABLES and p == 1 / (1 + MAX_PERMUTATION_TABLES)
