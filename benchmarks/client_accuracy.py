"""Does gate's served client measure the server, or itself, at concurrency? (issues 26, 46)

Two servers (--servers): `uvloop`, tests/served_stub.py (its own process, one event loop, on
uvloop where installed), and `threaded`, tests/threaded_stub.py (a thread per
connection, `Connection: close`, the schedule's clock starting when the handler starts, as
many Python shims and llama.cpp's server answer). The uvloop stub streams
/v1/completions on a known schedule: the first step `--ttft-ms` after the request's bytes
were delivered to the stub's event loop, then one step every `--step-ms`, each
of `--tokens-per-step` tokens, `--tokens` in all; either one SSE event per step or one event
per token (the step's events back to back, as llama-server streams a speculative step). In
one run it drives that stub with gate's client (gate.runners.openai.OpenAIRunner: its worker
processes, as `gate check` runs them) and with guidellm (benchmarks/guidellm_driver.py;
installed for the benchmark only: `python -m venv ~/.cache/gate/guidellm-venv &&
~/.cache/gate/guidellm-venv/bin/pip install -c constraints-cpu.txt guidellm`), one after the
other against the same stub process, at closed-loop concurrency 1, 8, 32, 64 and 128 and an
open-loop rate, and prints each client's error against the known schedule, per request:

  TTFT  measured first-token time minus ttft-ms (signed; both clients start the clock
        where the request leaves: guidellm at its headers, gate at its last byte);
  ITL   (last token - first token) / (tokens - 1), both clients' definition, minus the
        schedule's (steps - 1) x step-ms / (tokens - 1);
  TPOT  each client's own definition against the schedule's value of it: gate's (vLLM's)
        decode-only TPOT equals its ITL; guidellm's (last token - request start) / tokens
        includes the first token's wait: (ttft + (steps - 1) x step) / tokens;

as the median and the 99th percentile of the error (ms; positive: the client saw the
server later than it was). The stub's own lateness (its log: first event written minus
request read, minus ttft-ms) bounds what of an error is the server's. On the threaded stub the
log splits it (the server's own stamps, wall clock) and, for gate's requests, joined by prompt
to gate's own stamps (when its request left, when its first token was read):

  queue    the server's clock started after gate's request had left: handler start minus
           gate's send (the kernel's accept queue, the accept thread, the thread's start);
  accept   of it, from accept() returning to the handler's start (the server's threads);
  late     the handler's first event against its own schedule;
  read     gate's stamp of the first token minus the server's write of it (the client's
           own lateness in reading, the network in between).

TTFT error = queue + late + read, per request; beside them, what gate itself reports as the
server's time to its headers (server_headers_ms, p50), from its own stamps only. For either
client the stub's log also gives how long after its handler began the request's bytes were
read: a client that connects, then sends late, starts its clock after the server's, so its
TTFT leaves out the server's time before the handler. Each row also shows
the machine's load (1-minute load average and /proc/pressure/cpu avg10 at its start), and
the header says how quiet the machine was. Before each measurement the script waits until
the CPU pressure has settled (avg10 under 2%, at most --settle-s), and the clients take turns
going first, run by run; the machine is shared, so rerun with --runs to see the spread (the
summary takes the median over runs of each run's figure).

    python benchmarks/client_accuracy.py [--loads 1,8,32,64,128] [--rate 40] [--modes step,token]
        [--servers uvloop,threaded] [--runs 1] [--no-guidellm]
    python benchmarks/client_accuracy.py --llama-server [BINARY] [--llama-loads 16,32] [--runs 3]

--llama-server: no truth, but agreement. The managed llama-server (GATE_LLAMA_SERVER, or
gate's own build; the packaged SmolLM2 Q4_1, one slot per stream, 2 threads) serves both
clients the same prompts ("Request i: tell me a story.", gate sending the server's own
token ids of that text) on /v1/completions, 32 tokens with ignore_eos, at each concurrency;
the script prints each client's TTFT and ITL distribution (p10, p50, p90, p99), the medians
over runs, side by side, with the server's own decode time per token over each run (its
/metrics counters: each slot's generation seconds per token it decoded), so
a difference in ITL can be told apart as the server's (it decoded slower under one client's
load) or a client's.
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
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gate.core.law import Law  # noqa: E402
from gate.load.closed import ClosedLoop  # noqa: E402
from gate.load.open import OpenLoop  # noqa: E402
from gate.plan.matrix import PlannedPrompt, Request  # noqa: E402
from gate.runners.interface import StreamResult  # noqa: E402
from gate.runners.openai import Endpoint, OpenAIRunner  # noqa: E402


def machine() -> str:
    load = Path("/proc/loadavg").read_text().split()[0]
    try:
        some = Path("/proc/pressure/cpu").read_text().split()[1]
    except (OSError, IndexError):
        some = "avg10=n/a"
    return f"load {load}, psi {some.replace('avg10=', '')}%"


def settle(max_s: float, below: float = 2.0) -> None:
    """Wait until the machine's CPU pressure (avg10, %) is under `below`, at most `max_s` s."""
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        try:
            avg10 = float(Path("/proc/pressure/cpu").read_text().split()[1].split("=")[1])
        except (OSError, IndexError, ValueError):
            return
        if avg10 < below:
            return
        time.sleep(1.0)


def start_stub(a: argparse.Namespace, per_token: bool, server: str = "uvloop") -> tuple[subprocess.Popen, str]:
    if server == "threaded":
        cmd = [sys.executable, str(ROOT / "tests" / "threaded_stub.py"), "--port", "0", "--ttft-ms", str(a.ttft_ms),
               "--step-ms", str(a.step_ms), "--tokens-per-step", str(a.tokens_per_step)]
    else:
        cmd = [sys.executable, str(ROOT / "tests" / "served_stub.py"), "--port", "0", "--ttft-ms", str(a.ttft_ms),
               "--itl-ms", str(a.step_ms), "--tokens-per-event", str(a.tokens_per_step)] + (["--split-events"] if per_token else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"the stub did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def stub_log(url: str) -> list[dict[str, Any]]:
    return json.loads(urllib.request.urlopen(f"{url}/log").read())


def q(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def truth(a: argparse.Namespace) -> dict[str, float]:
    steps = -(-a.tokens // a.tokens_per_step)
    itl = (steps - 1) * a.step_ms / (a.tokens - 1)
    return {"ttft": a.ttft_ms, "itl": itl, "tpot_gate": itl, "tpot_guidellm": (a.ttft_ms + (steps - 1) * a.step_ms) / a.tokens}


def gate_run(url: str, a: argparse.Namespace, concurrency: int | None, rate: float | None, n: int,
             base: int) -> tuple[list[dict[str, float]], str]:
    runner = OpenAIRunner({"fallback": Endpoint(url, api="completions")}, set(), request_timeout_s=60)
    law = Law("greedy", 0.0)
    reqs = [Request("fallback", law, PlannedPrompt(f"r{i}", "c", (base + i, 1, 2)), a.tokens, 0, i) for i in range(n)]
    load = ClosedLoop(concurrency=concurrency) if rate is None else OpenLoop(request_rate=rate, seed=1)
    out = runner.run(reqs, load)
    stats = runner.observed().client_workers
    ok = [r for r in out if isinstance(r, StreamResult) and len(r.token_times_ms) == a.tokens]
    if len(ok) < n:
        bad = [r for r in out if not isinstance(r, StreamResult)]
        print(f"    gate: {n - len(ok)} of {n} requests failed or short: {bad[:1]}")
    rows = [{"ttft": r.token_times_ms[0], "itl": (r.token_times_ms[-1] - r.token_times_ms[0]) / (a.tokens - 1),
             "tpot": (r.token_times_ms[-1] - r.token_times_ms[0]) / (a.tokens - 1), "id": base + i,
             # wall clock s: the request left (its clock's zero), its first token was read
             "sent_s": r.started_s + (r.client.send_ms if r.client else 0.0) / 1e3,
             "first_s": r.started_s + ((r.client.send_ms if r.client else 0.0) + r.token_times_ms[0]) / 1e3,
             "headers": r.client.headers_ms if r.client else None}
            for i, r in enumerate(out) if isinstance(r, StreamResult) and len(r.token_times_ms) == a.tokens]
    cpu = max((s.cpu_share or 0.0 for s in stats), default=0.0)
    return rows, f"{len(stats)} workers, busiest {cpu:.0%} CPU"


def guidellm_run(url: str, a: argparse.Namespace, concurrency: int | None, rate: float | None, n: int,
                 out_dir: Path) -> tuple[list[dict[str, float]], str]:
    from guidellm_driver import run_guidellm

    rows = run_guidellm(url, concurrency=concurrency, rate=rate, requests=n, max_tokens=a.tokens, out_dir=out_dir,
                        rate_profile="constant")
    ok = [r for r in rows if r.get("output_tokens") == a.tokens and r.get("itl_ms") is not None]
    if len(ok) < n:
        print(f"    guidellm: {n - len(ok)} of {n} requests failed or short")
    return [{"ttft": r["ttft_ms"], "itl": r["itl_ms"], "tpot": r["tpot_ms"]} for r in ok], "guidellm 0.8.1"


def errors(rows: list[dict[str, float]], t: dict[str, float], client: str) -> dict[str, tuple[float, float]]:
    out = {}
    for key in ("ttft", "itl", "tpot"):
        target = t[f"tpot_{client}"] if key == "tpot" else t[key]
        e = [r[key] - target for r in rows]
        out[key] = (statistics.median(e), q(e, 0.99)) if e else (float("nan"), float("nan"))
    return out


def server_lateness(log: list[dict[str, Any]], ttft_ms: float) -> tuple[float, float]:
    if log and "handler_s" in log[0]:  # the threaded stub: accept to handler start, then the handler's own lateness
        late = [(r["events_s"][0] - r["accept_s"]) * 1e3 - ttft_ms for r in log if r.get("events_s")]
    else:
        late = [(r["t_events"][0] - r["t_recv"]) * 1e3 - ttft_ms for r in log if r.get("t_events")]
    return (statistics.median(late), q(late, 0.99)) if late else (float("nan"), float("nan"))


def split(rows: list[dict[str, float]], log: list[dict[str, Any]], ttft_ms: float) -> str:
    """gate's TTFT error on the threaded stub, split per request (module docstring): medians of queue, accept, late,
    read (ms), joined on the prompt's first token."""
    by_id = {r["prompt"][0]: r for r in log if isinstance(r.get("prompt"), list) and r["prompt"] and r.get("events_s")}
    parts: dict[str, list[float]] = {"queue": [], "accept": [], "late": [], "read": []}
    for row in rows:
        srv = by_id.get(row.get("id"))
        if srv is None:
            continue
        parts["queue"].append((srv["handler_s"] - row["sent_s"]) * 1e3)
        parts["accept"].append((srv["handler_s"] - srv["accept_s"]) * 1e3)
        parts["late"].append((srv["events_s"][0] - srv["handler_s"]) * 1e3 - ttft_ms)
        parts["read"].append((row["first_s"] - srv["events_s"][0]) * 1e3)
    if not parts["queue"]:
        return ""
    headers = [r["headers"] for r in rows if r.get("headers") is not None]
    reported = f"; gate's own server_headers p50 {statistics.median(headers):.2f}" if headers else ""
    return "; gate split p50 " + " ".join(f"{k} {statistics.median(v):+.2f}" for k, v in parts.items()) + reported


def start_llama_server(binary: str, slots: int) -> tuple[subprocess.Popen, str]:
    """llama-server on the packaged SmolLM2 GGUF with `slots` slots of 512 tokens, 2 threads; ready when /health is."""
    import socket

    sys.path.insert(0, str(ROOT / "scripts"))
    from importlib import import_module

    gguf = import_module("check-llama-server").packaged_smollm2()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
                             "-c", str(512 * slots), "-t", "2", "--metrics"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("llama-server did not become ready in 120 s")


def server_decode(url: str) -> tuple[float, float]:
    """llama-server's own counters (/metrics): (seconds spent decoding, tokens decoded) so far."""
    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    got = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and not line.startswith("#")}
    return got.get("llamacpp:tokens_predicted_seconds_total", 0.0), got.get("llamacpp:tokens_predicted_total", 0.0)


def llama_run(url: str, a: argparse.Namespace, client: str, c: int, run: int, out_dir: Path) -> list[dict[str, float]]:
    n = max(16, a.waves * c)
    if client == "guidellm":
        from guidellm_driver import run_guidellm

        rows = run_guidellm(url, concurrency=c, requests=n, max_tokens=a.tokens, out_dir=out_dir)
        return [{"ttft": r["ttft_ms"], "itl": r["itl_ms"]} for r in rows
                if r.get("output_tokens") == a.tokens and r.get("itl_ms") is not None]
    runner = OpenAIRunner({"fallback": Endpoint(url, api="completions", engine="llama_cpp")}, set(), request_timeout_s=120)
    reqs = []
    for i in range(n):  # guidellm_driver's prompt text, tokenized by the server itself
        body = json.dumps({"content": f"Request {i}: tell me a story."}).encode()
        ids = json.loads(urllib.request.urlopen(urllib.request.Request(f"{url}/tokenize", body)).read())["tokens"]
        reqs.append(Request("fallback", Law("greedy", 0.0), PlannedPrompt(f"r{run}-{i}", "c", tuple(ids)), a.tokens, 0, i))
    out = runner.run(reqs, ClosedLoop(concurrency=c))
    return [{"ttft": r.token_times_ms[0], "itl": (r.token_times_ms[-1] - r.token_times_ms[0]) / (a.tokens - 1)}
            for r in out if isinstance(r, StreamResult) and len(r.token_times_ms) == a.tokens]


def llama_server(a: argparse.Namespace) -> int:
    """The real-server comparison (module docstring, --llama-server)."""
    from gate.runners.llama_server import find_binary

    binary = a.llama_server if a.llama_server != "auto" else (os.environ.get("GATE_LLAMA_SERVER") or find_binary())
    if not binary:
        raise SystemExit("no llama-server: make llama-server, or pass its path")
    loads = [int(x) for x in a.llama_loads.split(",")]
    print(f"llama-server {binary}, SmolLM2 Q4_1, {a.tokens} tokens, ignore_eos; {os.cpu_count()} CPUs; before: {machine()}")
    got: dict[tuple[int, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for c in loads:
            proc, url = start_llama_server(binary, c)
            try:
                llama_run(url, a, "gate", c, -1, Path(tmp))  # warm-up, not counted
                for run in range(a.runs):
                    for client in ("gate", "guidellm") if run % 2 == 0 else ("guidellm", "gate"):
                        settle(a.settle_s)
                        quiet = machine()
                        s0, n0 = server_decode(url)
                        rows = llama_run(url, a, client, c, run, Path(tmp) / f"llama-{c}-{run}")
                        s1, n1 = server_decode(url)
                        got.setdefault((c, client), []).append({
                            **{f"{k} p{p}": q([r[k] for r in rows], p / 100) for k in ("ttft", "itl") for p in (10, 50, 90, 99)},
                            # the server's own decode time per token over the run (each slot times its own
                            # generation): its speed under this client's load, which the clients' ITL should follow
                            "server ms/token": 1e3 * (s1 - s0) / max(1.0, n1 - n0)})
                        print(f"  c={c} run {run} {client:9s} n={len(rows)} " + " ".join(
                            f"{k} {v:.1f}" for k, v in got[(c, client)][-1].items()) + f"  ({quiet})", flush=True)
            finally:
                proc.terminate()
                proc.wait(30)
    print(f"after: {machine()}\n\nmedians over {a.runs} runs (ms): gate / guidellm")
    for c in loads:
        keys = list(got[(c, "gate")][0])
        print(f"  c={c}: " + "; ".join(
            f"{k} {statistics.median(x[k] for x in got[(c, 'gate')]):.1f} / "
            f"{statistics.median(x[k] for x in got[(c, 'guidellm')]):.1f}" for k in keys))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ttft-ms", type=float, default=40.0)
    ap.add_argument("--step-ms", type=float, default=25.0)
    ap.add_argument("--tokens-per-step", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--loads", default="1,8,32,64,128", help="closed-loop concurrencies")
    ap.add_argument("--rate", type=float, default=40.0, help="open-loop requests/s (0: none)")
    ap.add_argument("--waves", type=int, default=3, help="requests per closed-loop point: waves x concurrency (>= 16)")
    ap.add_argument("--modes", default="step,token", help="step: one event per step; token: one event per token")
    ap.add_argument("--servers", default="uvloop,threaded", help="uvloop: tests/served_stub.py; threaded: "
                    "tests/threaded_stub.py (one event per step only)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--no-guidellm", action="store_true")
    ap.add_argument("--llama-server", nargs="?", const="auto", default=None,
                    help="compare the clients on the managed llama-server instead (module docstring)")
    ap.add_argument("--llama-loads", default="16,32", help="--llama-server's concurrencies")
    ap.add_argument("--settle-s", type=float, default=30.0, help="before each measurement, wait (at most this long) until "
                    "/proc/pressure/cpu avg10 is under 2%% (guidellm's start-up spawns ~10 processes: their CPU must not "
                    "land on the next client's requests)")
    a = ap.parse_args()
    if a.llama_server:
        return llama_server(a)
    t = truth(a)
    print(f"schedule: TTFT {a.ttft_ms:g} ms, a step of {a.tokens_per_step} tokens every {a.step_ms:g} ms, {a.tokens} "
          f"tokens; ITL {t['itl']:.3f} ms, guidellm's TPOT {t['tpot_guidellm']:.3f} ms; {os.cpu_count()} CPUs; "
          f"before: {machine()}")
    loads: list[tuple[str, int | None, float | None]] = [(f"c={c}", int(c), None) for c in a.loads.split(",")]
    if a.rate:
        loads.append((f"rate {a.rate:g}/s", None, a.rate))
    clients = ["gate"] + ([] if a.no_guidellm else ["guidellm"])
    header = (f"{'mode':6s} {'load':11s} {'client':9s} {'n':>4s}  {'TTFT err p50':>12s} {'p99':>7s}  {'ITL err p50':>11s} "
              f"{'p99':>7s}  {'TPOT err p50':>12s} {'p99':>7s}  {'stub late p50/p99':>17s}  machine / client")
    results: list[tuple[str, str, str, dict[str, tuple[float, float]]]] = []
    modes = [(server, mode) for server in a.servers.split(",") for mode in a.modes.split(",")
             if server == "uvloop" or mode == "step"]
    with tempfile.TemporaryDirectory() as tmp:
        for server, mode in modes:
            mode = "thread" if server == "threaded" else mode
            proc, url = start_stub(a, per_token=mode == "token", server=server)
            try:
                print(header)
                for run in range(a.runs):
                    for k, (name, c, rate) in enumerate(loads):
                        n = max(16, a.waves * c) if c else int(4 * rate)
                        for client in (clients if run % 2 == 0 else clients[::-1]):  # each goes first in turn
                            settle(a.settle_s)
                            seen = len(stub_log(url))
                            quiet = machine()
                            if client == "gate":
                                rows, what = gate_run(url, a, c, rate, n, 1000 + 100000 * (run * 10 + k))
                            else:
                                rows, what = guidellm_run(url, a, c, rate, n, Path(tmp) / f"{mode}-{run}-{k}")
                            log = stub_log(url)[seen:]
                            late = server_lateness(log, a.ttft_ms)
                            if client == "gate" and server == "threaded":
                                what += split(rows, log, a.ttft_ms)
                            if server == "threaded":  # the server's view of either client: how long after its handler
                                # began the request's bytes were read (a client that connects, then sends late, starts
                                # its clock after the server's: its TTFT misses the server's time before the handler)
                                wait = [(r["read_s"] - r["handler_s"]) * 1e3 for r in log if "read_s" in r]
                                if wait:
                                    what += f"; stub: request read p50 {statistics.median(wait):.2f} ms after its handler began"
                            e = errors(rows, t, client)
                            results.append((mode, name, client, e))
                            print(f"{mode:6s} {name:11s} {client:9s} {len(rows):4d}  {e['ttft'][0]:+12.2f} {e['ttft'][1]:+7.2f}  "
                                  f"{e['itl'][0]:+11.3f} {e['itl'][1]:+7.3f}  {e['tpot'][0]:+12.3f} {e['tpot'][1]:+7.3f}  "
                                  f"{late[0]:+8.2f}/{late[1]:+7.2f}  {quiet}; {what}", flush=True)
            finally:
                proc.terminate()
                proc.wait(10)
    print(f"after: {machine()}")
    if "guidellm" in clients:
        print("\ngate vs guidellm, TTFT error (ms, median over runs of each run's figure): p50 gate / guidellm, p99 gate / guidellm")
        for mode in sorted({m for m, _, _, _ in results}, key=[m for m, _, _, _ in results].index):
            for name, _, _ in loads:
                g = [e for m, n_, c, e in results if (m, n_, c) == (mode, name, "gate")]
                h = [e for m, n_, c, e in results if (m, n_, c) == (mode, name, "guidellm")]
                gp50, hp50 = statistics.median(x["ttft"][0] for x in g), statistics.median(x["ttft"][0] for x in h)
                gp99, hp99 = statistics.median(x["ttft"][1] for x in g), statistics.median(x["ttft"][1] for x in h)
                print(f"  {mode:6s} {name:11s} p50 {gp50:+7.2f} / {hp50:+7.2f} {'ok' if abs(gp50) <= abs(hp50) else 'WORSE'}"
                      f"   p99 {gp99:+7.2f} / {hp99:+7.2f} {'ok' if abs(gp99) <= abs(hp99) else 'WORSE'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
