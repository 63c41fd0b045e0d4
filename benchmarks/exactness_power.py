"""How many sampled tokens do gate's exactness tests need to catch each known fault?

For every fault of gate.reference.Fault, on explicit position-dependent tables (V = 8,
5 positions, gamma 3, target logits randn * 1.5, draft = target + randn * 1.0, table seed
2: the tables of tests/test_exactness.py), the smallest number of sampled tokens on a
doubling grid (250, 500, ..., 64,000) at which the detection rate at significance 0.01
reaches 90%, estimated with --reps repetitions per size (a size is abandoned at the
first miss that makes 90% unreachable), for

  (a) gate's combined test: PIT Kolmogorov-Smirnov over all tokens plus a next-token
      G-test at each of the 5 positions, Holm-corrected together (decide); N tokens are
      N / 5 sequences x 5 positions;
  (b) a plain chi-square goodness-of-fit test (scipy.stats.chisquare, categories with
      expected count < 5 pooled into one) on the first token only: N sequences of 1 token.

Then the false-alarm rate of (a) on the correct sampler, and the wall time per 1,000
tested tokens of computing PIT values on SmolLM2-135M-Instruct (law_probs +
randomized_pit + pit_test on teacher-forced logits), next to the forward pass itself.

The machine is shared and noisy: read ratios and medians, not absolute figures.

    python benchmarks/exactness_power.py [--reps 40] [--max-tokens 64000] [--laws both]
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

import gate.measure.exactness as ex
from gate.law import Law, law_probs
from gate.reference import LAW_PRESERVING, Fault, speculative_sample

ALPHA, POWER, DETECT_TV = 0.01, 0.9, 0.1
V, GAMMA, LENGTH, TABLE_SEED = 8, 3, 5, 2
LAWS = {"t0.8-k6": Law("t0.8-k6", 0.8, top_k=6), "t1-p0.9": Law("t1-p0.9", 1.0, top_p=0.9)}


def tables() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(TABLE_SEED)
    target = torch.randn(LENGTH + GAMMA + 1, V, generator=g) * 1.5
    draft = target + torch.randn(LENGTH + GAMMA + 1, V, generator=g) * 1.0
    return target, draft


class memoized_power:  # noqa: N801 - a context manager
    """gtest_detectable and ks_detectable are pure; memoize them inside the simulations
    (each G-test otherwise spends ~0.1 s on samples_needed). Verdicts are unchanged."""

    def __enter__(self) -> None:
        self.saved = ex.gtest_detectable, ex.ks_detectable
        ex.gtest_detectable = functools.lru_cache(maxsize=None)(ex.gtest_detectable)
        ex.ks_detectable = functools.lru_cache(maxsize=None)(ex.ks_detectable)

    def __exit__(self, *exc: object) -> None:
        ex.gtest_detectable, ex.ks_detectable = self.saved


def gate_combined(target: torch.Tensor, draft: torch.Tensor, law: Law, fault: Fault, tokens: int, seed: int) -> float:
    """Smallest Holm-adjusted p-value of gate's combined test (fail iff < alpha)."""
    batch = max(tokens // LENGTH, 1)
    out = speculative_sample(target, draft, law, GAMMA, batch, LENGTH, torch.Generator().manual_seed(seed), fault)
    p = law_probs(target[:LENGTH], law)
    u = ex.randomized_pit(p.repeat(batch, 1), out.reshape(-1), torch.Generator().manual_seed(seed + 1))
    tests = [ex.pit_test(u.numpy(), ALPHA, POWER, DETECT_TV)]
    for t in range(LENGTH):
        counts = np.bincount(out[:, t].numpy(), minlength=V)
        tests.append(ex.next_token_test(counts, p[t].double().numpy(), ALPHA, POWER, DETECT_TV,
                                        rng=np.random.default_rng(seed)))
    ex.decide(tests, ALPHA)
    return min(t.adjusted_pvalue for t in tests)  # type: ignore[type-var]


def first_token_chisquare(target: torch.Tensor, draft: torch.Tensor, law: Law, fault: Fault, tokens: int, seed: int) -> float:
    """p-value of a plain Pearson chi-square on `tokens` first tokens (expected < 5 pooled)."""
    out = speculative_sample(target, draft, law, GAMMA, tokens, 1, torch.Generator().manual_seed(seed), fault)
    counts = np.bincount(out[:, 0].numpy(), minlength=V).astype(float)
    expected = tokens * law_probs(target[0], law).double().numpy()
    expected *= tokens / expected.sum()
    small = expected < 5.0
    obs, exp = list(counts[~small]), list(expected[~small])
    if small.any():
        obs.append(counts[small].sum())
        exp.append(expected[small].sum())
    if len(obs) < 2:
        return 1.0
    obs_a, exp_a = np.asarray(obs), np.asarray(exp)
    if ((exp_a == 0) & (obs_a > 0)).any():
        return 0.0  # a token the law cannot produce
    keep = exp_a > 0
    return float(stats.chisquare(obs_a[keep], exp_a[keep] * obs_a[keep].sum() / exp_a[keep].sum()).pvalue)


def tokens_needed(test, target, draft, law, fault, grid, reps, seed0):  # type: ignore[no-untyped-def]
    """First grid size whose detection rate over `reps` runs is >= 90%, and the rates seen."""
    allowed_misses = reps - math.ceil(0.9 * reps)
    seen = []
    for n in grid:
        hits = misses = runs = 0
        for r in range(reps):
            runs += 1
            if test(target, draft, law, fault, n, seed0 + 7919 * r + n) < ALPHA:
                hits += 1
            else:
                misses += 1
                if misses > allowed_misses:
                    break
        seen.append(f"{n}:{hits}/{runs}")
        if misses <= allowed_misses:
            return n, seen
    return None, seen


def power_table(law: Law, grid: list[int], reps: int) -> None:
    target, draft = tables()
    print(f"\nLaw {law.name} (T {law.temperature}, top_k {law.top_k}, top_p {law.top_p}); tables V={V}, "
          f"{LENGTH} positions, gamma {GAMMA}; detection >= 90% over {reps} runs at significance {ALPHA}")
    print(f"{'fault':<26} {'(a) gate PIT+G, Holm':>22} {'(b) chi2 first token':>22} {'ratio b/a':>10} {'secs':>6}")
    details = []
    for i, fault in enumerate(Fault):
        t0 = time.perf_counter()
        a, seen_a = tokens_needed(gate_combined, target, draft, law, fault, grid, reps, 1000 * i)
        b, seen_b = tokens_needed(first_token_chisquare, target, draft, law, fault, grid, reps, 1000 * i + 500)
        secs = time.perf_counter() - t0
        show = lambda n: f"{n:,}" if n else f"> {grid[-1]:,}"  # noqa: E731
        ratio = f"{b / a:.2g}x" if a and b else ("-" if not a else f"> {grid[-1] / a:.0f}x")
        tag = " (law-preserving)" if fault in LAW_PRESERVING else ""
        print(f"{fault.value + tag:<26} {show(a):>22} {show(b):>22} {ratio:>10} {secs:>6.0f}", flush=True)
        details.append(f"  {fault.value}: (a) {' '.join(seen_a)} | (b) {' '.join(seen_b)}")
    print("detections/runs per size (runs stop once 90% is out of reach):")
    print("\n".join(details))


def false_alarms(law: Law, runs: int, tokens: int) -> None:
    target, draft = tables()
    t0 = time.perf_counter()
    p = [gate_combined(target, draft, law, Fault.NONE, tokens, 100_000 + 13 * r) for r in range(runs)]
    for level in (0.01, 0.05):
        rate = sum(x < level for x in p) / runs
        se = math.sqrt(level * (1 - level) / runs)
        print(f"false alarms, law {law.name}, correct sampler, {tokens:,} tokens x {runs} runs, significance {level}: "
              f"{rate:.3f} (nominal {level}, 1 SE {se:.3f})")
    print(f"  ({time.perf_counter() - t0:.0f} s)")


def smollm2_timing(repeats: int, length: int) -> None:
    from gate.models.load import load_model, load_tokenizer, resolve_source

    t0 = time.perf_counter()
    source = resolve_source("smollm2-135m-instruct", None, Path("."), "x")
    model = load_model(source, "float32", torch.device("cpu"))
    tok = load_tokenizer(source)
    load_s = time.perf_counter() - t0
    text = ("Speculative decoding drafts several tokens with a cheap model and verifies them with the target in one "
            "forward pass; rejection sampling keeps the output distribution exactly the target's. ")
    ids = tok(text * 40, return_tensors="pt").input_ids[:, :length]
    forward_s = []
    with torch.inference_mode():
        for _ in range(repeats):
            t = time.perf_counter()
            logits = model(input_ids=ids).logits[0].float()
            forward_s.append(time.perf_counter() - t)
    n = logits.shape[0]
    per_k = lambda s: 1000.0 * s / n  # noqa: E731 - seconds per 1,000 tokens
    print(f"\nSmolLM2-135M-Instruct (float32, CPU, {torch.get_num_threads()} threads): load {load_s:.0f} s; "
          f"teacher-forced forward of {n} tokens: median {per_k(statistics.median(forward_s)) * 1000:.0f} ms per 1,000 tokens")
    print(f"{'law':<22} {'law_probs':>10} {'rand_pit':>10} {'pit_test':>10} {'total':>10} {'/forward':>9}  (ms per 1,000 tokens, median of {repeats})")
    for law in (Law("t1.0", 1.0), Law("t0.7-p0.9", 0.7, top_p=0.9), Law("t0.8-k50", 0.8, top_k=50)):
        g = torch.Generator().manual_seed(0)
        sampled = torch.multinomial(law_probs(logits, law), 1, generator=g).squeeze(-1)  # tokens the law can produce
        parts: list[list[float]] = [[], [], []]
        for _ in range(repeats):
            t = time.perf_counter()
            probs = law_probs(logits, law)
            t1 = time.perf_counter()
            u = ex.randomized_pit(probs, sampled, g)
            t2 = time.perf_counter()
            test = ex.pit_test(u.numpy(), ALPHA, POWER, DETECT_TV)
            t3 = time.perf_counter()
            parts[0].append(t1 - t)
            parts[1].append(t2 - t1)
            parts[2].append(t3 - t2)
            assert not math.isnan(test.pvalue)
        med = [statistics.median(x) for x in parts]
        total = statistics.median([a + b + c for a, b, c in zip(*parts)])
        print(f"{law.name:<22} {per_k(med[0]) * 1000:>10.1f} {per_k(med[1]) * 1000:>10.1f} {per_k(med[2]) * 1000:>10.1f} "
              f"{per_k(total) * 1000:>10.1f} {total / statistics.median(forward_s):>8.2f}x")
    print("(pit_test's cost is mostly a fixed ~per-call power statement, ks_samples_needed, not per token)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=64_000)
    ap.add_argument("--laws", choices=["both", *LAWS], default="both")
    ap.add_argument("--false-alarm-runs", type=int, default=200)
    ap.add_argument("--false-alarm-tokens", type=int, default=5_000)
    ap.add_argument("--smollm2-tokens", type=int, default=300)
    ap.add_argument("--smollm2-repeats", type=int, default=5)
    ap.add_argument("--skip-smollm2", action="store_true")
    args = ap.parse_args()
    start = time.perf_counter()
    grid = [250]
    while grid[-1] * 2 <= args.max_tokens:
        grid.append(grid[-1] * 2)
    laws = list(LAWS.values()) if args.laws == "both" else [LAWS[args.laws]]
    with memoized_power():
        for law in laws:
            power_table(law, grid, args.reps)
        print()
        for law in laws:
            false_alarms(law, args.false_alarm_runs, args.false_alarm_tokens)
    if not args.skip_smollm2:
        smollm2_timing(args.smollm2_repeats, args.smollm2_tokens)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
