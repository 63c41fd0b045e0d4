"""Sequential decisions against the fixed plan, on simulated paired runs of known speedup (issue 42).

Each simulated run is the embedded default's speedup verdict for one draft and law: 24
prompts, one repetition (the fixed plan), the rule `speedup (pooled) >= 1.0x` at 95%,
decided by gate's own rule code (gate.rules.evaluate) on synthetic request records. A
prompt's fallback request takes a time drawn per prompt (lognormal, sd 0.3: prompts differ
in length and content); its paired draft request takes that time over the draft's speedup
on that prompt (lognormal around the row's speedup, sd 0.15: the lookup draft's spread on
MT-bench), and each request carries its own timing noise (lognormal, sd 0.05). The A/A row
is a draft that is the fallback: the same law, no spread of its own.

Busy rows put a neighbour on the machine, as gate's contention handling sees it (each
request's share of wall time some task waited for a CPU; above measurement.max_cpu_stall,
0.1, it is contended and its pair is left out of the verdict, gate.rules.kinds.metric):
  steady:  one CPU-bound neighbour beside gate's fitted threads (measurement.threads auto
           leaves it a core): every request runs 30% slower, both arms of a pair alike
           (the factor varies by 2% within a pair), and no task waits for a CPU (stall 2%);
  bursty:  bursts of other work, a Markov chain over requests (a burst starts after a
           request with probability 0.05 and ends with probability 0.2: busy 20% of the
           time, 5 requests on average): a request in a burst runs 1.5-3x slower on its
           own, and waits for a CPU 30-60% of its wall time (contended).

Three designs per run, on the same simulated requests:
  fixed 24:  today's fixed plan, decided once at 95% on 24 pairs;
  fixed 64:  a fixed plan the size of the sequential budget, decided once on 64 pairs;
  sequential: looks at 8, 16, 24, 32 and 64 pairs (gate.plan.rounds, budget auto), each
             decided at its share of alpha (gate.rules.sequential), stopping at the first
             look that decides.

Per row it prints the decision rate, the wrong decisions (a pass when the speedup is below
1.0x, a fail when above; at exactly 1.0x both are wrong: at most 2.5% each), and the mean
pairs spent. The error rate each design states is 2.5% per side.

    python benchmarks/sequential.py [--runs 500] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gate.plan.rounds import plan_rounds  # noqa: E402
from gate.policy.model import RuleSpec  # noqa: E402
from gate.records import DraftInfo, Environment, LooksRecord, Measurements, RequestRecord  # noqa: E402
from gate.rules.evaluate import Settings, evaluate  # noqa: E402
from gate.rules.status import Status  # noqa: E402
from gate.core.requests import PlannedPrompt  # noqa: E402

PROMPTS, TOKENS = 24, 24
RULE = RuleSpec(id="speedup", metric="speedup", aggregation="pooled", comparison=">=", threshold=1.0)
ROWS = [("0.80x", 0.80, 0.15, "quiet"), ("0.95x", 0.95, 0.15, "quiet"), ("1.00x", 1.00, 0.15, "quiet"),
        ("1.05x", 1.05, 0.15, "quiet"), ("1.25x", 1.25, 0.15, "quiet"), ("A/A", 1.00, 0.0, "quiet"),
        ("0.80x", 0.80, 0.15, "steady"), ("1.05x", 1.05, 0.15, "steady"), ("A/A", 1.00, 0.0, "steady"),
        ("0.80x", 0.80, 0.15, "bursty"), ("1.05x", 1.05, 0.15, "bursty"), ("A/A", 1.00, 0.0, "bursty")]


def record(draft: str, prompt: int, rep: int, e2el_ms: float, stall: float) -> RequestRecord:
    """One request of TOKENS tokens in `e2el_ms`, its tokens evenly spaced, `stall` of its wall
    time waiting for a CPU."""
    times = [e2el_ms * (i + 1) / TOKENS for i in range(TOKENS)]
    return RequestRecord(draft, "greedy", f"p{prompt}", "all", TOKENS, rep, 50, list(range(TOKENS)), times,
                         [1] * TOKENS, [0] * TOKENS, [0] * TOKENS, "length", e2el_ms, 4, None, None, None,
                         cpu_stall_ms=stall * e2el_ms)


@dataclass
class Pairs:
    """A simulated run's requests, drawn pair by pair as a run would measure them."""

    speedup: float
    spread: float
    machine: str  # quiet, steady or bursty (module docstring)
    rng: random.Random

    def __post_init__(self) -> None:
        self.burst = False
        self.base = [1000.0 * self.rng.lognormvariate(0, 0.3) for _ in range(PROMPTS)]  # the workload's prompts
        self.effect = [self.rng.lognormvariate(0, self.spread) if self.spread else 1.0 for _ in range(PROMPTS)]
        mean_effect = sum(b / e for b, e in zip(self.base, self.effect)) / sum(self.base)
        self.effect = [e * mean_effect for e in self.effect]  # the workload's pooled speedup is exactly the row's
        self.records: list[RequestRecord] = []

    def measure(self, n: int) -> None:
        """Pairs up to `n` (prompt u % PROMPTS in repetition u // PROMPTS)."""
        for u in range(len(self.records) // 2, n):
            rep, p = divmod(u, PROMPTS)
            fallback = self.base[p] * self.rng.lognormvariate(0, 0.05)
            draft = self.base[p] / (self.speedup * self.effect[p]) * self.rng.lognormvariate(0, 0.05)
            common = 1.3 if self.machine == "steady" else 1.0
            self.records += [self.busy("fallback", p, rep, fallback * common), self.busy("d", p, rep, draft * common)]

    def busy(self, name: str, prompt: int, rep: int, e2el_ms: float) -> RequestRecord:
        """The request as the machine makes it: the steady neighbour's 2% within a pair, a burst's own slowing."""
        if self.machine == "steady":
            return record(name, prompt, rep, e2el_ms * self.rng.lognormvariate(0, 0.02), 0.02)
        if self.machine == "bursty":
            self.burst = self.rng.random() >= 0.2 if self.burst else self.rng.random() < 0.05
            if self.burst:
                return record(name, prompt, rep, e2el_ms * self.rng.uniform(1.5, 3.0), self.rng.uniform(0.3, 0.6))
        return record(name, prompt, rep, e2el_ms, 0.0)

    def decide(self, n: int, looks: LooksRecord | None = None) -> Status:
        self.measure(n)
        m = Measurements(environment=ENV, laws=["greedy"], drafts={"d": DraftInfo("model")})
        m.requests = self.records[: 2 * n]
        m.looks = looks
        (o,) = evaluate([RULE], m, SETTINGS)
        return o.status


ENV = Environment("3", "2", "5", "0", "linux", "cpu", "cpu", 0)
SETTINGS = Settings(max_client_lag_ms=None)  # measurement.max_cpu_stall and max_contended at their defaults


def wrong(status: Status, speedup: float) -> bool:
    return (status == Status.PASS and speedup <= 1.0) or (status == Status.FAIL and speedup >= 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    prompts = [PlannedPrompt(f"p{i}", "all", (1,)) for i in range(PROMPTS)]
    schedule = plan_rounds(prompts, 1, 1, "auto", False, 0).looks.schedule
    print(f"{args.runs} simulated runs per row; looks at {schedule} pairs; rule speedup (pooled) >= 1.0x at 95%")
    print(f"{'row':>6} | {'machine':>7} | {'design':>10} | {'decided':>8} | {'pass':>6} | {'fail':>6} | {'wrong':>6} | "
          f"{'mean pairs':>10}")
    started = time.perf_counter()
    for name, speedup, spread, machine in ROWS:
        rng = random.Random(f"{args.seed}-{name}-{machine}")
        tally = {d: {"pass": 0, "fail": 0, "wrong": 0, "pairs": 0} for d in ("fixed 24", "fixed 64", "sequential")}
        for _ in range(args.runs):
            run = Pairs(speedup, spread, machine, rng)
            for design, n in (("fixed 24", PROMPTS), ("fixed 64", schedule[-1])):
                s = run.decide(n)
                t = tally[design]
                t["pairs"] += n
                t["pass"] += s == Status.PASS
                t["fail"] += s == Status.FAIL
                t["wrong"] += wrong(s, speedup)
            t = tally["sequential"]
            for k, n in enumerate(schedule, start=1):
                looks = LooksRecord("prompt", schedule, PROMPTS, 1, {"fallback/greedy": k, "d/greedy": k})
                s = run.decide(n, looks)
                if s != Status.INCONCLUSIVE:
                    break
            t["pairs"] += n
            t["pass"] += s == Status.PASS
            t["fail"] += s == Status.FAIL
            t["wrong"] += wrong(s, speedup)
        for design, t in tally.items():
            decided = (t["pass"] + t["fail"]) / args.runs
            print(f"{name:>6} | {machine:>7} | {design:>10} | {decided:>8.1%} | {t['pass'] / args.runs:>6.1%} | "
                  f"{t['fail'] / args.runs:>6.1%} | {t['wrong'] / args.runs:>6.1%} | {t['pairs'] / args.runs:>10.1f}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
