"""Can gate's sampling-exactness verdict lie? Detection, false alarms and passes of every
known fault, on explicit tables and on random tiny models, at a grid of sample sizes.

Every run draws `n` sequences of LENGTH tokens from each of PROMPTS prompts with the
reference speculative sampler (reference, gamma 3), with one injected fault, and
decides them as `gate exactness` does (gate.exactness.stats, the default rule: significance
0.01, power 0.9, detect_tv 0.1):

  gate     next-token G-tests at the first output position of every prompt (claim tests),
           at output prefixes >= 50 samples share (evidence), the PIT KS test over every
           token (evidence); Holm together; pass only when every claim test is powered.
  pit-ks   the PIT Kolmogorov-Smirnov test alone, passing when its DKW power statement
           reaches 0.1 (what gate did before: its power is about the PIT distance, not TV).

Setups: explicit position-dependent tables (V 8, target randn x 1.5, draft = target + randn,
one table pair per prompt) under two laws, and a random tiny Llama (vocab 96, head x 20 so
its laws have shape) with a noisy copy as the draft (head noise 0.15: overlap about 0.7),
random prompts, two weight seeds. The law setups (`laws`, `llama-laws`) add the law's
history-dependent parts (issue 13): penalties (with a prompt that holds likely tokens: on
tables the target's likeliest token at each of the first gamma + 1 positions, on the Llama
the random prompt extended greedily by 4 tokens), min-p, a prefix-dependent grammar
(reference.toy_grammar) and, on tables, all of them at once; every position is judged
against the target's law given its own prefix. The faults in those parts
(reference.LAW_PART_FAULTS) run only on setups whose law has the part. For each fault the
first-position TV is measured (20,000 first tokens per prompt against the exact law; the
largest over the prompts), and TV2, the same at the second position after each first token
that >= 2,000 of them share (a stale penalty history shows only after a proposal: the first
position always starts a block); for each size the counts of fail / pass / inconclusive over
--reps runs.

Summaries: the tokens needed for 90% detection by each procedure, how often a fault whose
first- or second-position TV is >= 0.1 passes (gate's claim: at most 1 - power = 10% at TV
0.1 itself, and far less above it), and the false-alarm rate of the correct sampler.

    python benchmarks/exactness_power.py [--reps 20] [--sizes 25,50,...] [--setups tables,llama,laws,llama-laws]
                                         [--faults none,penalty_draft_only,...]
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference sampler lives with the tests

import gate.exactness.collect as mx
import gate.exactness.stats as ex
from gate.core.law import Law, law_probs
from gate.exactness.verdict import context_test
from reference import (LAW_PRESERVING, Fault, GrammarFn, LogitFn, fault_applies, model_logits, position_law,
                       speculative_sample, table_logits, toy_grammar)

ALPHA, POWER, DETECT_TV = 0.01, 0.9, 0.1
RULE = SimpleNamespace(significance=ALPHA, power=POWER, detect_tv=DETECT_TV)  # gate's default exactness rule
GAMMA, LENGTH, PROMPTS = 3, 8, 4
V_TABLE, V_LLAMA = 8, 96


@dataclass
class Setup:
    """One target/draft pair per prompt, under one law: the prompt ids of each pair (the
    penalties' history before the output; none for tables without penalties) and a grammar
    on the output (None: unconstrained)."""

    name: str
    law: Law
    pairs: list[tuple[LogitFn, LogitFn]]
    prompts: list[list[int]] = field(default_factory=list)
    grammar: GrammarFn | None = None

    def prompt(self, i: int) -> list[int]:
        return self.prompts[i] if self.prompts else []

    def one(self, i: int) -> Setup:
        """The setup of prompt i alone."""
        return Setup(self.name, self.law, [self.pairs[i]], [self.prompt(i)], self.grammar)


def table_setup(law: Law, seed: int, grammar: bool = False) -> Setup:
    """Explicit tables; for a law with penalties, each prompt is the target's most likely
    token at each of the first gamma + 1 positions (so the repetition penalty moves mass at
    the first); `grammar`: under toy_grammar."""
    pairs, prompts = [], []
    for i in range(PROMPTS):
        g = torch.Generator().manual_seed(seed + i)
        target = torch.randn(LENGTH + GAMMA + 1, V_TABLE, generator=g) * 1.5
        draft = target + torch.randn(LENGTH + GAMMA + 1, V_TABLE, generator=g) * 1.0
        pairs.append((table_logits(target), table_logits(draft)))
        prompts.append(list(dict.fromkeys(target[:GAMMA + 1].argmax(-1).tolist())) if law.needs_history else [])
    return Setup(f"tables {law.name}" + (" grammar" if grammar else ""), law, pairs, prompts,
                 toy_grammar(V_TABLE) if grammar else None)


def llama_setup(law: Law, seed: int, grammar: bool = False) -> Setup:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=V_LLAMA, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    models = []
    for noise in (0.0, 0.15):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():
            model.lm_head.weight.mul_(20.0)
            if noise:
                g = torch.Generator().manual_seed(seed + 1)
                model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=g) * noise)
        models.append(model)
    g = torch.Generator().manual_seed(seed + 2)
    prompts = [torch.randint(4, V_LLAMA, (4,), generator=g).tolist() for _ in range(PROMPTS)]
    if law.needs_history:  # extend each prompt greedily, so it holds tokens the target likes (repetition penalty)
        prompts = [greedy_extend(models[0], pr, 4) for pr in prompts]
    return Setup(f"tiny llama seed {seed} {law.name}" + (" grammar" if grammar else ""), law,
                 [(model_logits(models[0], pr), model_logits(models[1], pr)) for pr in prompts], prompts,
                 toy_grammar(V_LLAMA) if grammar else None)


@torch.no_grad()
def greedy_extend(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids


def sample(setup: Setup, fault: Fault, n: int, length: int, seed: int) -> list[torch.Tensor]:
    """[n, length] tokens per prompt."""
    return [speculative_sample(t, d, setup.law, GAMMA, n, length, torch.Generator().manual_seed(seed + 101 * i), fault,
                               setup.prompt(i), setup.grammar)
            for i, (t, d) in enumerate(setup.pairs)]


def target_law(setup: Setup, i: int, prefix: tuple[int, ...]) -> torch.Tensor:
    """The target's law [V] of the output token after `prefix` from prompt i."""
    tokens = torch.tensor([list(prefix) + [0]], dtype=torch.long)
    at = torch.tensor([[len(prefix)]])
    return position_law(setup.pairs[i][0](tokens, at), setup.law, tokens, at, setup.prompt(i), setup.grammar)[0, 0]


def decide_run(setup: Setup, outs: list[torch.Tensor], seed: int) -> tuple[str, str]:
    """(gate's verdict, the PIT-KS-alone verdict) on one run's samples."""
    tests: list[ex.ExactnessTest] = []
    pit: list[float] = []
    g = torch.Generator().manual_seed(seed)
    for i, ((target, _), out) in enumerate(zip(setup.pairs, outs)):
        at = torch.arange(out.shape[1]).expand(out.shape[0], -1)
        probs = position_law(target(out, at), setup.law, out, at, setup.prompt(i), setup.grammar)  # [n, L, V]
        pit += mx.randomized_pit(probs.reshape(-1, probs.shape[-1]), out.reshape(-1), g).tolist()
        for prefix, tokens in mx.contexts(out.tolist()):
            nt = mx.sparse_counts(f"p{i}", tokens, target_law(setup, i, prefix), prefix=prefix)
            tests.append(context_test(nt, RULE))
    ks = ex.pit_test(np.asarray(pit), ALPHA, POWER, DETECT_TV)
    ex.decide(tests + [ks], ALPHA)
    gate_verdict = ex.overall(tests + [ks])
    alone = ex.pit_test(np.asarray(pit), ALPHA, POWER, DETECT_TV)
    old = ex.FAIL if alone.pvalue < ALPHA else (ex.PASS if alone.detectable <= DETECT_TV else ex.INCONCLUSIVE)
    return gate_verdict, old


def position_tvs(setup: Setup, fault: Fault, draws: int = 20_000, min_share: int = 2_000) -> tuple[float, float]:
    """(TV1, TV2): max over prompts of TV(law of the first output token, the target's law
    there), and the same at the second output token after each first token that at least
    `min_share` of the `draws` samples share."""
    tv1 = tv2 = 0.0
    for i in range(len(setup.pairs)):
        out = sample(setup.one(i), fault, draws, 2, 7)[0]
        p = target_law(setup, i, ())
        freq = torch.bincount(out[:, 0], minlength=p.shape[-1]).double() / draws
        tv1 = max(tv1, 0.5 * float((freq - p.double()).abs().sum()))
        for first in out[:, 0].unique().tolist():
            nexts = out[out[:, 0] == first, 1]
            if nexts.numel() >= min_share:
                p = target_law(setup, i, (first,))
                freq = torch.bincount(nexts, minlength=p.shape[-1]).double() / nexts.numel()
                tv2 = max(tv2, 0.5 * float((freq - p.double()).abs().sum()))
    return tv1, tv2


class memoized_power:  # noqa: N801 - a context manager
    """gtest_detectable and ks_detectable are pure; memoize them inside the simulations."""

    def __enter__(self) -> None:
        self.saved = ex.gtest_detectable, ex.ks_detectable
        ex.gtest_detectable = functools.lru_cache(maxsize=None)(ex.gtest_detectable)
        ex.ks_detectable = functools.lru_cache(maxsize=None)(ex.ks_detectable)

    def __exit__(self, *exc: object) -> None:
        ex.gtest_detectable, ex.ks_detectable = self.saved


def tokens(n: int) -> int:
    return n * PROMPTS * LENGTH


def run_setup(setup: Setup, sizes: list[int], reps: int, summary: dict[str, list], faults: list[Fault]) -> None:
    """The faults of `faults` that apply to the setup's law (fault_applies), at every size."""
    print(f"\n{setup.name}: {PROMPTS} prompts x n sequences x {LENGTH} tokens, gamma {GAMMA}; "
          f"{reps} runs per size; F/P/I = fail/pass/inconclusive counts", flush=True)
    print(f"{'fault':<26} {'TV1':>5} {'TV2':>5}  " + "  ".join(f"{tokens(n):>6}tok" for n in sizes)
          + "   | pit-ks alone: F/P", flush=True)
    for fi, fault in enumerate(Fault):
        if fault not in faults or not fault_applies(fault, setup.law, setup.grammar):
            continue
        t0 = time.perf_counter()
        tv, tv2 = position_tvs(setup, fault)
        cells, old_cells = [], []
        for n in sizes:
            verdicts = [decide_run(setup, sample(setup, fault, n, LENGTH, 10_000 * fi + 97 * r + n), 5 * r + n)
                        for r in range(reps)]
            f, p, i = (sum(v[0] == s for v in verdicts) for s in (ex.FAIL, ex.PASS, ex.INCONCLUSIVE))
            of, op = (sum(v[1] == s for v in verdicts) for s in (ex.FAIL, ex.PASS))
            cells.append(f"{f:>2}/{p:>2}/{i:>2}")
            old_cells.append(f"{of}/{op}")
            summary["rows"].append((setup.name, fault, tv, n, f, p, i, of, op, reps, tv2))
        tag = " (exact)" if fault in LAW_PRESERVING else ""
        print(f"{fault.value + tag:<26} {tv:>5.3f} {tv2:>5.3f}  " + "  ".join(f"{c:>9}" for c in cells)
              + "   | " + " ".join(old_cells) + f"   ({time.perf_counter() - t0:.0f} s)", flush=True)


def needed(rows: list, setup: str, fault: Fault, which: int) -> int | None:
    """Tokens at the first size where >= 90% of runs failed (which: 4 gate, 7 pit-ks)."""
    for r in rows:
        if r[0] == setup and r[1] is fault and r[which] >= math.ceil(0.9 * r[9]):
            return tokens(r[3])
    return None


def report(summary: dict[str, list], sizes: list[int]) -> None:
    rows = summary["rows"]
    setups = list(dict.fromkeys(r[0] for r in rows))
    print("\nTokens for 90% detection at significance 0.01 (gate | PIT-KS alone); '>' = not within the grid")
    print(f"{'fault':<26} " + "  ".join(f"{s[:26]:>26}" for s in setups))
    for fault in Fault:
        if fault in LAW_PRESERVING or not any(r[1] is fault for r in rows):
            continue
        cells = []
        for s in setups:
            if not any(r[0] == s and r[1] is fault for r in rows):
                cells.append("-")  # not run on this setup (its law lacks the part, or not selected)
                continue
            a, b = needed(rows, s, fault, 4), needed(rows, s, fault, 7)
            last = tokens(max(r[3] for r in rows if r[0] == s))
            show = lambda x: f"{x:,}" if x else f">{last:,}"  # noqa: E731
            cells.append(f"{show(a)} | {show(b)}")
        print(f"{fault.value:<26} " + "  ".join(f"{c:>26}" for c in cells))
    faulty = [r for r in rows if r[1] not in LAW_PRESERVING]
    big = [r for r in faulty if max(r[2], r[10]) >= DETECT_TV]
    print(f"\nPasses of faulty samplers, all setups and sizes: gate {sum(r[5] for r in faulty)} of {sum(r[9] for r in faulty)} "
          f"runs; PIT-KS alone {sum(r[8] for r in faulty)} of {sum(r[9] for r in faulty)}")
    print(f"  of which first- or second-position TV >= {DETECT_TV}: gate {sum(r[5] for r in big)} of {sum(r[9] for r in big)}; "
          f"PIT-KS alone {sum(r[8] for r in big)} of {sum(r[9] for r in big)}")
    for r in faulty:
        if r[5]:
            print(f"  gate passed {r[1].value} on {r[0]} at {tokens(r[3]):,} tokens in {r[5]} of {r[9]} runs "
                  f"(TV1 {r[2]:.3f}, TV2 {r[10]:.3f})")
    exact = [r for r in rows if r[1] in LAW_PRESERVING]
    print(f"Exact samplers (none, bonus_skipped): gate failed {sum(r[4] for r in exact)} of {sum(r[9] for r in exact)} runs, "
          f"passed {sum(r[5] for r in exact)}")


def false_alarms(setup: Setup, n: int, runs: int) -> None:
    if runs <= 0:
        return
    t0 = time.perf_counter()
    verdicts = [decide_run(setup, sample(setup, Fault.NONE, n, LENGTH, 500_000 + 13 * r), r)[0] for r in range(runs)]
    rate = sum(v == ex.FAIL for v in verdicts) / runs
    se = math.sqrt(ALPHA * (1 - ALPHA) / runs)
    print(f"false alarms, {setup.name}, correct sampler, {tokens(n):,} tokens x {runs} runs at significance {ALPHA}: "
          f"{rate:.3f} (nominal {ALPHA}, 1 SE {se:.3f}); passed {sum(v == ex.PASS for v in verdicts)}, "
          f"inconclusive {sum(v == ex.INCONCLUSIVE for v in verdicts)} ({time.perf_counter() - t0:.0f} s)", flush=True)


def smollm2_timing(repeats: int, length: int) -> None:
    from gate.models.loading import load_model, load_tokenizer, resolve_source

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
        sampled = torch.multinomial(law_probs(logits, law), 1, generator=g).squeeze(-1)
        parts: list[list[float]] = [[], [], []]
        for _ in range(repeats):
            t = time.perf_counter()
            probs = law_probs(logits, law)
            t1 = time.perf_counter()
            u = mx.randomized_pit(probs, sampled, g)
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


SETUPS: dict[str, Callable[[], list[Setup]]] = {
    "tables": lambda: [table_setup(Law("t0.8-k6", 0.8, top_k=6), 2), table_setup(Law("t1-p0.9", 1.0, top_p=0.9), 20)],
    "llama": lambda: [llama_setup(Law("t0.8", 0.8), 0), llama_setup(Law("t1-k20", 1.0, top_k=20), 1)],
    # the law's history-dependent parts and the faults in them (issue 13)
    "laws": lambda: [table_setup(Law("t1-rep2-pres1-freq1", 1.0, repetition_penalty=2.0, presence_penalty=1.0,
                                     frequency_penalty=1.0), 2),
                     table_setup(Law("t1-minp0.2", 1.0, min_p=0.2), 2),
                     table_setup(Law("t1", 1.0), 2, grammar=True),
                     table_setup(Law("t1-all", 1.0, min_p=0.1, repetition_penalty=1.5, presence_penalty=0.5,
                                     frequency_penalty=0.5, logit_bias=((0, 0.5),)), 20, grammar=True)],
    "llama-laws": lambda: [llama_setup(Law("t0.8-rep1.5-pres1-freq1", 0.8, repetition_penalty=1.5, presence_penalty=1.0,
                                           frequency_penalty=1.0), 0),
                           llama_setup(Law("t0.8-minp0.2", 0.8, min_p=0.2), 0),
                           llama_setup(Law("t0.8", 0.8), 0, grammar=True)],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20, help="runs per size, tables")
    ap.add_argument("--sizes", default="25,50,100,200,400,800,1600", help="sequences per prompt, tables")
    ap.add_argument("--llama-reps", type=int, default=10, help="runs per size, tiny llama")
    ap.add_argument("--llama-sizes", default="50,200,800", help="sequences per prompt, tiny llama")
    ap.add_argument("--setups", default="tables,llama,laws,llama-laws", help=f"of {', '.join(SETUPS)}")
    ap.add_argument("--faults", default=",".join(f.value for f in Fault),
                    help="faults to run (those a setup's law lacks the part for are skipped there)")
    ap.add_argument("--false-alarm-runs", type=int, default=100)
    ap.add_argument("--false-alarm-n", type=int, default=400)
    ap.add_argument("--smollm2", action="store_true", help="also time PIT values on SmolLM2")
    args = ap.parse_args()
    start = time.perf_counter()
    torch.set_num_threads(1)
    tables = ([int(x) for x in args.sizes.split(",")], args.reps)
    llama = ([int(x) for x in args.llama_sizes.split(",")], args.llama_reps)
    grids = {"tables": tables, "llama": llama, "laws": tables, "llama-laws": llama}
    faults = [Fault(x) for x in args.faults.split(",")]
    setups = [(s, *grids[name]) for name in args.setups.split(",") for s in SETUPS[name]()]
    summary: dict[str, list] = {"rows": []}
    with memoized_power():
        for setup, sizes, reps in setups:
            run_setup(setup, sizes, reps, summary, faults)
        report(summary, max((g[0] for g in grids.values()), key=max))
        print()
        for setup, _, _ in setups:
            false_alarms(setup, args.false_alarm_n, args.false_alarm_runs)
    if args.smollm2:
        smollm2_timing(5, 300)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
