"""Do the exactness tests deliver the significance they state? (issue 42: a correct served
sampler failed a CI run on the two-sample test.)

Under the null, both runners sample one law: a 48-token vocabulary with a long tail (the
first token 30% of the mass, the rest falling off as 1/rank^1.5: a sparse law whose rare
tokens have small expected counts). Two samples of n tokens each are drawn `--draws` times
per size and tested for homogeneity by the G statistic, with the p-value from

  chi-square:   the asymptotic chi-square law (scipy.stats.chi2_contingency), what gate
                used before (rarer categories pooled as gate pools them);
  permutation:  gate.exactness.stats.two_sample_test, the sequential Monte Carlo permutation
                p-value over tables with the observed margins, as gate runs it (drawn until
                10 are as extreme, Besag & Clifford 1991; at most 400,000).

A valid test rejects at most its level: at 1% and 5% it prints each rejection rate, with its
Monte Carlo standard error (sqrt(level (1 - level) / draws)).

    python benchmarks/exactness_null.py [--draws 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gate.exactness.stats import two_sample_test  # noqa: E402

VOCAB = 48
SIZES = (100, 500, 2939)


def law() -> np.ndarray:
    tail = 1.0 / np.arange(2, VOCAB + 1) ** 1.5
    p = np.concatenate([[0.3], 0.7 * tail / tail.sum()])
    return p / p.sum()


def chi_square_p(a: np.ndarray, b: np.ndarray, min_expected: float = 5.0) -> float:
    """The asymptotic p-value with gate's pooling of rare categories (its test before issue 42)."""
    total = a + b
    n = total.sum()
    big = np.minimum(total * a.sum() / n, total * b.sum() / n) >= min_expected
    rows = [list(a[big]) + [a[~big].sum()], list(b[big]) + [b[~big].sum()]]
    table = np.asarray(rows, dtype=float)
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return 1.0
    return float(stats.chi2_contingency(table, correction=False, lambda_="log-likelihood").pvalue)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    p = law()
    rng = np.random.default_rng(args.seed)
    print(f"{args.draws} null draws per size; {VOCAB}-token law, top token {p[0]:.0%}, "
          f"{int((p < 0.01).sum())} tokens under 1% each")
    print(f"{'n per runner':>12} | {'test':>11} | {'reject at 1%':>12} | {'reject at 5%':>12}")
    started = time.perf_counter()
    for n in SIZES:
        p_chi, p_perm = [], []
        for _ in range(args.draws):
            a, b = rng.multinomial(n, p), rng.multinomial(n, p)
            p_chi.append(chi_square_p(a, b))
            p_perm.append(two_sample_test(a, b, alpha=0.01, power=0.9, effect=0.1).pvalue)
        for name, ps in (("chi-square", np.asarray(p_chi)), ("permutation", np.asarray(p_perm))):
            cells = [f"{(ps <= lv).mean():.2%} +- {np.sqrt(lv * (1 - lv) / args.draws):.2%}" for lv in (0.01, 0.05)]
            print(f"{n:>12} | {name:>11} | {cells[0]:>12} | {cells[1]:>12}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
