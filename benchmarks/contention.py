"""Does a busy machine change gate's definite verdicts? (issue 10: it must not)

Runs the embedded example's speedup rule for the bf16 draft (a cut-down copy of
examples/smollm2/policy.yaml: SmolLM2-135M float32 target, the bf16 draft, greedy and
t0.7, two MT-bench prompts per category instead of three, 24 new tokens: 16 paired
requests per law) twice, side by side:

  quiet: as the machine is (it is not necessarily quiet: its pressure is printed);
  hog:   under a CPU hog this benchmark starts itself, one busy-looping process per CPU,
         so with gate's own compute threads (one per CPU) every CPU has two runnable
         threads: a 2x oversubscription (load about 4 on 2 CPUs, as in the issue).

It prints every outcome of both runs, how contended each run was (the stalled share of
wall time from /proc/pressure/cpu, the load average, contended requests), the verdicts
the hog run would have given without contention handling (max_cpu_stall: null on the
same records), and whether any definite verdict (pass, fail, warn) differs between the
runs: it must not (exit 1 if one does). The hog processes are killed on every exit path.

    python benchmarks/contention.py [--keep DIR] [--per-category 2] [--greedy-only]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICY = """\
# cut-down copy of examples/smollm2/policy.yaml: its speedup rule for the bf16 draft, 16 prompts
version: 1
name: contention-benchmark
target: {{model: smollm2-135m-instruct, dtype: float32, device: cpu}}
drafts:
  bf16: {{kind: model, model: target, dtype: bfloat16, num_draft_tokens: 4}}
law:
{laws}
workload: {{source: mt_bench, per_category: {per_category}, max_new_tokens: 24, seed: 0, chat_template: true}}
measurement: {{repetitions: 1, warmup_requests: 1, confidence: 0.95, inconclusive: error}}
rules:
  - {{id: speedup, metric: speedup, aggregation: pooled, comparison: ">=", threshold: 1.0x}}
"""
DEFINITE = ("pass", "fail", "warn")
HOGS: list[subprocess.Popen] = []


def start_hogs(n: int) -> None:
    for _ in range(n):
        HOGS.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL))


def stop_hogs() -> None:
    while HOGS:
        p = HOGS.pop()
        if p.poll() is None:
            p.kill()
        p.wait()


def pressure() -> float | None:
    """Cumulative CPU "some" stall (s) from /proc/pressure/cpu, None without it."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return None


def run(policy: Path, out: Path, label: str) -> dict:
    p0, t0, load0 = pressure(), time.perf_counter(), os.getloadavg()[0]
    proc = subprocess.run([sys.executable, "-m", "gate", "check", str(policy), "--no-progress", "--json",
                           str(out / f"{label}.json"), "--junit", str(out / f"{label}.xml")], capture_output=True, text=True)
    seconds, p1, load1 = time.perf_counter() - t0, pressure(), os.getloadavg()[0]
    if not (out / f"{label}.json").exists():
        sys.exit(f"{label}: no report (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    report = json.loads((out / f"{label}.json").read_text())
    env = report["measurements"]["environment"]
    reqs = report["measurements"]["requests"]
    stall = report["policy"]["measurement"]["max_cpu_stall"]
    busy = sum(1 for r in reqs if r["cpu_stall_ms"] is not None and r["e2el_ms"] > 0 and r["cpu_stall_ms"] / r["e2el_ms"] > stall)
    whole = f"{(p1 - p0) / seconds:.0%}" if p0 is not None and p1 is not None else "n/a"
    print(f"{label:6s} exit {proc.returncode}, {seconds:4.0f} s; CPU stall over the whole run {whole}, over the timed "
          f"requests {env['cpu_stall_share']:.0%}; load average {load0:.1f} -> {load1:.1f} (max at a request "
          f"{env['load_avg_1m_max']:.1f}) on {env['cpu_count']} CPUs, {env['threads']} torch threads; "
          f"{busy} of {len(reqs)} requests contended (> {stall:.0%} stalled), "
          f"{sum(1 for r in reqs if r['contention_reruns'])} kept from rerun cells", flush=True)
    return report


def without_handling(path: Path) -> dict[str, tuple[str, str]]:
    """The verdicts of a saved report's records decided as before issue 10 (contention ignored)."""
    from gate.policy.reader import load_policy
    from gate.report.explain import load_report
    from gate.rules.evaluate import evaluate, settings_for

    report = load_report(path)
    policy = load_policy(path.parent / "policy.yaml").policy
    settings = settings_for(policy)
    settings.max_cpu_stall = None
    return {o.name: (o.status, o.message) for o in evaluate(policy.rules, report.measurements, settings)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="write the policy and reports here (default: a temporary folder)")
    parser.add_argument("--per-category", type=int, default=2, help="MT-bench prompts per category (8 categories)")
    parser.add_argument("--greedy-only", action="store_true", help="only the greedy law (default: greedy and t0.7)")
    parser.add_argument("--reports", type=Path, help="compare the saved quiet.json and hog.json in this folder (no rerun)")
    args = parser.parse_args()
    out = args.keep or Path(tempfile.mkdtemp(prefix="gate-contention-"))
    out.mkdir(parents=True, exist_ok=True)
    policy = out / "policy.yaml"
    laws = "  - temperature: 0\n" + ("" if args.greedy_only else "  - temperature: 0.7\n")
    policy.write_text(POLICY.format(laws=laws.rstrip("\n"), per_category=args.per_category))
    atexit.register(stop_hogs)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(128 + 15))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if args.reports:
        out = args.reports
        quiet, hog = (json.loads((out / f"{x}.json").read_text()) for x in ("quiet", "hog"))
        return compare(quiet, hog, out)
    try:
        quiet = run(policy, out, "quiet")
        start_hogs(cpus)
        print(f"hog: {cpus} busy-looping processes (one per CPU; with gate's {cpus} threads a 2x oversubscription)", flush=True)
        time.sleep(2)
        hog = run(policy, out, "hog")
    finally:
        stop_hogs()
    compare(quiet, hog, out)


def compare(quiet: dict, hog: dict, out: Path) -> None:
    runs = {"quiet": {o["rule_id"] + "[" + o["scope"] + "]": o for o in quiet["outcomes"]},
            "hog": {o["rule_id"] + "[" + o["scope"] + "]": o for o in hog["outcomes"]}}
    before = without_handling(out / "hog.json")
    differ = 0
    print(f"\n{'outcome':44s} {'quiet':>13s} {'hog':>13s} {'hog, contention ignored':>24s}")
    for name in sorted(runs["quiet"]):
        q, h = runs["quiet"][name], runs["hog"].get(name)
        hs = h["status"] if h else "-"
        clash = q["status"] in DEFINITE and hs in DEFINITE and q["status"] != hs
        differ += clash
        shown = lambda o: f"{o['status']} {o['measured']:.2f}x" if o and o["measured"] is not None else (o or {}).get("status", "-")
        old = before.get(name, ("-", ""))[0]
        print(f"{name:44s} {shown(q):>13s} {shown(h):>13s} {old:>24s}" + ("   DIFFERS" if clash else ""))
    for name in sorted(runs["hog"]):
        if "contended" in runs["hog"][name]["message"]:
            print(f"  hog {name}: {runs['hog'][name]['message'].split(': ', 1)[1]}")
    for note in hog["notes"]:
        if note.startswith("machine busy"):
            print(f"  hog note: {note}")
    print(f"\ndefinite verdicts that differ between the quiet and the hog run: {differ}")
    print(f"reports: {out}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
