"""Do gate's speedup intervals at load points hold the truth when the machine drifts between windows?

Served runners are timed one window after another at each load point, so a machine that drifts
(another job, thermal state) moves a whole window's requests together. This script builds
served request records as gate.loop.run writes them (no server: the truth is known), a fallback and
one draft at concurrency 1 and 4, `--prompts` paired requests per window, each request's E2E
latency lognormal around its window's (`--request-sd`), and each window slowed by its own
lognormal factor (`--drift-sd`, log sd), and decides the draft's pooled speedup as gate does
(gate.rules.confidence: the paired request bootstrap, then widened by the drift between
windows). For each number of repetitions it prints, side by side:

  A/A: the draft is the fallback (true speedup 1.0); the share of load points whose 95%
       interval excludes 1.0 (nominal: 5%), with the request bootstrap alone and with the drift in;
  power: the draft is `--speedup` x faster; the share of load points whose whole interval
       lies above 1.0 (a `speedup >= 1.0x` rule passes), both ways.

    python benchmarks/drift_coverage.py [--seeds 20] [--reps 1,2,3,5] [--drift-sd 0,0.03,0.06]
        [--speedup 1.15] [--prompts 8] [--request-sd 0.05]
"""

from __future__ import annotations

import argparse
import numpy as np

from gate.records import DraftInfo, Environment, Measurements, RequestRecord
from gate.rules.confidence import between_windows, bootstrap_interval, estimand, peer_selections, widened
from gate.rules.selection import Selection

TOKENS = 16
LOADS = (1, 4)
LEVEL = 0.95


def records(speedup: float, reps: int, prompts: int, request_sd: float, drift_sd: float, seed: int) -> Measurements:
    """A fallback and draft 'd' at each of LOADS, `reps` repetitions, one window per runner each."""
    rng = np.random.default_rng(seed)
    m = Measurements(environment=Environment("3.11", "-", "-", "0", "linux", "cpu", "cpu", 0), laws=["greedy"],
                     drafts={"d": DraftInfo("model", 4, "distribution")})
    for c in LOADS:
        for rep in range(reps):
            for runner in ("fallback", "d"):
                window = rng.lognormal(0, drift_sd) if drift_sd else 1.0
                for p in range(prompts):
                    e2el = 400.0 * c * window * rng.lognormal(0, request_sd) / (speedup if runner == "d" else 1.0)
                    times = [e2el * (i + 1) / TOKENS for i in range(TOKENS)]
                    m.requests.append(RequestRecord(runner, "greedy", f"p{p}", "qa", TOKENS, rep, 10, list(range(TOKENS)),
                                                    times, [1] * TOKENS, None, None, "length", e2el, 0, None, None, None,
                                                    concurrency=c))
    return m


def intervals(m: Measurements, seed: int) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """((low, high) of the request bootstrap alone, (low, high) with the drift in) at each load point."""
    out = []
    for c in LOADS:
        where = Selection("d", "greedy", None, concurrency=(c,))
        est = estimand("speedup", "pooled", m, where)
        peers = [estimand("speedup", "pooled", m, sel) for sel in peer_selections(m, where)]
        boot = bootstrap_interval(est, LEVEL, 500, seed)
        wide = widened(boot, between_windows(est, peers, LEVEL))
        out.append(((boot.low, boot.high), (wide.low, wide.high)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--reps", default="1,2,3,5")
    ap.add_argument("--drift-sd", default="0,0.03,0.06")
    ap.add_argument("--speedup", type=float, default=1.15)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--request-sd", type=float, default=0.05)
    a = ap.parse_args()
    print(f"{a.prompts} paired requests per window, request log sd {a.request_sd}, loads {LOADS}, {a.seeds} seeds "
          f"({a.seeds * len(LOADS)} load points per row), {LEVEL:.0%} intervals")
    print(f"{'drift sd':>8} {'reps':>4} | {'A/A excludes 1.0':^25} | {'power at ' + format(a.speedup, 'g') + 'x: passes':^25}")
    print(f"{'':>8} {'':>4} | {'bootstrap':>11} {'with drift':>12} | {'bootstrap':>11} {'with drift':>12}")
    for drift_sd in [float(x) for x in a.drift_sd.split(",")]:
        for reps in [int(x) for x in a.reps.split(",")]:
            aa, power = np.zeros(2), np.zeros(2)
            n = a.seeds * len(LOADS)
            for seed in range(a.seeds):
                for pair in intervals(records(1.0, reps, a.prompts, a.request_sd, drift_sd, seed), seed):
                    aa += [not (lo <= 1.0 <= hi) for lo, hi in pair]
                for pair in intervals(records(a.speedup, reps, a.prompts, a.request_sd, drift_sd, 10_000 + seed), seed):
                    power += [lo > 1.0 for lo, _ in pair]
            print(f"{drift_sd:>8g} {reps:>4} | {aa[0] / n:>11.0%} {aa[1] / n:>12.0%} | {power[0] / n:>11.0%} {power[1] / n:>12.0%}")


if __name__ == "__main__":
    main()
