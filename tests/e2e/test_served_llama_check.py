"""`gate check` with runner llama_server end to end on a real llama-server: a tiny GGUF
target, an early-exit draft gate writes as a GGUF (-md) and prompt lookup (ngram-simple),
at two load points; the server's counters, the windows, the rules per concurrency, the
servers gate started (and stopped)."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from conftest import write_policy
from gate.cli import cli
from gguf_models import write_tiny_llama_gguf
from e2e.test_llama_server import BINARY, needs_binary


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gguf")
    return write_tiny_llama_gguf(folder / "target.gguf", seed=0, layers=2)


def check(tmp_path, path):
    """`gate check` on the policy at `path`: the click result and the JSON report (which must exist)."""
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["check", str(path), "--json", str(out), "--junit", str(tmp_path / "j.xml"),
                                      "--no-progress"])
    assert out.is_file(), result.output
    return result, json.loads(out.read_text())


@needs_binary
def test_gate_check_on_llama_server_measures_every_load_point(tmp_path, tiny_gguf, prompts_file, monkeypatch):
    import gate.runners.llama_server

    monkeypatch.setattr(gate.runners.llama_server, "GGUF_CACHE_DIR", tmp_path / "gguf")  # where the early-exit GGUF is written
    monkeypatch.setenv("GATE_LLAMA_SERVER", BINARY)
    path = write_policy(tmp_path, f"""\
version: 1
target: {{model: {tiny_gguf}, device: cpu}}
drafts:
  exit1: {{kind: early_exit, num_layers: 1, num_draft_tokens: 3}}
  lookup: {{kind: prompt_lookup, max_ngram_size: 2, num_draft_tokens: 3}}
law: {{temperature: 0}}
runner: {{kind: llama_server, threads: 1, ctx_size: 512}}
load: {{concurrency: [1, 2], goodput: {{ttft: 10000 ms}}}}
workload: {{source: jsonl, path: {prompts_file}, max_new_tokens: 12, seed: 0, chat_template: true}}
measurement: {{repetitions: 1, warmup_requests: 1, inconclusive: warn}}
rules:
  - {{id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 0.01x, per: concurrency}}
  - {{id: accept, metric: acceptance_rate, aggregation: pooled, comparison: '>=', threshold: 0.0, scope: {{drafts: [exit1]}}}}
""")
    result, report = check(tmp_path, path)
    m = report["measurements"]
    assert not m["failures"], m["failures"]
    assert result.exit_code == 0, result.output
    # 3 runners x 2 load points, each window with the server's counter deltas for the drafts
    windows = {(w["runner"], w["load"]["concurrency"]): w for w in m["runs"]}
    assert set(windows) == {(r, c) for r in ("fallback", "exit1", "lookup") for c in (1, 2)}
    assert windows[("fallback", 1)]["counters"]["num_draft_tokens"] == 0
    assert windows[("exit1", 2)]["counters"]["num_draft_tokens"] > 0
    assert windows[("exit1", 1)]["good_requests"] == 5  # every request within a 10 s TTFT
    # every request gets the fixed length (ignore_eos), and the early-exit draft ran from a GGUF gate wrote
    assert {len(r["output_ids"]) for r in m["requests"]} == {12}
    (exit1,) = [s for s in m["servers"] if s["runner"] == "exit1"]
    assert "-md" in exit1["command"] and exit1["command"][exit1["command"].index("-md") + 1].endswith(".gguf")
    assert exit1["command"][exit1["command"].index("-md") + 1].startswith(str(tmp_path / "gguf"))
    assert exit1["peak_rss_bytes"] > 0 and "llama-server" in exit1["version"]
    # no NVIDIA GPU here: the server's device memory is not measured, and says why (gate.measure.device_memory)
    assert exit1["device_bytes"] is None and exit1["device_memory_note"].startswith("no accelerator")
    speedups = {o["scope"] for o in report["outcomes"] if o["rule_id"] == "speedup"}
    assert speedups == {f"{d}/greedy/concurrency={c}" for d in ("exit1", "lookup") for c in (1, 2)}
    assert {p["runner"] for p in report["load"]} == {"fallback", "exit1", "lookup"}
    # no server is left running
    left = subprocess.run(["pgrep", "-f", str(tiny_gguf)], capture_output=True, text=True).stdout.strip()
    assert left == ""


@needs_binary
def test_sampled_exactness_on_llama_server_decides_at_the_speculative_positions(tmp_path, tiny_gguf, prompts_file,
                                                                                monkeypatch):
    # llama.cpp samples each position with the target's own sampler and keeps a draft token only when it equals it:
    # lossless by construction, so the early-exit draft under a sampled law must not fail. The tiny model's logits
    # are nearly flat, so llama.cpp's kernels can move a token across the top-k boundary and fail the fallback's
    # one-sample check: 800 samples per runner are enough for either reference (the two-sample one needs about 2x)
    import gate.runners.llama_server

    monkeypatch.setattr(gate.runners.llama_server, "GGUF_CACHE_DIR", tmp_path / "gguf")
    monkeypatch.setenv("GATE_LLAMA_SERVER", BINARY)
    path = write_policy(tmp_path, f"""\
version: 1
target: {{model: {tiny_gguf}, device: cpu}}
drafts:
  exit1: {{kind: early_exit, num_layers: 1, num_draft_tokens: 3}}
law: {{temperature: 1.0, top_k: 3}}
runner: {{kind: llama_server, threads: 1, ctx_size: 512}}
load: {{concurrency: [1, 2]}}
workload: {{source: jsonl, path: {prompts_file}, max_new_tokens: 4, seed: 0, chat_template: true}}
measurement: {{repetitions: 1, warmup_requests: 0, inconclusive: warn}}
rules:
  - {{id: exact, kind: exactness, detect_tv: 0.2, next_token_samples: 800}}
""")
    result, report = check(tmp_path, path)
    m = report["measurements"]
    assert not m["failures"], m["failures"]
    (o,) = [o for o in report["outcomes"] if o["rule_id"] == "exact"]
    assert o["status"] == "pass", o["message"]
    assert "reference: " in o["message"] and "cost: " in o["message"]
    (claim,) = [t for t in o["details"] if t["role"] == "claim"]
    assert "after output [" in claim["name"] and claim["detectable"] <= 0.2
    samples = m["samples"]
    assert {s["runner"] for s in samples} == {"fallback", "exit1"} and {s["concurrency"] for s in samples} == {1, 2}
    assert len({s["seed"] for s in samples}) == len(samples)


@needs_binary
def test_a_managed_draft_server_that_does_not_speculate_decides_nothing(tmp_path, tiny_gguf, prompts_file, monkeypatch):
    """The early-exit draft's llama-server keeps a draft token only when the draft is certain of
    it (runner.extra_args: --spec-draft-p-min 1.0), which a draft never is: speculation is
    configured and never happens, as with a checkpoint loaded under the wrong method. The
    server serves the target alone, at the fallback's speed and with its tokens. Its speedup (>= 0.01x) and greedy
    exactness would pass; every outcome of it is an error naming the cause, and the run exits 3."""
    import gate.runners.llama_server

    monkeypatch.setattr(gate.runners.llama_server, "GGUF_CACHE_DIR", tmp_path / "gguf")
    monkeypatch.setenv("GATE_LLAMA_SERVER", BINARY)
    path = write_policy(tmp_path, f"""\
version: 1
target: {{model: {tiny_gguf}, device: cpu}}
drafts:
  exit1: {{kind: early_exit, num_layers: 1, num_draft_tokens: 3}}
law: {{temperature: 0}}
runner: {{kind: llama_server, threads: 1, ctx_size: 512, extra_args: [--spec-draft-p-min, "1.0"]}}
load: {{concurrency: [1]}}
workload: {{source: jsonl, path: {prompts_file}, max_new_tokens: 32, seed: 0, chat_template: true}}
measurement: {{repetitions: 1, warmup_requests: 1, inconclusive: warn}}
rules:
  - {{id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 0.01x, per: concurrency}}
  - {{id: exact, kind: exactness}}
""")
    result, report = check(tmp_path, path)
    assert result.exit_code == 3, result.output
    (rec,) = report["measurements"]["speculation"]
    assert rec["status"] == "off" and rec["draft_tokens"] == 0 and rec["floor_steps"] >= 2, rec
    (window,) = [w for w in report["measurements"]["runs"] if w["runner"] == "exit1"]
    assert window["counters"]["num_draft_tokens"] == 0  # the server's own counters agree
    outcomes = [o for o in report["outcomes"] if o["draft"] == "exit1"]
    assert {o["rule_id"] for o in outcomes} == {"speedup", "exact"}
    assert all(o["status"] == "error" and o["message"].startswith("speculation did not run: draft exit1") for o in outcomes)
