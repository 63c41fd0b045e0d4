"""Confidence-aware verdicts, proven by simulation with known truth.

Noise model (a shared CPU, as the README measures it): output lengths vary by prompt;
every (fallback, draft) pair shares a machine-drift factor (lognormal, sd 10%) because the
two run back to back; each request adds its own noise (5%); the draft's per-request
speedup varies with how well it matches the prompt (15%). ITL tokens share a per-request
factor (20%) on top of per-token noise (25%), so tokens of one request are correlated.
The truth of each draft is set on the population (a very large simulated sample), then
trials with a realistic sample are decided by gate's rules.
"""

from __future__ import annotations

import numpy as np
import pytest

from gate.policy.model import RuleSpec
from gate.records import DraftInfo, Environment, Measurements, RequestRecord
from gate.rules.confidence import Interval, decide, exceedance, min_samples_to_pass
from gate.rules.evaluate import Settings, evaluate
from gate.rules.resampling import UnitSet

TRIALS = 200
THRESHOLD = 1.10  # speedup >= 1.10x


def _request(runner: str, prompt: int, tokens: int, e2el_ms: float, rep: int = 0, itl: np.ndarray | None = None) -> RequestRecord:
    times = list(np.cumsum(itl)) if itl is not None else [e2el_ms * (i + 1) / tokens for i in range(tokens)]
    return RequestRecord(runner, "greedy", f"p{prompt}", "qa", 64, rep, 10, list(range(tokens)), [float(t) for t in times],
                         [1] * tokens, [0] * tokens, [0] * tokens, "length", float(e2el_ms), 0, 10, 0, 0)


def _pairs(rng: np.random.Generator, n: int, speedup_scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tokens = rng.integers(32, 65, size=n)
    drift = rng.lognormal(0.0, 0.10, size=n)
    fallback = tokens * 20.0 * drift * rng.lognormal(0.0, 0.05, size=n)
    per_request_speedup = speedup_scale * rng.lognormal(0.0, 0.15, size=n)
    draft = tokens * 20.0 * drift * rng.lognormal(0.0, 0.05, size=n) / per_request_speedup
    return tokens, fallback, draft


def _scale_for(target: float) -> float:
    """The speedup scale whose population pooled speedup (sum fallback time / sum draft time) is `target`."""
    tokens, fallback, draft = _pairs(np.random.default_rng(12345), 400_000, 1.0)
    return target / (fallback.sum() / draft.sum())


def _speedup_rule() -> RuleSpec:
    return RuleSpec(id="speedup", metric="committed_tokens_per_s", aggregation="pooled", relative_to="fallback",
                    comparison=">=", threshold=f"{THRESHOLD}x")


def _decide_one(rng: np.random.Generator, scale: float, n: int, resamples: int) -> str:
    m = Measurements(environment=Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0), laws=["greedy"],
                     drafts={"d": DraftInfo("model")})
    tokens, fallback, draft = _pairs(rng, n, scale)
    for i in range(n):
        m.requests += [_request("fallback", i, int(tokens[i]), fallback[i]), _request("d", i, int(tokens[i]), draft[i])]
    (outcome,) = evaluate([_speedup_rule()], m, Settings(resamples=resamples, seed=int(rng.integers(1 << 31))))
    return outcome.status


@pytest.mark.parametrize("truth, expect", [(THRESHOLD * 1.15, "pass"), (THRESHOLD * 0.90, "fail"), (THRESHOLD, "inconclusive")])
def test_speedup_verdicts_under_noise(truth: float, expect: str) -> None:
    """48 paired requests (e.g. 16 prompts x 3 repetitions) at 95%: a good draft (15% above
    the threshold) fails at most 1% of the time, a bad one (10% below) is missed at most 5%
    of the time, and one exactly at the threshold is inconclusive."""
    rng = np.random.default_rng(7)
    scale = _scale_for(truth)
    statuses = [_decide_one(rng, scale, 48, 1000) for _ in range(TRIALS)]
    rate = {s: statuses.count(s) / TRIALS for s in ("pass", "fail", "inconclusive")}
    if expect == "pass":
        assert rate["fail"] <= 0.01, rate
        assert rate["pass"] >= 0.90, rate
    elif expect == "fail":
        assert rate["pass"] + rate["inconclusive"] <= 0.05, rate  # the miss rate
    else:
        assert rate["inconclusive"] >= 0.85, rate
        assert rate["pass"] <= 0.05 and rate["fail"] <= 0.05, rate


def _itl_requests(rng: np.random.Generator, n: int, tokens: int = 48) -> list[np.ndarray]:
    factor = rng.lognormal(0.0, 0.20, size=(n, 1))
    return list(20.0 * factor * rng.lognormal(0.0, 0.25, size=(n, tokens)))


def _true_p99() -> float:
    return float(np.percentile(np.concatenate(_itl_requests(np.random.default_rng(999), 20_000)), 99))


@pytest.mark.parametrize("ratio, expect", [(1.20, "pass"), (1 / 1.10, "fail"), (1.0, "inconclusive")])
def test_p99_itl_ceiling_by_counting_exceedances(ratio: float, expect: str) -> None:
    """p99 ITL <= T over 256 requests x 48 tokens, resampled by request (design effect):
    a true p99 20% below T passes (false-fail <= 1%), 10% above T fails (miss <= 5%),
    exactly at T is inconclusive."""
    rng = np.random.default_rng(3)
    threshold = _true_p99() * ratio
    rule = RuleSpec(id="itl", metric="itl_ms", aggregation="p99", comparison="<=", threshold=f"{threshold} ms")
    statuses = []
    for _ in range(TRIALS):
        m = Measurements(environment=Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0), laws=["greedy"],
                         drafts={"d": DraftInfo("model")})
        m.requests = [_request("d", i, 49, 0.0, itl=np.concatenate([[5.0], gaps])) for i, gaps in enumerate(_itl_requests(rng, 256))]
        for r in m.requests:
            r.e2el_ms = r.token_times_ms[-1]
        (o,) = evaluate([rule], m, Settings())
        statuses.append(o.status)
    rate = {s: statuses.count(s) / TRIALS for s in ("pass", "fail", "inconclusive")}
    if expect == "pass":
        assert rate["fail"] <= 0.01 and rate["pass"] >= 0.90, rate
    elif expect == "fail":
        assert rate["pass"] + rate["inconclusive"] <= 0.05, rate
    else:
        assert rate["inconclusive"] >= 0.85, rate


def test_design_effect_widens_the_bound_when_tokens_of_a_request_are_correlated() -> None:
    """All exceedances in a few requests (correlated) give a wider bound than the same count spread out."""
    spread = UnitSet("p99", "request", [(i,) for i in range(50)], [np.r_[np.zeros(99), [1.0]] for _ in range(50)])
    clustered = UnitSet("p99", "request", [(i,) for i in range(50)],
                        [np.r_[np.zeros(50), np.ones(50)] if i == 0 else np.zeros(100) for i in range(50)])
    a, b = exceedance(spread, 0.5, "<=", 0.99, 0.95), exceedance(clustered, 0.5, "<=", 0.99, 0.95)
    assert a.count == b.count == 50 and a.n == b.n == 5000
    assert a.design_effect == pytest.approx(1.0, abs=0.05) and b.design_effect > 10
    assert b.high > a.high


def test_minimum_samples_for_a_percentile_ceiling() -> None:
    # zero exceedances in n samples: Clopper-Pearson upper bound 1 - 0.025^(1/n) <= 0.01 needs n >= 368
    from scipy import stats

    assert min_samples_to_pass(0.99, 0.95) == 368
    assert stats.beta.ppf(0.975, 1, 368) <= 0.01 < stats.beta.ppf(0.975, 1, 367)
    assert min_samples_to_pass(0.5, 0.95) == 6


def test_decide_is_three_way() -> None:
    assert decide(Interval(1.12, 1.2, 0.95, "", 24), ">=", 1.1) == "pass"
    assert decide(Interval(1.0, 1.08, 0.95, "", 24), ">=", 1.1) == "fail"
    assert decide(Interval(1.02, 1.12, 0.95, "", 24), ">=", 1.1) == "inconclusive"
    assert decide(Interval(40, 45, 0.95, "", 24), "<=", 50) == "pass"


def test_message_states_the_interval_and_the_units() -> None:
    rng = np.random.default_rng(0)
    m = Measurements(environment=Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0), laws=["greedy"], drafts={"d": DraftInfo("model")})
    tokens, fallback, draft = _pairs(rng, 24, _scale_for(1.07))
    for i in range(24):
        m.requests += [_request("fallback", i, int(tokens[i]), fallback[i]), _request("d", i, int(tokens[i]), draft[i])]
    (o,) = evaluate([_speedup_rule()], m, Settings())
    assert "(24 paired requests, 95% CI " in o.message and "vs threshold >= 1.100x" in o.message
    assert o.interval is not None and o.interval.low < o.measured < o.interval.high and o.interval.units == 24
