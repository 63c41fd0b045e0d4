"""How exactly does gate's served client time a stream? (issue 15)

Starts tests/served_stub.py in its own process, streaming every request on a known
schedule (first token `--ttft-ms` after the request is read, then one token every
`--itl-ms`), and runs gate.runners.openai.OpenAIRunner against it in a closed loop at
concurrency 1 and 64. For each it prints gate's measured TTFT (first token time) and ITL
(gaps between consecutive tokens) next to

  the schedule:  what the stub was told to do (nominal), and
  the stub's log: when the stub actually wrote each event (time.perf_counter in the stub's
                  process; CLOCK_MONOTONIC, so comparable with the client's clock on Linux).
                  Client TTFT minus the stub's (request read -> first event) is the client's
                  own overhead (send, connect, parse); client ITL minus the stub's write gap
                  is the client's timing error for one token.

as medians and max absolute errors in ms. It also says how quiet the machine was:
load average and /proc/pressure/cpu before and after.

    python benchmarks/served_client.py [--ttft-ms 20] [--itl-ms 5] [--tokens 32] [--requests 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gate.core.law import Law  # noqa: E402
from gate.load.closed import ClosedLoop  # noqa: E402
from gate.plan.matrix import PlannedPrompt, Request  # noqa: E402
from gate.runners.interface import StreamResult  # noqa: E402
from gate.runners.openai import Endpoint, OpenAIRunner  # noqa: E402


def machine() -> str:
    load = Path("/proc/loadavg").read_text().split()[:3]
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        some = "cpu pressure n/a"
    return f"load average {' '.join(load)} ({os.cpu_count()} CPUs); /proc/pressure/cpu: {some}"


def start_stub(ttft_ms: float, itl_ms: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "served_stub.py"), "--port", "0", "--ttft-ms", str(ttft_ms),
                             "--itl-ms", str(itl_ms)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"the stub did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def stats_row(name: str, measured: list[float], nominal: float, actual: list[float]) -> str:
    err_nominal = [abs(m - nominal) for m in measured]
    err_actual = [abs(m - a) for m, a in zip(measured, actual)]
    return (f"  {name:4s} median {statistics.median(measured):8.3f} ms (schedule {nominal:.3f}; stub wrote "
            f"{statistics.median(actual):.3f})  |err| vs schedule: median {statistics.median(err_nominal):.3f} "
            f"max {max(err_nominal):.3f}  |err| vs stub log: median {statistics.median(err_actual):.3f} "
            f"max {max(err_actual):.3f}  (n={len(measured)})")


def run(url: str, concurrency: int, n_requests: int, tokens: int, ttft_ms: float, itl_ms: float) -> list[str]:
    runner = OpenAIRunner({"fallback": Endpoint(url, api="llama_cpp")}, set(), request_timeout_s=60)
    law = Law("greedy", 0.0)
    base = 1000 + concurrency * 10000
    reqs = [Request("fallback", law, PlannedPrompt(f"r{i}", "c", (base + i, 1, 2)), tokens, 0, i) for i in range(n_requests)]
    t, cpu = time.perf_counter(), time.process_time()
    results = runner.run(reqs, ClosedLoop(concurrency=concurrency))
    wall_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu
    log = json.loads(urllib.request.urlopen(f"{url}/log").read())
    by_first = {r["body"]["prompt"][0]: r for r in log if r["body"]["prompt"][0] >= base}
    errors = [r for r in results if not isinstance(r, StreamResult)]
    ttft, ttft_actual, itl, itl_actual = [], [], [], []
    for i, r in enumerate(results):
        if not isinstance(r, StreamResult):
            continue
        rec = by_first[base + i]
        ev = rec["t_events"]
        ttft.append(r.token_times_ms[0])
        ttft_actual.append((ev[0] - rec["t_recv"]) * 1e3)
        itl.extend(b - a for a, b in zip(r.token_times_ms, r.token_times_ms[1:]))
        itl_actual.extend((b - a) * 1e3 for a, b in zip(ev, ev[1:]))
    events = sum(len(r["t_events"]) for r in by_first.values())
    out = [f"concurrency {concurrency}: {n_requests} requests x {tokens} tokens in {wall_s:.2f} s, {len(errors)} failed; "
           f"client CPU {cpu_s:.2f} s ({cpu_s / wall_s:.0%} of one CPU, {cpu_s / max(events, 1) * 1e6:.0f} us per event)"]
    if ttft:
        out.append(stats_row("TTFT", ttft, ttft_ms, ttft_actual))
        out.append(stats_row("ITL", itl, itl_ms, itl_actual))
    for e in errors[:3]:
        out.append(f"  error: {e}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=128, help="requests at concurrency 64 (32 at concurrency 1)")
    args = ap.parse_args()
    print("before:", machine())
    proc, url = start_stub(args.ttft_ms, args.itl_ms)
    try:
        lines = run(url, 1, 32, args.tokens, args.ttft_ms, args.itl_ms)
        lines += run(url, 64, args.requests, args.tokens, args.ttft_ms, args.itl_ms)
    finally:
        proc.terminate()
        proc.wait(10)
    print("after: ", machine())
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
