"""Does gate distort what it measures? Side by side, in one run, on SmolLM2-135M-Instruct:

1. committed tokens/s of gate's instrumented fallback loop vs plain `model.generate`
   (greedy, same model, prompts and lengths);
2. committed tokens/s of gate's speculative loop with a bfloat16 draft vs transformers'
   assisted generation (`assistant_model`, constant schedule, no confidence cut-off);
3. overlap measurement tokens/s vs the raw teacher-forced forward passes it needs.

Runs are interleaved and repeated (the overlap pass and its raw forwards in alternating
order); medians and ratios are printed. The machine is shared and noisy: read ratios, not
absolute figures.

    python benchmarks/instrumentation_overhead.py [--prompts 4] [--tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch

from gate.drafts.model import ModelDraft
from gate.core.law import Law
from gate.load.sequential import SEQUENTIAL
from gate.measure.overlap import position_overlaps
from gate.models.cache import forward
from gate.models.loading import load_model, load_tokenizer, resolve_source
from gate.exactness.oracle import TargetOracle
from gate.core.requests import PlannedPrompt, Request
from gate.records import FALLBACK
from gate.runners.interface import StreamResult
from gate.runners.transformers import TransformersRunner
from gate.workloads.interface import select
from gate.workloads.mt_bench import MTBench

GREEDY = Law("greedy", 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    source = resolve_source("smollm2-135m-instruct", None, Path("."), "target.model")
    tok = load_tokenizer(source)
    target = load_model(source, "float32", cpu)
    draft_model = copy.deepcopy(target).to(torch.bfloat16)
    prompts = [tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True)
               for p in select(MTBench().load(), 0, 1, args.prompts, None)]
    prompts = [p["input_ids"] if not isinstance(p, list) else p for p in prompts]
    draft = ModelDraft("bf16", "model", draft_model, 4, cpu)
    runner = TransformersRunner(target, set(), cpu, drafts={"bf16": draft})  # no EOS: every run makes exactly --tokens tokens
    oracle = TargetOracle(target, cpu)
    assistant = copy.deepcopy(draft_model)
    assistant.generation_config.num_assistant_tokens = 4
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    n = args.tokens
    common = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id)

    def hf_generate(ids: list[int], assisted: bool) -> float:
        x = torch.tensor([ids])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(x, attention_mask=torch.ones_like(x), assistant_model=assistant if assisted else None, **common)
        dt = time.perf_counter() - t0
        assert out.shape[1] - x.shape[1] == n
        return n / dt

    def run(ids: list[int], with_draft: bool) -> StreamResult:
        (g,) = runner.run([Request("bf16" if with_draft else FALLBACK, GREEDY, PlannedPrompt("p", "bench", tuple(ids)), n, 0, 0)],
                          SEQUENTIAL)
        if isinstance(g, Exception):
            raise g
        return g

    def gate_generate(ids: list[int], with_draft: bool) -> float:
        g = run(ids, with_draft)
        assert len(g.output_ids) == n
        return n / (g.e2el_ms / 1e3)

    @torch.inference_mode()
    def overlap_s(ids: list[int], start: int) -> float:
        """What gate.loop.run's overlap pass does for one sequence and one draft (seconds)."""
        t0 = time.perf_counter()
        law = GREEDY.bind(start)  # gate.constraints.bind for a request without a response format
        p = oracle.target_probs(ids, start, law)
        q = draft.teacher_forced(ids, start, law, p.shape[-1])
        position_overlaps(p, q.to(p.device))
        return time.perf_counter() - t0

    @torch.inference_mode()
    def raw_s(ids: list[int]) -> float:
        """The teacher-forced forwards alone: the target's and the draft's (seconds)."""
        t0 = time.perf_counter()
        x = torch.tensor([ids[:-1]])
        forward(target, x)
        forward(draft_model, x)
        return time.perf_counter() - t0

    def overlap_rate(ids: list[int], start: int, raw_first: bool) -> tuple[float, float]:
        """Tokens/s of the overlap pass and of its raw forwards. The caller alternates which runs
        first: the first of the two follows a generate call, and neither should always be it."""
        if raw_first:
            raw = raw_s(ids)
            measured = overlap_s(ids, start)
        else:
            measured = overlap_s(ids, start)
            raw = raw_s(ids)
        return (len(ids) - start) / measured, (len(ids) - start) / raw

    for ids in prompts[:1]:  # warm-up
        hf_generate(ids, False), gate_generate(ids, False), hf_generate(ids, True), gate_generate(ids, True)
    rows: dict[str, list[float]] = {k: [] for k in ("hf", "gate", "hf_assisted", "gate_spec", "overlap", "raw_forward")}
    for rep in range(args.repeats):
        for j, ids in enumerate(prompts):
            rows["gate"].append(gate_generate(ids, False))
            rows["hf"].append(hf_generate(ids, False))
            rows["gate_spec"].append(gate_generate(ids, True))
            rows["hf_assisted"].append(hf_generate(ids, True))
            cont = run(ids, False).output_ids
            o, r = overlap_rate(list(ids) + cont, len(ids), raw_first=(rep + j) % 2 == 1)
            rows["overlap"].append(o)
            rows["raw_forward"].append(r)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"SmolLM2-135M-Instruct fp32 target, CPU ({torch.get_num_threads()} threads), greedy, "
          f"{len(prompts)} MT-bench prompts x {args.repeats} repeats, {n} tokens each; medians of {len(rows['hf'])} runs")
    print(f"{'what':58s} {'gate':>10s} {'reference':>10s} {'ratio':>7s}")
    print(f"{'fallback tokens/s: gate loop vs model.generate':58s} {med['gate']:10.1f} {med['hf']:10.1f} {med['gate'] / med['hf']:7.3f}")
    print(f"{'bf16 draft tokens/s: gate loop vs generate(assistant_model)':58s} {med['gate_spec']:10.1f} {med['hf_assisted']:10.1f} {med['gate_spec'] / med['hf_assisted']:7.3f}")
    print(f"{'overlap tokens/s vs raw teacher-forced forwards':58s} {med['overlap']:10.1f} {med['raw_forward']:10.1f} {med['overlap'] / med['raw_forward']:7.3f}")
    print(f"{'speedup bf16 draft over fallback (gate loop)':58s} {med['gate_spec'] / med['gate']:10.3f}")
    print(f"{'speedup bf16 draft over fallback (transformers)':58s} {med['hf_assisted'] / med['hf']:10.3f}")


if __name__ == "__main__":
    main()
