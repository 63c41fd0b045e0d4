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

Served sampled exactness (--part exactness): tests/sampler_server.py's speculative sampler
(a sharp tiny target, a noisy draft; the first token from the prefill, then speculative steps
with an injectable fault), one prompt. Laws: temperature 0.5 with top-k 5, and temperature 1
over a 48-token vocabulary (a long tail: sparse counts, where asymptotic tests are off). So
that 500 runs per row fit in minutes on 2 cores, each sample is its first two tokens drawn
from their exact laws: the prefill's from the target's, the first speculative position's
from the sampler's under the fault (Sampler.first_step_law, Leviathan et al. 2023, Theorem 1,
with the fault's change), where the claim tests are; the full 4-token path through the HTTP
server is tests/integration/test_served_sampled.py's. Each run draws fresh samples from the
fallback (no speculation) and the sampler under test, builds gate's records
(gate.exactness.sampled.runner_record) and decides them with gate's rule code (detect_tv 0.1,
power 0.9, significance 0.001, the defaults) two ways:
  fixed:      the plan gate sizes (planned_samples at the full significance), decided once;
  sequential: looks at 1/8, 1/4, 1/2 and all of the plan sized at the last look's share
              (gate.plan.rounds.SAMPLE_LOOKS), each decided at its share
              (gate.rules.sequential.sample_level), stopping at the first that decides.
Per row: the TV of the fault's law at the first speculative position, the decision rate,
passes, fails, wrong decisions (a fail of the correct sampler, at most the significance; a
pass of a fault whose TV is at least detect_tv, at most 1 - power = 10%), and the mean
samples per runner.

    python benchmarks/sequential.py [--runs 500] [--seed 0] [--part speedup|exactness|all] [--laws t0.5-k5,t1-v48]
                                       [--faults none,residual_p,...]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gate.core.requests import PlannedPrompt
from gate.plan.rounds import plan_rounds
from gate.policy.model import RuleSpec
from gate.records import DraftInfo, Environment, LooksRecord, Measurements, RequestRecord
from gate.rules.evaluate import Settings, evaluate
from gate.rules.status import Status

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
    ap.add_argument("--part", choices=["speedup", "exactness", "all"], default="all")
    ap.add_argument("--laws", default="t0.5-k5,t1-v48", help="the exactness part's laws, comma-separated")
    ap.add_argument("--faults", default=None, help="the exactness part's sampler faults, comma-separated (all)")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"load average at start {load:.2f} on {os.cpu_count()} cores")
    if args.part in ("speedup", "all"):
        speedup_rows(args)
    if args.part in ("exactness", "all"):
        exactness_rows(args)
    print(f"load average at end {os.getloadavg()[0]:.2f}")


def speedup_rows(args: argparse.Namespace) -> None:
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


def hash_of(*parts: str) -> int:
    """A stable seed from `parts` (Python's hash() of a str changes per process)."""
    return zlib.crc32("|".join(parts).encode())


EXACT_RULE = RuleSpec(id="exact", kind="exactness", detect_tv=0.1, power=0.9)
EXACT_PROMPT = [5, 6, 7, 8, 5, 6]


def exactness_rows(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import sharp_llama
    from sampler_server import FAULTS, Sampler

    from gate.core.law import Law
    from gate.exactness.sampled import TESTS_PER_PROMPT, runner_record
    from gate.exactness.sampled import _samples_for as samples_for
    from gate.exactness.verdict import evaluate_exactness
    from gate.measure.environment import environment
    from gate.plan.rounds import SAMPLE_LOOKS, sample_share
    from gate.records import SampleLooksRecord

    torch.set_num_threads(1)
    rule = EXACT_RULE
    setups = [
        ("t0.5-k5", Law("t0.5-k5", 0.5, 5), {}, FAULTS),
        ("t1-v48", Law("t1-v48", 1.0), {"vocab_size": 48}, ("none", "residual_p", "accept_all", "batch_residual")),
    ]
    print(f"\nserved sampled exactness: {args.runs} simulated runs per row; detect_tv {rule.detect_tv}, power "
          f"{rule.power}, significance {rule.significance}; sample looks at {', '.join(f'{f:g}' for f in SAMPLE_LOOKS)} "
          "of the plan")
    print(f"{'law':>8} | {'fault':>14} | {'TV@1':>5} | {'design':>10} | {'decided':>8} | {'pass':>6} | {'fail':>6} | "
          f"{'wrong':>6} | {'mean samples':>12}")
    started = time.perf_counter()
    for law_name, law, overrides, faults in (x for x in setups if x[0] in args.laws.split(",")):
        sampler = Sampler(sharp_llama(0.0, **overrides), sharp_llama(0.15, **overrides))
        ids = EXACT_PROMPT
        first = sampler.law("target", ids, law)

        def planned(share: float) -> int:
            # gate.exactness.sampled.planned_samples: the cheapest of the 3 likeliest first tokens' position-1 tests
            level = share * rule.significance / TESTS_PER_PROMPT
            best = 4096
            for x in torch.topk(first, 3).indices.tolist():
                best = min(best, samples_for(sampler.law("target", ids + [x], law), float(first[x]), rule.detect_tv,
                                             rule.power, level))
            return best

        n_fixed, n_seq = planned(1.0), planned(sample_share(len(SAMPLE_LOOKS)))
        x = int(first.argmax())
        p1 = sampler.first_step_law(ids + [x], law, "fallback")

        def target_law(prompt_id: str, prefix: tuple[int, ...]) -> torch.Tensor:
            return sampler.law("target", ids + list(prefix), law)

        def decide(out: list[list[int]], ref: list[list[int]], look: int | None) -> Status:
            m = Measurements(environment=environment(torch.device("cpu"), 0), laws=[law_name],
                             drafts={"d": DraftInfo("model", 3, "distribution")})
            m.exactness = [runner_record("fallback", law_name, {"a": ref}, None, target_law),
                           runner_record("d", law_name, {"a": out}, {"a": ref}, target_law)]
            if look is not None:
                m.sample_looks = SampleLooksRecord(list(SAMPLE_LOOKS), look)
            (o,) = evaluate_exactness(rule, m, ["d"], [law_name])
            return o.status

        for fault in (f for f in faults if args.faults is None or f in args.faults.split(",")):
            law1 = sampler.first_step_law(ids + [x], law, fault)
            if fault == "batch_residual":  # half the samples batched: the mixture of the two laws
                law1 = 0.5 * law1 + 0.5 * sampler.first_step_law(ids + [x], law, "residual_p")
            tv = 0.5 * float((law1 - p1).abs().sum())
            tally = {d: {"pass": 0, "fail": 0, "wrong": 0, "samples": 0} for d in ("fixed", "sequential")}
            support = [t for t in range(first.numel()) if first[t] > 0]
            ref_laws = {t: sampler.first_step_law(ids + [t], law, "fallback") for t in support}
            laws = {t: sampler.first_step_law(ids + [t], law, fault) for t in support}
            if fault == "batch_residual":
                laws = {t: 0.5 * laws[t] + 0.5 * sampler.first_step_law(ids + [t], law, "residual_p") for t in support}
            g = torch.Generator().manual_seed(args.seed * 1_000_003 + hash_of(law_name, fault))

            def draw(n: int, at: dict[int, torch.Tensor]) -> list[list[int]]:
                xs = torch.multinomial(first, n, replacement=True, generator=g).tolist()
                out = [[x] for x in xs]
                for t in set(xs):
                    where = [i for i, x in enumerate(xs) if x == t]
                    ys = torch.multinomial(at[t], len(where), replacement=True, generator=g).tolist()
                    for i, y in zip(where, ys):
                        out[i].append(y)
                return out

            for run in range(args.runs):
                n = max(n_fixed, n_seq)
                ref, out = draw(n, ref_laws), draw(n, laws)
                results = [("fixed", decide(out[:n_fixed], ref[:n_fixed], None), n_fixed)]
                for k, frac in enumerate(SAMPLE_LOOKS, start=1):
                    upto = math.ceil(n_seq * frac)
                    status = decide(out[:upto], ref[:upto], k)
                    if status != Status.INCONCLUSIVE:
                        break
                results.append(("sequential", status, upto))
                for design, status, spent in results:
                    t = tally[design]
                    t["samples"] += spent
                    t["pass"] += status == Status.PASS
                    t["fail"] += status == Status.FAIL
                    t["wrong"] += (status == Status.FAIL) if fault == "none" else (
                        status == Status.PASS and tv >= rule.detect_tv)
            for design, t in tally.items():
                decided = (t["pass"] + t["fail"]) / args.runs
                print(f"{law_name:>8} | {fault:>14} | {tv:>5.3f} | {design:>10} | {decided:>8.1%} | "
                      f"{t['pass'] / args.runs:>6.1%} | {t['fail'] / args.runs:>6.1%} | {t['wrong'] / args.runs:>6.1%} | "
                      f"{t['samples'] / args.runs:>12.0f}", flush=True)
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
