"""The resident bill against an accelerator's measured peak, per runner (issue 43): a prepared
device check that runs unchanged on one GPU and, at toy sizes, on a CPU (the tests run it so).

It builds random-weight models from configs on the device (nothing is downloaded):

  llama-1b      a Llama-architecture target of about 1.2B parameters (Llama 3.2 1B's shape)
  llama-8b      about 8.0B parameters (Llama 3.1 8B's shape)
  mistral-gqa   a GQA target with a sliding-window config (window 1,024 below the context)

each in bfloat16, with two drafts: `small`, a separate ~0.16B Llama of the same vocabulary, and
`exit`, the target's first quarter of layers (gate's early_exit kind, weights shared). It runs
gate's own loop (the in-process runner `gate check` uses) at num_draft_tokens 4 and 8, on prompts
that fill a long context (4,096 tokens with the output), and prints per runner:

  - the bill's total and each line (gate.measure.bill, from the loaded weights, as gate check
    bills them), at the context the requests reach and one sequence;
  - the measured peak: torch.cuda.max_memory_allocated over the runner's requests, reset before
    each, less the drafts loaded beside it that it does not use (gate.measure.device_memory), and
    the reserved peak;
  - bill / peak (within 10% is the issue's bar: the bill predicts what the device needs);
  - committed tokens/s of gate's loop against transformers' `generate(assistant_model=...)`
    (`assistant_early_exit=` for the early-exit draft) at the same K (a constant schedule) and
    greedy, side by side on the same target, as a ratio.

Random weights make random text: acceptance is near zero for both loops, so the tokens/s figures
compare the loops' own costs per step, not a draft's worth.

    python benchmarks/gpu_bill.py                 # on one GPU (about 5 min on an H100)
    python benchmarks/gpu_bill.py --toy           # toy sizes, any device (the tests run this)
    python benchmarks/gpu_bill.py --targets llama-1b --num-draft-tokens 4
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gate.core.law import Law  # noqa: E402
from gate.core.requests import PlannedPrompt, Request  # noqa: E402
from gate.drafts import registry as draft_kinds  # noqa: E402
from gate.drafts.early_exit import early_exit_draft  # noqa: E402
from gate.drafts.model import ModelDraft  # noqa: E402
from gate.load.sequential import SEQUENTIAL  # noqa: E402
from gate.measure.bill import bills_for, kv_format  # noqa: E402
from gate.measure.device_memory import NO_ACCELERATOR  # noqa: E402
from gate.measure.kv import cache_model  # noqa: E402
from gate.models.loading import dtype_name, weight_bytes  # noqa: E402
from gate.policy.model import ResourcesSpec  # noqa: E402
from gate.records import FALLBACK  # noqa: E402
from gate.runners.transformers import TransformersRunner  # noqa: E402

GREEDY = Law("greedy", 0.0)
GiB = 2**30

# name -> (transformers config class name, config fields); the draft is a Llama of the same vocabulary
FULL = {
    "llama-1b": ("LlamaConfig", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      tie_word_embeddings=True, max_position_embeddings=8192)),
    "llama-8b": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      tie_word_embeddings=False, max_position_embeddings=8192)),
    "mistral-gqa": ("MistralConfig", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                                          num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                                          sliding_window=1024, tie_word_embeddings=False,
                                          max_position_embeddings=8192)),
}
FULL_DRAFT = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=12,
                  num_key_value_heads=4, tie_word_embeddings=True, max_position_embeddings=8192)
TOY = {
    "llama-1b": ("LlamaConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True,
                                      max_position_embeddings=512)),
    "llama-8b": ("LlamaConfig", dict(hidden_size=96, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False,
                                      max_position_embeddings=512)),
    "mistral-gqa": ("MistralConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=1, vocab_size=512,
                                          sliding_window=32, tie_word_embeddings=False,
                                          max_position_embeddings=512)),
}
TOY_DRAFT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, tie_word_embeddings=True, max_position_embeddings=512)


@dataclass
class Row:
    """One runner of one target at one K: the bill beside the measured peak, and the loops' speeds."""

    target: str
    runner: str
    k: int | None
    bill_bytes: int
    lines: list[tuple[str, int]]
    peak_bytes: int | None
    reserved_bytes: int | None
    gate_tps: float
    hf_tps: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        """bill / measured peak (None: no peak measured)."""
        return self.bill_bytes / self.peak_bytes if self.peak_bytes else None


def build(cls_name: str, fields: dict[str, Any], device: torch.device, seed: int) -> torch.nn.Module:
    """A random-weight causal LM of `cls_name` (a transformers config class) built on `device`
    in bfloat16 (float32 on a CPU, which has no fast bfloat16 matmul here)."""
    import transformers

    config = getattr(transformers, cls_name)(**fields)
    model_cls = transformers.AutoModelForCausalLM.from_config
    torch.manual_seed(seed)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = model_cls(config, torch_dtype=dtype)
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[Any, float]:
    """fn() and its wall seconds, the device synchronised on both sides."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def prompts(n: int, length: int, vocab: int, seed: int) -> list[PlannedPrompt]:
    g = torch.Generator().manual_seed(seed)
    return [
        PlannedPrompt(f"p{i}", "random", tuple(torch.randint(3, vocab, (length,), generator=g).tolist()))
        for i in range(n)
    ]


def gate_rows(
    name: str, target: torch.nn.Module, small: torch.nn.Module, ks: list[int], device: torch.device, args: Any
) -> tuple[list[Row], TransformersRunner, list[PlannedPrompt]]:
    """Every runner of `target` through gate's loop: its bill, measured peak and tokens/s."""
    layers = target.config.num_hidden_layers
    drafts: dict[str, Any] = {}
    for k in ks:
        drafts[f"small-k{k}"] = ModelDraft(f"small-k{k}", "model", small, k, device, target.config.vocab_size)
        drafts[f"exit-k{k}"] = early_exit_draft(f"exit-k{k}", target, max(1, layers // 4), k, device, "bench")
    runner = TransformersRunner(target, set(), device, drafts=drafts)
    planned = prompts(args.requests, args.context - args.new_tokens, target.config.vocab_size, 0)
    tps: dict[str, float] = {}
    with runner:
        for runner_name in [FALLBACK, *drafts]:
            warm = Request(runner_name, GREEDY, planned[0], 2, 0, 0)
            runner.run([warm], SEQUENTIAL)
            reqs = [Request(runner_name, GREEDY, p, args.new_tokens, 0, 0) for p in planned]
            results, wall = timed(device, lambda reqs=reqs: runner.run(reqs, SEQUENTIAL))
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise RuntimeError(f"{name}/{runner_name}: {failed[0]!r}")
            tps[runner_name] = sum(len(r.output_ids) for r in results) / wall
    resources = ResourcesSpec(context_tokens=args.context)
    target_cache = cache_model(target.config, kv_format(resources, dtype_name(target)))
    bills = bills_for(
        resources,
        args.context,
        target.config.vocab_size,
        target_cache,
        weight_bytes(target),
        [draft_kinds.loaded_bill(n, d, target, lambda dt: kv_format(resources, dt)) for n, d in drafts.items()],
    )
    peaks = {d.runner: d for d in runner.device_memory()}
    rows = []
    for bill in bills:
        peak = peaks.get(bill.draft)
        k = drafts[bill.draft].num_draft_tokens if bill.draft in drafts else None
        rows.append(
            Row(
                name,
                bill.draft,
                k,
                bill.total_bytes,
                [(x.name, x.bytes) for x in bill.lines if x.coexists_at_peak and x.bytes],
                peak.allocated_bytes if peak else None,
                peak.reserved_bytes if peak else None,
                tps[bill.draft],
                None,
            )
        )
    return rows, runner, planned


def hf_tps(
    target: torch.nn.Module, small: torch.nn.Module, row: Row, planned: list[PlannedPrompt], device: torch.device,
    args: Any,
) -> float:
    """Committed tokens/s of transformers' generate for the row's runner (greedy, constant K)."""
    kwargs: dict[str, Any] = dict(max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
    if row.runner != FALLBACK:
        assert row.k is not None
        kwargs.update(num_assistant_tokens=row.k, num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)
        if row.runner.startswith("small"):
            small.generation_config.num_assistant_tokens = row.k
            small.generation_config.num_assistant_tokens_schedule = "constant"
            small.generation_config.assistant_confidence_threshold = 0.0
            kwargs["assistant_model"] = small
        else:
            kwargs["assistant_early_exit"] = max(1, target.config.num_hidden_layers // 4)
    tokens, wall = 0, 0.0
    with torch.inference_mode():
        for p in planned:
            ids = torch.tensor([p.token_ids], device=device)
            out, took = timed(device, lambda ids=ids: target.generate(ids, attention_mask=torch.ones_like(ids),
                                                                     eos_token_id=None, **kwargs))
            tokens += out.shape[1] - ids.shape[1]
            wall += took
    return tokens / wall


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / GiB:.2f} GiB" if n >= GiB // 4 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def table(rows: list[Row], why_no_peak: str | None) -> str:
    head = "| target | runner | K | bill | measured peak (reserved) | bill / peak | gate tok/s | generate tok/s | gate / generate |"
    out = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r.ratio:.3f}" if r.ratio is not None else "-"
        peak = f"{fmt_bytes(r.peak_bytes)} ({fmt_bytes(r.reserved_bytes)})" if r.peak_bytes is not None else "-"
        speed = f"{r.gate_tps / r.hf_tps:.2f}x" if r.hf_tps else "-"
        hf = f"{r.hf_tps:.1f}" if r.hf_tps else "-"
        out.append(f"| {r.target} | {r.runner} | {r.k or '-'} | {fmt_bytes(r.bill_bytes)} | {peak} | {ratio} | "
                   f"{r.gate_tps:.1f} | {hf} | {speed} |")
    out.append("")
    out.append("Bill lines (bytes that coexist at the peak):")
    for r in rows:
        out.append(f"  {r.target}/{r.runner}: " + "; ".join(f"{n} {fmt_bytes(b)}" for n, b in r.lines))
    if why_no_peak:
        out.append(f"\nmeasured peak: not measured: {why_no_peak}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--toy", action="store_true", help="toy sizes (a CPU, the tests): context 96, 8 new tokens")
    ap.add_argument("--targets", nargs="+", default=list(FULL), choices=list(FULL))
    ap.add_argument("--num-draft-tokens", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--context", type=int, default=None, help="tokens per sequence with the output (default 4096)")
    ap.add_argument("--new-tokens", type=int, default=None, help="output tokens per request (default 64)")
    ap.add_argument("--requests", type=int, default=2, help="timed requests per runner")
    ap.add_argument("--no-generate", action="store_true", help="skip transformers' generate comparison")
    args = ap.parse_args(argv)
    args.context = args.context or (96 if args.toy else 4096)
    args.new_tokens = args.new_tokens or (8 if args.toy else 64)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    configs, draft_fields = (TOY, TOY_DRAFT) if args.toy else (FULL, FULL_DRAFT)
    started = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; torch {torch.__version__}; "
          f"context {args.context}, {args.new_tokens} new tokens, {args.requests} requests per runner", flush=True)
    rows: list[Row] = []
    for name in args.targets:
        cls_name, fields = configs[name]
        target = build(cls_name, fields, device, 0)
        small = build("LlamaConfig", dict(draft_fields, vocab_size=fields["vocab_size"]), device, 1)
        found, runner, planned = gate_rows(name, target, small, args.num_draft_tokens, device, args)
        del runner
        if not args.no_generate:
            for r in found:
                r.hf_tps = hf_tps(target, small, r, planned, device, args)
        rows += found
        print(f"{name}: {sum(p.numel() for p in target.parameters()) / 1e9:.2f}B parameters, "
              f"{time.perf_counter() - started:.0f} s so far", flush=True)
        del target, small
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(table(rows, None if device.type == "cuda" else NO_ACCELERATOR))
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    return rows


if __name__ == "__main__":
    main()
