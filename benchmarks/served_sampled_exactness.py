"""How often gate's served sampled-exactness verdict fails, passes and is inconclusive, per
sampler fault and sample budget, against a naive pooled test, over many runs.

The speculative sampler is tests/sampler_server.py's (a tiny sharp target and a noisy draft,
the first token from the prefill, then speculative steps with an injectable fault), called
in-process so that hundreds of runs fit in minutes; the HTTP path is covered by
tests/{unit,integration}/test_served_sampled.py. Each run draws, with fresh seeds, `budget` 4-token samples of
one prompt from the fallback (no speculation) and from the sampler under test, builds gate's
records with gate's own code (gate.exactness.sampled.runner_record) and decides them with
gate's rule (gate.exactness.verdict.evaluate_exactness, detect_tv 0.1, power 0.9,
significance 0.01). "batch_residual" runs half its samples batched (the residual fault on),
as at a second load point.

The naive test pools every speculative token (positions 1-3) of the sampler under test into
one G-test against the average of the target's laws at their contexts, and passes whatever
it does not reject: no power stated, no context kept apart.

    python benchmarks/served_sampled_exactness.py [--runs 100] [--budgets planned,256]

Prints one row per fault and budget: the exact TV of the fault's law at the first speculative
position, then gate's fail / pass / inconclusive counts and the naive test's fail / pass.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import sharp_llama, tiny_tokenizer  # noqa: E402
from sampler_server import FAULTS, Sampler  # noqa: E402

from gate.core.law import Law  # noqa: E402
from gate.measure.environment import environment  # noqa: E402
from gate.plan.matrix import encoder  # noqa: E402
from gate.policy.model import RuleSpec  # noqa: E402
from gate.records import DraftInfo, Measurements  # noqa: E402
from gate.exactness.verdict import evaluate_exactness  # noqa: E402
from gate.exactness.stats import next_token_test  # noqa: E402
from gate.core.requests import PlannedPrompt  # noqa: E402
from gate.exactness.sampled import SAMPLE_TOKENS, TESTS_PER_PROMPT, planned_samples, runner_record  # noqa: E402

PROMPT = "w1 w2 w3 w4 w1 w2"
LAW = Law("t0.5-k5", 0.5, 5)
RULE = RuleSpec(id="exact", kind="exactness", detect_tv=0.1, power=0.9, significance=0.01)


def draw(sampler: Sampler, ids: list[int], n: int, fault: str, seed: int) -> list[list[int]]:
    out = []
    for i in range(n):
        batched = fault == "batch_residual" and i % 2 == 1
        out.append(sampler.generate(ids, SAMPLE_TOKENS, LAW, seed * 1_000_003 + i, fault, batched))
    return out


def gate_verdict(sampler: Sampler, ids: list[int], outputs: list[list[int]], reference: list[list[int]]) -> str:
    def target_law(prompt_id: str, prefix: tuple[int, ...]) -> torch.Tensor:
        return sampler.law("target", ids + list(prefix), LAW)

    m = Measurements(environment=environment(torch.device("cpu"), 0), laws=[LAW.name],
                     drafts={"d": DraftInfo("model", 3, "distribution")})
    m.exactness = [runner_record("fallback", LAW.name, {"a": reference}, None, target_law),
                   runner_record("d", LAW.name, {"a": outputs}, {"a": reference}, target_law)]
    (o,) = evaluate_exactness(RULE, m, ["d"], [LAW.name])
    return str(o.status)


def naive_verdict(sampler: Sampler, ids: list[int], outputs: list[list[int]]) -> str:
    vocab = sampler.law("target", ids, LAW).numel()
    observed = np.zeros(vocab)
    expected = np.zeros(vocab)
    for out in outputs:
        for j in range(1, len(out)):
            expected += sampler.law("target", ids + out[:j], LAW).numpy()
            observed[out[j]] += 1
    test = next_token_test(observed, expected / expected.sum(), RULE.significance, RULE.power, RULE.detect_tv)
    return "fail" if test.pvalue < RULE.significance else "pass"


class _Session:
    """What gate's planner reads of a session: the local target's law (here the sampler's)."""

    def __init__(self, sampler: Sampler):
        self.oracle = self
        self.sampler = sampler

    def target_probs(self, ids: list[int], start: int, law: object) -> torch.Tensor:
        return self.sampler.law("target", ids[:-1], LAW)[None]


def planned(sampler: Sampler, ids: list[int]) -> int:
    """The samples gate's planner (gate.exactness.sampled.planned_samples) chooses for this prompt."""
    return planned_samples(_Session(sampler), LAW, PlannedPrompt("a", "c", tuple(ids)), RULE.detect_tv, RULE.power,
                           RULE.significance / TESTS_PER_PROMPT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--budgets", default="planned,256",
                    help="samples per runner and run, comma-separated ('planned': what gate's planner chooses)")
    ap.add_argument("--faults", default=",".join(FAULTS), help="sampler faults, comma-separated ('none': correct)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sampler = Sampler(sharp_llama(0.0), sharp_llama(0.15))
    ids = encoder(tiny_tokenizer(), True)([{"role": "user", "content": PROMPT}])  # as gate's workload feeds it
    x = int(sampler.law("target", ids, LAW).argmax())
    p1 = sampler.first_step_law(ids + [x], LAW, "fallback")
    load = os.getloadavg()
    started = time.time()
    print(f"law {LAW.name}, detect_tv {RULE.detect_tv}, power {RULE.power}, significance {RULE.significance}, "
          f"{args.runs} runs per row; load average at start {load[0]:.2f} on {os.cpu_count()} cores")
    budgets = [planned(sampler, ids) if b == "planned" else int(b) for b in args.budgets.split(",")]
    print(f"gate's planner chooses {planned(sampler, ids)} samples per runner for this prompt and rule")
    print(f"{'fault':16} {'budget':>6} {'TV@pos1':>8} | {'gate fail':>9} {'pass':>5} {'inconcl':>7} | "
          f"{'naive fail':>10} {'pass':>5}")
    for budget in budgets:
        for fault in args.faults.split(","):
            law1 = sampler.first_step_law(ids + [x], LAW, fault)
            if fault == "batch_residual":  # half the samples batched: the mixture of the two laws
                law1 = 0.5 * law1 + 0.5 * sampler.first_step_law(ids + [x], LAW, "residual_p")
            tv = 0.5 * float((law1 - p1).abs().sum())
            gate_counts: Counter = Counter()
            naive_counts: Counter = Counter()
            for run in range(args.runs):
                reference = draw(sampler, ids, budget, "fallback", 2 * run)
                outputs = draw(sampler, ids, budget, fault, 2 * run + 1)
                gate_counts[gate_verdict(sampler, ids, outputs, reference)] += 1
                naive_counts[naive_verdict(sampler, ids, outputs)] += 1
            print(f"{fault:16} {budget:>6} {tv:>8.3f} | {gate_counts['fail']:>9} {gate_counts['pass']:>5} "
                  f"{gate_counts['inconclusive']:>7} | {naive_counts['fail']:>10} {naive_counts['pass']:>5}", flush=True)
    load = os.getloadavg()
    print(f"{time.time() - started:.0f} s; load average at end {load[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
