"""Issue 10, items 1 and 2: a sampling-exactness pass carries the power it claims.

- A pass rests only on *claim* tests: next-token G-tests at a prompt's first output
  position, each powered against TV detect_tv at its Holm level. The PIT over every token
  and the tests after shared prefixes are *evidence*: they can fail a sampler, never pass it.
- The issue's scenario (a tiny Llama target, a noisy-copy draft, T 0.8, 150 samples x 16
  tokens over 8 prompts) no longer passes deterministic acceptance, a residual taken as p
  or a reused uniform: too few samples per prompt is inconclusive, and gate says how many.
- A NaN p-value is that test's alone: it never masks the others in the Holm family.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

import gate.exactness.collect as mx
import gate.exactness.stats as ex
from gate.records import DraftInfo, ExactnessRecord, Measurements, NextTokenCounts
from reference import Fault
from gate.exactness.verdict import evaluate_exactness

ALPHA, POWER, TV = 0.01, 0.9, 0.1
RULE = SimpleNamespace(id="exact", level="error", significance=ALPHA, power=POWER, detect_tv=TV, tie_tolerance=0.0,
                       scope=SimpleNamespace(laws=None))


def counts_record(source: str, prompt: str, probs: list[float], counts: list[int], prefix=()) -> NextTokenCounts:
    return NextTokenCounts(prompt, list(range(len(probs))), probs, 0.0, counts, 0, 0, list(prefix))


def measurements(*records: ExactnessRecord) -> Measurements:
    m = Measurements(environment=None)  # type: ignore[arg-type]
    m.exactness = list(records)
    m.drafts = {r.draft: DraftInfo("recorded samples") for r in records}
    return m


# --- the definition: what backs a pass ------------------------------------------------


def test_pit_alone_never_passes_however_many_tokens():
    u = np.random.default_rng(0).random(50_000)  # a perfect PIT: 50,000 uniform values
    rec = ExactnessRecord("spec", "t0.8", False, pit=list(u))
    (out,) = evaluate_exactness(RULE, measurements(rec), ["spec"], ["t0.8"])
    assert out.status == "inconclusive", out.message
    assert "no prompt was sampled often enough" in out.message and "next_token_samples" in out.message
    assert out.details[0]["role"] == "evidence" and out.details[0]["verdict"] == "not rejected"


def test_a_powered_first_position_test_passes_and_evidence_can_only_fail():
    p = [0.4, 0.3, 0.2, 0.1]
    good = counts_record("spec", "a", p, [800, 600, 400, 200])  # exactly n p: statistic 0
    rec = ExactnessRecord("spec", "t", False, next_token=[good])
    (out,) = evaluate_exactness(RULE, measurements(rec), ["spec"], ["t"])
    assert out.status == "pass", out.message
    assert out.details[0]["role"] == "claim" and out.details[0]["pvalue"] == 1.0
    # the same plus a later-position test that finds the law broken: fail
    broken = counts_record("spec", "a", p, [0, 0, 0, 200], prefix=[7])
    rec = ExactnessRecord("spec", "t", False, next_token=[good, broken])
    (out,) = evaluate_exactness(RULE, measurements(rec), ["spec"], ["t"])
    assert out.status == "fail", out.message
    assert "after output [7]" in out.message
    # a later-position test too small to detect anything does not stop the pass
    small = counts_record("spec", "a", p, [20, 15, 10, 5], prefix=[7])
    rec = ExactnessRecord("spec", "t", False, next_token=[good, small])
    (out,) = evaluate_exactness(RULE, measurements(rec), ["spec"], ["t"])
    assert out.status == "pass", out.message
    assert {d["role"]: d["verdict"] for d in out.details} == {"claim": "pass", "evidence": "not rejected"}


def test_an_underpowered_claim_is_inconclusive_with_the_samples_needed():
    p = [0.25] * 4
    rec = ExactnessRecord("spec", "t", False, next_token=[counts_record("spec", "a", p, [10, 10, 10, 10])])
    (out,) = evaluate_exactness(RULE, measurements(rec), ["spec"], ["t"])
    assert out.status == "inconclusive"
    needed = out.details[0]["samples_needed"]
    assert needed == ex.gtest_samples_needed(TV, 3, ALPHA, POWER) and f"needs {needed} samples" in out.message


def test_contexts_keep_the_first_position_and_the_most_shared_prefixes():
    outputs = [[1, 2, 3]] * 60 + [[1, 4, 5]] * 55 + [[6, 7]] * 10
    found = dict(mx.contexts(outputs, min_first=20, min_later=50))
    assert found[()] == [1] * 115 + [6] * 10
    assert found[(1,)] == [2] * 60 + [4] * 55  # 115 outputs share the prefix (1,)
    assert found[(1, 2)] == [3] * 60 and found[(1, 4)] == [5] * 55
    assert (6,) not in found  # only 10 share it
    assert list(found)[:2] == [(), (1,)]  # the first position, then by count
    assert mx.contexts(outputs[:10], min_first=20) == []  # too few for any test
    assert len(mx.contexts(outputs, min_later=50, max_later=1)) == 2


# --- the scenario, end to end through `gate exactness` -------------------------

PROMPTS = [[1, 4 + 3 * i, 9 + i, 20 + 2 * i] for i in range(8)]
LAW = {"temperature": 0.8}


FAULTS = [Fault.DETERMINISTIC_ACCEPTANCE, Fault.RESIDUAL_IS_P, Fault.REUSED_UNIFORM]


# --- item 2: NaN-safe corrections ------------------------------------------------------


def test_holm_counts_a_nan_pvalue_as_one_for_its_own_test_only():
    assert ex.holm([float("nan"), 0.001, 0.004]) == pytest.approx([1.0, 0.003, 0.008])
    assert ex.holm([float("inf"), 0.002]) == pytest.approx([1.0, 0.004])


def test_observed_equal_to_expected_reads_p_one_not_nan():
    counts = np.array([31.0, 29.0])  # p = counts / n: scipy's G rounds to -6.9e-15 and its p-value is NaN
    p = counts / counts.sum()
    raw = stats.power_divergence(counts, counts.sum() * p, lambda_="log-likelihood")
    assert raw.statistic < 0 and math.isnan(raw.pvalue)
    t = ex.next_token_test(counts, p, ALPHA, POWER, TV)
    assert t.pvalue == 1.0 and t.statistic == 0.0


def test_a_nan_pvalue_in_one_test_does_not_mask_a_fault_in_another():
    bad = ex.ExactnessTest("nan", "g", 3, float("nan"), float("nan"), 10_000, TV, POWER)
    ex._guard(bad)
    assert bad.pvalue == 1.0 and "not a number" in bad.note
    fault = ex.ExactnessTest("fault", "g", 3, 50.0, 1e-9, 10_000, TV, POWER)
    raw_nan = ex.ExactnessTest("raw", "g", 3, float("nan"), float("nan"), 10_000, TV, POWER)  # unguarded
    ex.decide([raw_nan, bad, fault], ALPHA)
    assert fault.verdict == ex.FAIL and fault.adjusted_pvalue == pytest.approx(3e-9)


def test_a_source_with_exact_counts_does_not_pass_a_faulty_source():
    """The issue's samples file: the first source's counts equal the expected counts exactly,
    the second source is faulty; the second must fail (it passed before, exit 0)."""
    exact = ExactnessRecord("first", "t", False, next_token=[counts_record("first", "a", [31 / 60, 29 / 60], [1550, 1450])])
    faulty = ExactnessRecord("second", "t", False, next_token=[counts_record("second", "a", [0.5, 0.5], [1300, 1700])])
    out = {o.draft: o for o in evaluate_exactness(RULE, measurements(exact, faulty), ["first", "second"], ["t"])}
    assert out["first"].status == "pass", out["first"].message
    assert out["second"].status == "fail", out["second"].message


# --- item 6: gate exactness needs only a target and exactness rules ----------------------


