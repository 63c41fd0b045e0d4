"""benchmarks/gpu_bill.py, the prepared device check of the bill against the measured peak
(issue 43), runs here unchanged at toy sizes: every target, runner and num_draft_tokens gets its
bill, its lines and both loops' speeds; on a CPU the peak says "not measured: no accelerator"."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_bill.py"


@pytest.fixture(scope="module")
def gpu_bill():
    spec = importlib.util.spec_from_file_location("gpu_bill", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_bill"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_device_check_runs_at_toy_sizes(gpu_bill, capsys) -> None:
    rows = gpu_bill.main(["--toy", "--requests", "1"])
    out = capsys.readouterr().out
    assert {(r.target, r.runner) for r in rows} == {
        (t, r) for t in ("llama-1b", "llama-8b", "mistral-gqa")
        for r in ("fallback", "small-k4", "exit-k4", "small-k8", "exit-k8")}
    for r in rows:
        assert r.bill_bytes == sum(b for _, b in r.lines) > 0
        assert r.gate_tps > 0 and r.hf_tps is not None and r.hf_tps > 0
        assert r.peak_bytes is None and r.ratio is None  # no accelerator here
        names = {n for n, _ in r.lines}
        assert "target weights" in names and "target KV cache" in names
        assert ("verification positions" in names) == (r.runner != "fallback")
        assert ("draft weights" in names) == r.runner.startswith("small")  # early exit shares the target's
    gqa = {r.runner: r for r in rows if r.target == "mistral-gqa"}
    llama = {r.runner: r for r in rows if r.target == "llama-1b"}
    kv = lambda r: dict(r.lines)["target KV cache"]  # noqa: E731
    assert kv(gqa["fallback"]) < kv(llama["fallback"])  # the window (32 of 96 tokens) and fewer KV heads
    assert "| mistral-gqa | exit-k8 | 8 |" in out and "measured peak: not measured: no accelerator" in out
