"""Statistical tests of exactness and their verdicts: whether sampled tokens follow the
target's declared law. The raw material (PIT values, next-token counts, contexts,
divergences) is computed from tensors in gate.exactness.collect; this module tests and decides.

- Whole sequences: the randomized probability integral transform (PIT) values u, i.i.d.
  U(0, 1) under the null (Diebold, Gunther & Tay 1998; Czado, Gneiting & Held 2009 for the
  discrete case), tested with Kolmogorov-Smirnov (scipy.stats.kstest).
- One position sampled many times: a G-test (scipy.stats.power_divergence,
  log-likelihood) with categories of small expected count pooled; a Monte Carlo exact
  test of the same statistic when expected counts are tiny. Mass outside the law's
  support (e.g. beyond top-k) is its own category and fails at once.
- Holm's step-down correction across tests (Holm 1979).
- Power, stated with every verdict:
  * G-test: for any alternative at total-variation distance d, the noncentrality
    n * sum (q - p)^2 / p >= 4 n d^2 (Cauchy-Schwarz), so the asymptotic power
    (noncentral chi-square) at d is at least ncx2.sf(crit, df, 4 n d^2). The detectable
    TV is the smallest d whose bound reaches the required power, plus the mass of the
    pooled rare categories (a move inside the pooled cell is invisible to the test).
  * KS on PIT values: by the Dvoretzky-Kiefer-Wolfowitz inequality, a PIT law whose CDF
    is D away from uniform is rejected with probability >= 1 - beta when
    D >= c_alpha(n) + sqrt(ln(2 / beta) / (2 n)), c_alpha the exact KS critical value.
    A fault that moves mass d in one direction along the probability ranking (temperature,
    top-k, top-p, residual faults) moves the PIT CDF by d; alternating moves can hide in
    the PIT, which is why the next-token test runs beside it.
Too few samples for the required power is *inconclusive*, never a pass.

What a pass rests on (see decide and overall): only *claim* tests, the next-token G-tests at
a prompt's first output position, whose effect is the TV distance of the engine's
next-token law from the target's at that context (the rule's detect_tv). The PIT test and
next-token tests after a shared output prefix (contexts) are *evidence*: any rejection
fails the sampler, but their power is not claimed, since the PIT's effect (the KS distance
of PIT values pooled over prompts and positions) is no TV at any context.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from gate.rules.status import Role, Status, TestVerdict

PASS, FAIL, INCONCLUSIVE = TestVerdict.PASS, TestVerdict.FAIL, TestVerdict.INCONCLUSIVE
NOT_REJECTED = TestVerdict.NOT_REJECTED  # an evidence test that found nothing: it claims no power
CLAIM, EVIDENCE = Role.CLAIM, Role.EVIDENCE


@dataclass
class ExactnessTest:
    """One statistical test of exactness, as scipy reports it plus what it can detect.

    kind: "ks" (PIT, effect = PIT CDF distance) or "g" (next token, effect = TV distance).
    role: "claim" for a next-token test at a prompt's first output position, whose stated
    power against TV `target_effect` is what a pass rests on; "evidence" for a test that can
    fail a sampler but whose power is not claimed (the PIT over every token, whose effect is
    not a TV at any context; next-token tests after a shared output prefix). See decide.
    detectable: the smallest effect detected with probability >= power at this sample
    size and at the significance it is finally judged at (alpha / m after Holm, see decide).
    samples_needed: the sample size at which `target_effect` becomes detectable."""

    name: str
    kind: str
    df: int  # degrees of freedom of the G-test after pooling (0 for KS)
    statistic: float
    pvalue: float
    n: int
    target_effect: float
    power: float
    detectable: float = math.inf
    samples_needed: int = 0
    adjusted_pvalue: float | None = None
    verdict: TestVerdict = INCONCLUSIVE
    note: str = ""
    pooled_mass: float = 0.0  # G-test: probability mass of the pooled rare categories
    role: Role = CLAIM
    # Two-sample G-test: n_a n_b / (n_a + n_b), the sample size its power is stated at (None: one-sample, n)
    effective_n: float | None = None

    def state_power(self, alpha: float) -> None:
        """Fill `detectable` and `samples_needed` at significance `alpha`.

        For a pooled G-test, mass moved inside the pooled cell is invisible, and TV <=
        TV(pooled) + pooled mass, so the pooled mass is added to the detectable TV;
        samples_needed then keeps the current pooling (an upper bound: more samples pool less)."""
        if self.kind == "ks":
            self.detectable = ks_detectable(self.n, alpha, self.power)
            self.samples_needed = ks_samples_needed(self.target_effect, alpha, self.power)
        else:
            df = max(self.df, 1)
            n = int(self.effective_n) if self.effective_n is not None else self.n
            self.detectable = gtest_detectable(n, df, alpha, self.power) + self.pooled_mass
            reachable = self.target_effect - self.pooled_mass
            needed = gtest_samples_needed(reachable, df, alpha, self.power) if reachable > 0 else 10**9
            # two-sample: n_eff = n/4 at equal sizes, so the samples needed (both runners together) are 4 n_eff
            self.samples_needed = needed if self.effective_n is None or needed >= 10**9 else 4 * needed


# The family-wise significance of an exactness rule unless it sets its own (rules[].significance).
# A correct engine sits exactly on the null, so it fails a run at this rate per exactness outcome:
# a gate that runs on every change (some 500 runs a year, a few sampled outcomes each) fails a
# correct engine about 1.5 times a year at 0.001, where 0.01 failed it about 15 times; the
# samples a test needs for the same power grow by about 1.4x (docs/concepts/statistics.md).
DEFAULT_SIGNIFICANCE = 0.001

# A two-sample test's permutation p-value draws tables until this many are as extreme as the
# observed one (Besag & Clifford 1991), and at most MAX_PERMUTATION_TABLES: the smallest p it
# can give is then 1 / 400,001, below the Holm thresholds of families of up to ~400 tests at
# 0.001; a table far from extreme (a correct engine's) stops after a few dozen.
PERMUTATION_EXTREMES = 10
MAX_PERMUTATION_TABLES = 400_000


def ks_detectable(n: int, alpha: float, power: float) -> float:
    """Smallest PIT CDF distance D rejected with probability >= power (DKW bound), n samples."""
    if n < 1:
        return math.inf
    return float(stats.kstwo.ppf(1.0 - alpha, n)) + math.sqrt(math.log(2.0 / (1.0 - power)) / (2.0 * n))


def ks_samples_needed(effect: float, alpha: float, power: float) -> int:
    """Smallest n with ks_detectable(n) <= effect (doubling then bisection)."""
    return _smallest_n(lambda n: ks_detectable(n, alpha, power) <= effect)


def gtest_detectable(n: int, df: int, alpha: float, power: float) -> float:
    """Smallest TV distance d whose G-test power bound ncx2.sf(crit, df, 4 n d^2) >= power:
    sqrt(lambda / (4 n)), lambda the noncentrality that power needs (_noncentrality); inf
    when even d = 1 falls short, or n < 1 or df < 1."""
    if n < 1 or df < 1:
        return math.inf
    lam = _noncentrality(df, alpha, power)
    return math.inf if lam > 4.0 * n else math.sqrt(lam / (4.0 * n))


def gtest_samples_needed(effect: float, df: int, alpha: float, power: float) -> int:
    """Smallest n with gtest_detectable(n, df) <= effect: ceil(lambda / (4 effect^2)), at
    least 1 (10**9 for an effect <= 0: none)."""
    if effect <= 0 or df < 1:
        return 10**9
    lam = _noncentrality(df, alpha, power)
    n = max(1, math.ceil(lam / (4.0 * effect * effect) - 1e-9))
    return min(n, 10**9)


@functools.lru_cache(maxsize=4096)
def _noncentrality(df: int, alpha: float, power: float) -> float:
    """The smallest noncentrality lambda with ncx2.sf(chi2.ppf(1 - alpha, df), df, lambda) >=
    power (bisection to 1e-12 relative): the G-test's power bound is that of a noncentral
    chi-square with df degrees of freedom and lambda = 4 n TV^2 at least (Pinsker's
    inequality, KL >= 2 TV^2, G = 2 n KL); one lambda serves every n and every TV."""
    crit = stats.chi2.ppf(1.0 - alpha, df)
    lo, hi = 0.0, 1.0
    while stats.ncx2.sf(crit, df, hi) < power:
        lo, hi = hi, hi * 2
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        if stats.ncx2.sf(crit, df, mid) >= power:
            hi = mid
        else:
            lo = mid
    return hi


def _smallest_n(ok, limit: int = 10**9) -> int:  # type: ignore[no-untyped-def]
    hi = 1
    while not ok(hi):
        hi *= 2
        if hi > limit:
            return limit
    lo = hi // 2
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def pit_test(
    u: np.ndarray | list[float], alpha: float, power: float, effect: float, name: str = "pit-ks"
) -> ExactnessTest:
    """Kolmogorov-Smirnov test of PIT values against U(0, 1), with its detectable effect.

    An *evidence* test: its power is about the KS distance of the pooled PIT values, which
    is at most the TV of the law at any context and can be far smaller (one bad prompt of
    eight is diluted eightfold), so it can fail a sampler but never supports a pass.
    NaN values (tokens the law gives probability 0) make the test fail outright."""
    arr = np.asarray(u, dtype=float)
    impossible = int(np.isnan(arr).sum())
    arr = arr[~np.isnan(arr)]
    n = int(arr.size) + impossible
    if impossible:
        test = ExactnessTest(
            name,
            "ks",
            0,
            math.inf,
            0.0,
            n,
            effect,
            power,
            note=f"{impossible} sampled tokens have probability 0 under the law",
        )
    elif n == 0:
        test = ExactnessTest(name, "ks", 0, math.nan, 1.0, 0, effect, power, note="no samples")
    else:
        result = stats.kstest(arr, "uniform")
        test = ExactnessTest(name, "ks", 0, float(result.statistic), float(result.pvalue), n, effect, power)
    test.role = EVIDENCE
    _guard(test)
    test.state_power(alpha)
    return test


def next_token_test(
    counts: np.ndarray | list[int],
    p: np.ndarray | list[float],
    alpha: float,
    power: float,
    effect: float,
    name: str = "next-token-g",
    min_expected: float = 5.0,
    rng: np.random.Generator | None = None,
) -> ExactnessTest:
    """G-test of observed token counts [V] against the law p [V].

    With two or more categories of expected count >= min_expected, the asymptotic
    chi-square G-test, the rarer categories pooled into one. Otherwise a Monte Carlo exact
    test of the same statistic over the unpooled support (scipy.stats.monte_carlo_test,
    9,999 resamples). A count on a token with p = 0 fails at once."""
    counts = np.asarray(counts, dtype=float)
    p = np.asarray(p, dtype=float)
    n = int(counts.sum())
    outside = int(counts[p <= 0].sum())
    support = p > 0
    p_s = p[support] / p[support].sum()
    c_s = counts[support]
    big = n * p_s >= min_expected
    pooled = 0.0
    if int(big.sum()) >= 2:
        cells_p, cells_c = list(p_s[big]), list(c_s[big])
        if (~big).sum() >= 2:
            pooled = float(p_s[~big].sum())
        if (~big).any():
            cells_p.append(float(p_s[~big].sum()))
            cells_c.append(float(c_s[~big].sum()))
    else:
        cells_p, cells_c = list(p_s), list(c_s)
    df = max(len(cells_p) - 1, 0)
    if outside:
        test = ExactnessTest(
            name, "g", df, math.inf, 0.0, n, effect, power, note=f"{outside} samples fell outside the law's support"
        )
    elif n == 0 or df == 0:
        test = ExactnessTest(
            name,
            "g",
            df,
            0.0,
            1.0,
            n,
            effect,
            power,
            note="no samples" if n == 0 else "the law puts all its mass on one token",
        )
    else:
        test = _gtest(name, np.asarray(cells_c), np.asarray(cells_p), n, df, int(big.sum()) >= 2, effect, power, rng)
        test.pooled_mass = pooled
    _guard(test)
    test.state_power(alpha)
    if df == 0:
        test.detectable = math.inf if n == 0 else 0.0  # a one-token law: any other token is caught by `outside`
    return test


def two_sample_test(
    counts: np.ndarray | list[int],
    reference: np.ndarray | list[int],
    alpha: float,
    power: float,
    effect: float,
    name: str = "two-sample-g",
    min_expected: float = 5.0,
    tables: int = MAX_PERMUTATION_TABLES,
) -> ExactnessTest:
    """G-test of homogeneity of two runners' token counts over the same categories [K]:
    `counts` of the draft runner, `reference` of the fallback runner at the same context.
    Categories whose expected count is below `min_expected` in either row are pooled into one.
    The p-value is a sequential Monte Carlo permutation p-value (_permutation_g, at most
    `tables` tables), not the chi-square approximation: measured under the null at the sizes gate runs, the
    approximation rejected 1.3% at a nominal 1% and 5.9-6% at 5% (issue 42), and a correct
    engine failed a CI run on it.

    Power: with q_a, q_b the two laws and p-bar their sample-weighted mixture, the
    noncentrality is n_eff sum (q_a - q_b)^2 / p-bar with n_eff = n_a n_b / (n_a + n_b), at
    least 4 n_eff TV^2 (Cauchy-Schwarz, as for the one-sample test), so the detectable TV is
    gtest_detectable at n_eff (asymptotic), plus the pooled categories' share of both samples."""
    a = np.asarray(counts, dtype=float)
    b = np.asarray(reference, dtype=float)
    na, nb = float(a.sum()), float(b.sum())
    n = int(na + nb)
    neff = na * nb / (na + nb) if na and nb else 0.0
    if na == 0 or nb == 0:
        test = ExactnessTest(name, "g", 0, 0.0, 1.0, n, effect, power, note="one of the samples is empty")
        test.effective_n = neff
        test.state_power(alpha)
        return test
    total = a + b
    expected_min = np.minimum(total * na / n, total * nb / n)
    big = expected_min >= min_expected
    rows_a, rows_b, pooled = list(a[big]), list(b[big]), 0.0
    if (~big).any():
        rows_a.append(float(a[~big].sum()))
        rows_b.append(float(b[~big].sum()))
        if (~big).sum() >= 2:
            pooled = float(total[~big].sum() / n)
    table = np.asarray([rows_a, rows_b])
    table = table[:, table.sum(axis=0) > 0]
    df = max(table.shape[1] - 1, 0)
    if df == 0:
        test = ExactnessTest(name, "g", 0, 0.0, 1.0, n, effect, power, note="both runners drew one token only")
    else:
        statistic, pvalue, drawn = _permutation_g(table, tables)
        test = ExactnessTest(
            name,
            "g",
            df,
            statistic,
            pvalue,
            n,
            effect,
            power,
            note=f"sequential Monte Carlo permutation p-value ({drawn:,} tables drawn with the observed margins)",
        )
        test.pooled_mass = pooled
    test.effective_n = neff
    _guard(test)
    test.state_power(alpha)
    if df == 0:
        test.detectable = math.inf
    return test


def _permutation_g(table: np.ndarray, most: int = MAX_PERMUTATION_TABLES) -> tuple[float, float, int]:
    """(G statistic, Monte Carlo permutation p-value, tables drawn) of a 2 x K contingency
    table: tables are drawn with the observed row and column margins (scipy.stats.random_table:
    the two runners' samples pooled and dealt again, the null's exact conditional law) until
    PERMUTATION_EXTREMES of them have a G statistic of homogeneity at least the observed one,
    the L-th table drawn: p = PERMUTATION_EXTREMES / L; or, when `most` tables hold only g < that
    many, p = (1 + g) / (1 + most). Both are valid p-values, P(p <= a) <= a under the null
    (Besag & Clifford 1991, "Sequential Monte Carlo p-values", Biometrika 78(2), section 2;
    Phipson & Smyth 2010 for the second), and a table far from extreme stops after a few dozen
    draws. The draws are seeded from the table, so a report's p-value is reproduced from its
    counts."""
    counts = table.astype(np.int64)
    expected = np.outer(counts.sum(axis=1), counts.sum(axis=0)) / counts.sum()

    def g(x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(2.0 * np.where(x > 0, x * np.log(x / expected), 0.0).sum(axis=(-2, -1)))

    observed = max(float(g(counts)), 0.0)
    law = stats.random_table(
        counts.sum(axis=1), counts.sum(axis=0), seed=np.random.default_rng(counts.ravel().tolist())
    )
    size, drawn, beyond = 64, 0, 0
    while drawn < most:
        size = min(size, most - drawn)
        batch = law.rvs(size=size)  # in growing batches: a batch of 2 x K tables stays small
        extreme = g(batch) >= observed - 1e-9 * max(observed, 1.0)
        hits = np.flatnonzero(extreme)
        if beyond + hits.size >= PERMUTATION_EXTREMES:
            at = drawn + int(hits[PERMUTATION_EXTREMES - beyond - 1]) + 1  # the table that made the count
            return observed, PERMUTATION_EXTREMES / at, at
        beyond += hits.size
        drawn += size
        size = min(2 * size, 20_000)
    return observed, (1 + beyond) / (1 + drawn), drawn


def _guard(test: ExactnessTest) -> None:
    """A p-value that is not a finite number in [0, 1] (scipy returns NaN when a G statistic
    rounds to a tiny negative number) counts as 1 for this test alone, with a note: it must
    never poison the Holm family (a NaN compares false with everything)."""
    if not (math.isfinite(test.pvalue) and 0.0 <= test.pvalue <= 1.0):
        test.note = (test.note + "; " if test.note else "") + f"p-value {test.pvalue!r} is not a number: counted as 1"
        test.pvalue = 1.0


def _gtest(
    name: str,
    cells_c_arr: np.ndarray,
    cells_p_arr: np.ndarray,
    n: int,
    df: int,
    asymptotic: bool,
    effect: float,
    power: float,
    rng: np.random.Generator | None,
) -> ExactnessTest:
    g = stats.power_divergence(cells_c_arr, n * cells_p_arr, lambda_="log-likelihood")
    if asymptotic:
        # G >= 0 exactly; observed == expected rounds to a tiny negative number, for which
        # scipy returns p = NaN: clamp, so such a test reads p = 1
        statistic = max(float(g.statistic), 0.0) if math.isfinite(float(g.statistic)) else float(g.statistic)
        return ExactnessTest(name, "g", df, statistic, float(stats.chi2.sf(statistic, df)), n, effect, power)
    rng = rng or np.random.default_rng(0)
    cats = np.arange(len(cells_p_arr))
    expected = n * cells_p_arr

    def g_statistic(x: np.ndarray, axis: int = -1) -> np.ndarray:
        rows = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
        counts = np.stack([np.bincount(r, minlength=len(cats)) for r in rows])
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(counts > 0, counts * np.log(counts / expected), 0.0)
        return np.asarray((2.0 * terms.sum(axis=-1)).reshape(np.moveaxis(x, axis, -1).shape[:-1]))

    observations = np.repeat(cats, cells_c_arr.astype(int))
    mc = stats.monte_carlo_test(
        observations,
        lambda size: rng.choice(cats, size=size, p=cells_p_arr),
        g_statistic,
        vectorized=True,
        n_resamples=9999,
        batch=200,
        alternative="greater",
    )
    return ExactnessTest(
        name,
        "g",
        df,
        float(mc.statistic),
        float(mc.pvalue),
        n,
        effect,
        power,
        note="Monte Carlo exact p-value (expected counts too small for the chi-square approximation)",
    )


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), same order as the input.

    A p-value that is not a finite number (NaN, inf) counts as 1 for its own test: it can
    neither reject nor raise the adjusted p-values of the others."""
    pvalues = [p if math.isfinite(p) else 1.0 for p in pvalues]
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def decide(tests: list[ExactnessTest], alpha: float) -> list[ExactnessTest]:
    """Holm-adjust the p-values of `tests` together and set each verdict:
    fail when the adjusted p-value < alpha; else, for a claim test, pass only if it could
    detect the required effect (detectable <= target_effect) and inconclusive otherwise;
    an evidence test that does not reject is "not rejected" (it claims no power)."""
    adjusted = holm([t.pvalue for t in tests])
    level = alpha / max(len(tests), 1)  # Holm's strictest step: power is stated at alpha / m
    for t, a in zip(tests, adjusted, strict=False):
        t.adjusted_pvalue = a
        # Restate power at alpha / m, also when nothing is detectable yet (samples_needed at
        # alpha / m); a G-test of a one-token law (df 0) keeps what next_token_test stated.
        if t.kind == "ks" or t.df > 0:
            t.state_power(level)
        if a < alpha:
            t.verdict = FAIL
        elif t.role == EVIDENCE:
            t.verdict = NOT_REJECTED
        elif t.detectable <= t.target_effect:
            t.verdict = PASS
        else:
            t.verdict = INCONCLUSIVE
            seen = f"detect {t.detectable:.3f}" if math.isfinite(t.detectable) else "detect no effect at this level"
            needs = (
                f"needs {t.samples_needed} samples"
                if t.samples_needed < 10**9
                else f"needs more samples (the rare tokens pooled at {t.n} samples hold {t.pooled_mass:.3f} of the law)"
            )
            t.note = (t.note + "; " if t.note else "") + (
                f"{t.n} samples {seen} but {t.target_effect:.3f} was required: {needs}"
            )
    return tests


def overall(tests: list[ExactnessTest]) -> Status:
    """The verdict of a family after decide, as an outcome status: fail if any test failed;
    pass only when there is at least one claim test and every claim test passed; otherwise
    inconclusive."""
    if any(t.verdict == FAIL for t in tests):
        return Status.FAIL
    claims = [t for t in tests if t.role == CLAIM]
    return Status.PASS if claims and all(t.verdict == PASS for t in claims) else Status.INCONCLUSIVE
