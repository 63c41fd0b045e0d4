"""The tests of tests/unit/test_vllm_server.py's subject that need the real models, llama-server, vLLM or the browser; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import write_policy
from gate.cli import cli
from gate.runners import vllm_server as vs
from gguf_models import write_tiny_llama_gguf
from unit.test_vllm_server import BINARY, needs_vllm


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
measurement: {{repetitions: 1, warmup_requests: 0, inconclusive: warn, sequential: false}}
rules:
  - {{id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 0.01x, per: concurrency}}
  - {{id: exact, kind: exactness}}
{rules}""")


def test_a_draft_kind_vllm_cannot_run_is_refused_naming_the_draft(monkeypatch):
    from types import SimpleNamespace

    from gate.drafts.cross_tokenizer import CrossTokenizerDraftSpec
    from gate.core.errors import PolicyValueError

    monkeypatch.setenv("GATE_VLLM", "/bin/true")
    spec = CrossTokenizerDraftSpec(kind="cross_tokenizer", model="m")
    plan = SimpleNamespace(policy=SimpleNamespace(runner=vs.VLLMRunnerSpec(kind="vllm"), drafts={"x": spec}))
    with pytest.raises(PolicyValueError) as e:
        vs.VLLMServerRunner.from_plan(plan)
    assert e.value.path == "drafts.x.kind" and "runner vllm cannot run a cross_tokenizer draft" in e.value.message
    assert "prompt_lookup" in e.value.message and "early_exit" in e.value.message and "heads" in e.value.message


def test_a_missing_vllm_is_named_where_its_path_came_from(monkeypatch, tmp_path):
    """A bad $GATE_VLLM is blamed on the variable (the policy has no runner.binary); a bad
    runner.binary on runner.binary, whatever the environment says."""
    from types import SimpleNamespace

    from gate.core.errors import PolicyValueError

    monkeypatch.setenv("GATE_VLLM", str(tmp_path / "no-vllm"))
    plan = SimpleNamespace(policy=SimpleNamespace(runner=vs.VLLMRunnerSpec(kind="vllm"), drafts={}))
    with pytest.raises(PolicyValueError) as e:
        vs.VLLMServerRunner.from_plan(plan)
    assert e.value.path == "runner" and "$GATE_VLLM names" in e.value.message and "no-vllm" in e.value.message
    assert "make vllm" in e.value.message and "unset $GATE_VLLM" in e.value.message
    named = SimpleNamespace(policy=SimpleNamespace(runner=vs.VLLMRunnerSpec(kind="vllm", binary="bin/vllm"), drafts={}),
                            resolve=lambda p: tmp_path / p)
    with pytest.raises(PolicyValueError) as e:
        vs.VLLMServerRunner.from_plan(named)
    assert e.value.path == "runner.binary" and "bin/vllm is not an executable file" in e.value.message


@pytest.fixture(scope="module")
def checked(tmp_path_factory, tiny_gguf, prompts_file):
    """One `gate check` on a real vLLM, one server per runner (each start costs half a minute on 2 cores, so the
    module shares one run, and the fixed plan starts each once, where a sequential run's second look starts them
    all again): fallback; exit1 (early exit, draft_model); lookup (ngram); an EAGLE draft (random
    weights, vLLM's EAGLE-1 format, method eagle); draft heads exported to vLLM's Medusa format; at concurrency 1
    and 2, greedy. Returns (exit code, output, report, tmp folder)."""
    import torch

    from gate.drafts.eagle import EagleModule, eagle_config, save_checkpoint as save_eagle
    from gate.drafts.heads import MedusaHeads, base_identity, save_checkpoint as save_heads
    from gate.models.loading import load_model, resolve_source

    tmp = tmp_path_factory.mktemp("vllm-check")
    target = load_model(resolve_source(str(tiny_gguf), None, tmp, "target.model"), "float32", torch.device("cpu"))
    torch.manual_seed(0)
    save_eagle(tmp / "eagle1", EagleModule(eagle_config(target.config), target.get_input_embeddings()),
               base_identity(target, str(tiny_gguf)))
    save_heads(tmp / "heads", MedusaHeads(3, target.config.hidden_size), base_identity(target, str(tiny_gguf)))
    mp = pytest.MonkeyPatch()
    mp.setattr(vs, "HF_CACHE_DIR", tmp / "hf")
    mp.setenv("GATE_VLLM", BINARY or "")
    try:
        path = _policy(tmp, tiny_gguf, prompts_file, f"""\
  exit1: {{kind: early_exit, num_layers: 1, num_draft_tokens: 3}}
  lookup: {{kind: prompt_lookup, max_ngram_size: 2, num_draft_tokens: 3}}
  eagle: {{kind: eagle, checkpoint: {tmp / 'eagle1'}, num_draft_tokens: 3}}
  heads: {{kind: heads, checkpoint: {tmp / 'heads'}, num_draft_tokens: 3}}""",
                       "  - {id: accept, metric: acceptance_rate, aggregation: pooled, comparison: '>=', threshold: 0.0, "
                       "scope: {drafts: [exit1]}}\n")
        out = tmp / "r.json"
        result = CliRunner().invoke(cli, ["check", str(path), "--json", str(out), "--junit", str(tmp / "j.xml"),
                                          "--no-progress"])
        report = json.loads(out.read_text()) if out.is_file() else None
        return result.exit_code, result.output, report, tmp
    finally:
        mp.undo()


RUNNERS = ("fallback", "exit1", "lookup", "eagle", "heads")


@needs_vllm
def test_gate_check_on_vllm_measures_every_load_point(checked, tiny_gguf):
    code, output, report, tmp = checked
    assert report is not None, output
    m = report["measurements"]
    assert not m["failures"], m["failures"]
    assert code == 0, output
    windows = {(w["runner"], w["load"]["concurrency"]): w for w in m["runs"]}
    assert set(windows) == {(r, c) for r in RUNNERS for c in (1, 2)}
    assert windows[("fallback", 1)]["counters"] is None or windows[("fallback", 1)]["counters"]["num_draft_tokens"] == 0
    for c in (1, 2):  # vLLM's own counters: drafts, proposals, per-position acceptance
        counters = windows[("exit1", c)]["counters"]
        assert counters["num_drafts"] > 0 and counters["num_draft_tokens"] == 3 * counters["num_drafts"]
        assert len(counters["num_accepted_tokens_per_pos"]) == 3
        assert sum(counters["num_accepted_tokens_per_pos"]) == counters["num_accepted_tokens"]
    assert {len(r["output_ids"]) for r in m["requests"]} == {12}  # ignore_eos: the fixed length
    # gate turns on vLLM's per-request spec-decode metrics (detailed): every draft request carries its verification
    # steps, so acceptance verdicts rest on request units, and they reconcile with the window's counters
    drafted = [r for r in m["requests"] if r["draft"] == "exit1"]
    assert all(r["server_step_proposed"] and len(r["server_step_proposed"]) == len(r["server_step_accepted"])
               for r in drafted), drafted[0]
    assert not any("do not reconcile" in n for n in m["notes"]), [n for n in m["notes"] if "reconcile" in n]
    accept = [o for o in report["outcomes"] if o["rule_id"] == "accept"]
    assert accept and all(o["interval"] and o["interval"]["units"] >= 5 for o in accept), accept
    servers = {s["runner"]: s for s in m["servers"]}
    exit1 = servers["exit1"]["command"]
    spec = json.loads(exit1[exit1.index("--speculative-config") + 1])
    assert spec["method"] == "draft_model" and spec["model"].startswith(str(tmp / "hf"))
    assert "--no-enable-prefix-caching" in exit1
    assert exit1[exit1.index("--per-request-spec-decode-metrics") + 1] == "detailed"
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
    assert speedups == {f"{d}/greedy/concurrency={c}" for d in RUNNERS[1:] for c in (1, 2)}
    # greedy output of every draft equals the fallback's, token for token (vLLM's rejection sampler)
    exact = [o for o in report["outcomes"] if o["rule_id"] == "exact"]
    assert exact and {o["status"] for o in exact} == {"pass"}, exact
    # this run's servers only: their command lines name this test's model (another test's stand-in
    # vLLM, in the other pytest-xdist worker, may be answering to gate-fallback at the same moment)
    model = servers["fallback"]["command"][2]
    left = [pid for pid, argv in _command_lines().items()
            if model in argv and any(f"gate-{r}" in argv for r in RUNNERS)]
    assert left == [], "a vLLM server was left running"


def _command_lines() -> dict[int, list[str]]:
    """pid -> argv of every process still running (/proc; a process that ends meanwhile is skipped)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            out[int(entry.name)] = [a.decode(errors="replace") for a in argv if a]
    return out


@needs_vllm
def test_vllm_serves_an_eagle_checkpoint_and_heads_as_medusa(checked):
    """The checkpoint formats gate writes load in the real vLLM: EAGLE-1 (method eagle, sharing the
    target's embeddings and lm_head) and the heads through vLLM's Medusa proposer; both speculate
    (vLLM's counters move) and keep greedy output exact."""
    code, output, report, _ = checked
    assert report is not None, output
    m = report["measurements"]
    assert not m["failures"], m["failures"]
    servers = {s["runner"]: s for s in m["servers"]}
    for name, method in (("eagle", "eagle"), ("heads", "medusa")):
        command = servers[name]["command"]
        spec = json.loads(command[command.index("--speculative-config") + 1])
        assert spec["method"] == method and spec["num_speculative_tokens"] == 3
        counters = [w["counters"] for w in m["runs"] if w["runner"] == name]
        assert counters and all(c["num_draft_tokens"] > 0 for c in counters), counters
    assert "eagle" not in servers["heads"]["command"][servers["heads"]["command"].index("--speculative-config") + 1]
    exact = [o for o in report["outcomes"] if o["rule_id"] == "exact"]
    assert {"eagle", "heads"} <= {o["draft"] for o in exact} and {o["status"] for o in exact} == {"pass"}, exact
    assert code == 0, output
