"""How often do verdicts change when the same policy is rerun on the same machine?

Reruns `gate check` on a policy (default: the embedded SmolLM2 example) N times and, for
every rule outcome, compares the verdicts across runs side by side:
  - interval: gate's verdict (pass / fail / inconclusive, decided on the confidence interval);
  - point: what a bare point estimate would have said (measured value vs threshold), the way
    a gate without confidence intervals decides.
An outcome "changes" when two runs of it disagree, and "contradicts" itself when one run
passes it and another fails it (the flip that makes teams switch a gate off); a change
between a definite verdict and inconclusive is the interval saying the data cannot tell.
Prints both counts side by side and every outcome that changed. Usage:

    python benchmarks/verdict_stability.py [--runs 4] [--policy examples/smollm2/policy.yaml]
    python benchmarks/verdict_stability.py --reports DIR   # analyse saved reports r0.json, r1.json, ...
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def point_verdict(o: dict) -> str:
    if o["measured"] is None or o["status"] in ("error", "skipped"):
        return o["status"]
    if o["metric"] == "exactness":
        return o.get("waived_status") or o["status"]
    ok = OPS[o["comparison"]](o["measured"], o["threshold"])
    return "pass" if ok else "fail"


def interval_verdict(o: dict) -> str:
    status = o.get("waived_status") or o["status"]
    return "fail" if status == "warn" else status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--policy", default="examples/smollm2/policy.yaml")
    parser.add_argument("--reports", type=Path, help="a folder of saved reports r0.json, r1.json, ... (no rerun)")
    args = parser.parse_args()
    seconds: list[float] = []
    if args.reports:
        out = args.reports
    else:
        out = Path(tempfile.mkdtemp(prefix="gate-stability-"))
        for i in range(args.runs):
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "gate", "check", args.policy, "--no-progress", "--json",
                                   str(out / f"r{i}.json"), "--junit", str(out / f"j{i}.xml")], capture_output=True, text=True)
            seconds.append(time.perf_counter() - start)
            if not (out / f"r{i}.json").exists():
                sys.exit(f"run {i} wrote no report (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
            print(f"run {i + 1}/{args.runs}: exit {proc.returncode}, {seconds[-1]:.0f} s", flush=True)
    paths = sorted(out.glob("r*.json"), key=lambda p: int(p.stem[1:]))
    runs = [{f"{o['rule_id']}[{o['scope']}]": o for o in json.loads(p.read_text())["outcomes"]} for p in paths]
    analyse(runs, f"{args.reports or args.policy}" + (f" (median run {statistics.median(seconds):.0f} s)" if seconds else ""))
    print(f"reports: {out}")


def analyse(runs: list[dict[str, dict]], what: str) -> None:
    names = sorted(set.intersection(*(set(r) for r in runs)))
    changed = {"interval": 0, "point": 0}
    contradicted = {"interval": 0, "point": 0}
    rows = []
    for name in names:
        verdicts = {"interval": [interval_verdict(r[name]) for r in runs], "point": [point_verdict(r[name]) for r in runs]}
        for kind, vs in verdicts.items():
            changed[kind] += len(set(vs)) > 1
            contradicted[kind] += {"pass", "fail"} <= set(vs)
        if any(len(set(vs)) > 1 for vs in verdicts.values()):
            measured = [r[name]["measured"] for r in runs if r[name]["measured"] is not None]
            spread = f"{min(measured):.3g}..{max(measured):.3g}" if measured else "-"
            rows.append(f"  {name:58s} interval: {' '.join(v[:4] for v in verdicts['interval']):24s} "
                        f"point: {' '.join(v[:4] for v in verdicts['point']):24s} measured {spread}")
    n = len(names)
    print(f"\n{n} outcomes x {len(runs)} runs of {what}")
    print(f"{'':50s}{'interval (gate)':>18s}{'point estimate':>18s}")
    print(f"{'outcomes passing in one run, failing in another':50s}{contradicted['interval']:>18d}{contradicted['point']:>18d}")
    print(f"{'outcomes whose verdict changed':50s}{changed['interval']:>18d}{changed['point']:>18d}")
    fails = {k: sum(f(r[m]) == "fail" for r in runs for m in names) for k, f in (("interval", interval_verdict), ("point", point_verdict))}
    print(f"{'fail verdicts, all runs':50s}{fails['interval']:>18d}{fails['point']:>18d}")
    print(f"{'inconclusive verdicts, all runs':50s}{sum(interval_verdict(r[m]) == 'inconclusive' for r in runs for m in names):>18d}{'-':>18s}")
    print("outcomes that changed (verdict per run):")
    print("\n".join(rows) or "  none")


if __name__ == "__main__":
    main()
