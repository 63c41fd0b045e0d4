"""The trained-draft kinds on the real vLLM (tests/unit/test_vllm_server.py describes the runner):
gate's EAGLE-1 checkpoint and its draft heads exported to vLLM's Medusa format load, speculate and
keep greedy output exact. Its own module, so that pytest-xdist runs it beside the other vLLM
module rather than after it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import write_policy
from gate.cli import cli
from gate.runners import vllm_server as vs
from e2e.test_vllm_server import tiny_gguf  # noqa: F401 - the module's fixture: the same tiny GGUF target
from unit.test_vllm_server import BINARY, needs_vllm


@pytest.fixture(scope="module")
def served_trained_drafts(tmp_path_factory, tiny_gguf, prompts_file):
    """One `gate check` on a real vLLM of the trained-draft kinds it serves: an EAGLE draft (random
    weights, vLLM's EAGLE-1 format, method eagle) and draft heads exported to vLLM's Medusa
    format, at concurrency 1, greedy. Returns (exit code, output, report)."""
    import torch

    from gate.drafts.eagle import EagleModule, eagle_config, save_checkpoint as save_eagle
    from gate.drafts.heads import MedusaHeads, base_identity, save_checkpoint as save_heads
    from gate.models.loading import load_model, resolve_source

    tmp = tmp_path_factory.mktemp("vllm-trained")
    target = load_model(resolve_source(str(tiny_gguf), None, tmp, "target.model"), "float32", torch.device("cpu"))
    torch.manual_seed(0)
    save_eagle(tmp / "eagle1", EagleModule(eagle_config(target.config), target.get_input_embeddings()),
               base_identity(target, str(tiny_gguf)))
    save_heads(tmp / "heads", MedusaHeads(3, target.config.hidden_size), base_identity(target, str(tiny_gguf)))
    mp = pytest.MonkeyPatch()
    mp.setattr(vs, "HF_CACHE_DIR", tmp / "hf")
    mp.setenv("GATE_VLLM", BINARY or "")
    try:
        path = write_policy(tmp, f"""\
version: 1
target: {{model: {tiny_gguf}, device: cpu}}
drafts:
  eagle: {{kind: eagle, checkpoint: {tmp / 'eagle1'}, num_draft_tokens: 3}}
  heads: {{kind: heads, checkpoint: {tmp / 'heads'}, num_draft_tokens: 3}}
law: {{temperature: 0}}
runner: {{kind: vllm, max_model_len: 512, kv_cache_space_gib: 1}}
load: {{concurrency: [1]}}
workload: {{source: jsonl, path: {prompts_file}, max_new_tokens: 12, seed: 0, chat_template: true}}
measurement: {{repetitions: 1, warmup_requests: 0, inconclusive: warn}}
rules:
  - {{id: exact, kind: exactness}}
""")
        out = tmp / "r.json"
        result = CliRunner().invoke(cli, ["check", str(path), "--json", str(out), "--no-progress"])
        return result.exit_code, result.output, json.loads(out.read_text()) if out.is_file() else None
    finally:
        mp.undo()


@needs_vllm
def test_vllm_serves_an_eagle_checkpoint_and_heads_as_medusa(served_trained_drafts):
    """The checkpoint formats gate writes load in the real vLLM: EAGLE-1 (method eagle, sharing the
    target's embeddings and lm_head) and the heads through vLLM's Medusa proposer; both speculate
    (vLLM's counters move) and keep greedy output exact."""
    code, output, report = served_trained_drafts
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
    assert {o["draft"] for o in exact} == {"eagle", "heads"} and {o["status"] for o in exact} == {"pass"}, exact
    assert code == 0, output
