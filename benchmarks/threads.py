"""What a steady neighbour costs the in-process runner, with torch's threads as given and with
gate's fitted threads (measurement.threads auto, issue 42).

The work is a SmolLM2-135M-width MLP stack (30 layers of 576 -> 1536 -> 576, float32) over a
64-token block, the shape of a prefill or a verification forward. One iteration is one pass
through the stack. It runs for `--seconds` at a time, `--repeats` times per setting (the
median is quoted), on two machines states, side by side in one run:

  quiet:      as the machine is (its CPU pressure and procs_running are printed);
  neighbour:  beside one busy-looping process this benchmark starts (`while True: pass`),
              the steady CPU-bound neighbour of issue 42, killed on every exit path.

Settings: "given", the threads the process has (torch's default: one per core), and
"fitted", what gate.measure.contention.fitted_threads chooses from runnable_elsewhere()
measured just before (the runner's fit at the start). It prints iterations/s per state and
setting, the neighbour's cost as busy/quiet, and fitted/given beside the neighbour.

    python benchmarks/threads.py [--seconds 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import atexit
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gate.measure.contention import fitted_threads, read_pressure, runnable_elsewhere  # noqa: E402
from gate.measure.environment import cpu_count  # noqa: E402

LAYERS, HIDDEN, INTERMEDIATE, TOKENS = 30, 576, 1536, 64


def rate(seconds: float, weights: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor) -> float:
    """Iterations per second of the MLP stack over `seconds`."""
    n, start = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - start < seconds:
            h = x
            for up, down in weights:
                h = torch.nn.functional.gelu(h @ up) @ down
            n += 1
    return n / (time.perf_counter() - start)


def measure(threads: int, seconds: float, repeats: int, weights: list, x: torch.Tensor) -> float:
    torch.set_num_threads(threads)
    rate(0.5, weights, x)  # warm
    return statistics.median(rate(seconds, weights, x) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    weights = [(torch.randn(HIDDEN, INTERMEDIATE) / 24, torch.randn(INTERMEDIATE, HIDDEN) / 39) for _ in range(LAYERS)]
    x = torch.randn(TOKENS, HIDDEN)
    given, cpus = torch.get_num_threads(), cpu_count() or 1
    psi = read_pressure()
    print(f"torch {torch.__version__}, {cpus} CPUs, {given} threads given; CPU pressure (some, avg10) "
          f"{psi.avg10 if psi else 'n/a'}%; runnable elsewhere now {runnable_elsewhere()}")
    rows: dict[tuple[str, str], tuple[int, float]] = {}
    for state in ("quiet", "neighbour"):
        hog = None
        if state == "neighbour":
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            atexit.register(hog.kill)
            time.sleep(1.0)
        try:
            elsewhere = runnable_elsewhere()
            fitted = fitted_threads(cpus, elsewhere, given)
            for setting, threads in (("given", given), ("fitted", fitted)):
                rows[state, setting] = (threads, measure(threads, a.seconds, a.repeats, weights, x))
            print(f"{state}: {elsewhere} other runnable task(s) -> fitted {fitted} thread(s)")
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    print(f"\n{'state':<10} {'setting':<8} {'threads':>7} {'iterations/s':>13}  (median of {a.repeats} x {a.seconds:g} s)")
    for (state, setting), (threads, r) in rows.items():
        print(f"{state:<10} {setting:<8} {threads:>7} {r:>13.1f}")
    for setting in ("given", "fitted"):
        print(f"neighbour / quiet, {setting}: {rows['neighbour', setting][1] / rows['quiet', setting][1]:.2f}x")
    print(f"beside the neighbour, fitted / given: {rows['neighbour', 'fitted'][1] / rows['neighbour', 'given'][1]:.2f}x")


if __name__ == "__main__":
    main()
