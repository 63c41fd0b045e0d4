"""The tests of tests/unit/test_resources.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from conftest import tiny_llama, tiny_policy, write_policy
from gate.cli import cli
from gate.models.loading import quantize_int8_dynamic, weight_bytes
from gate.measure.bill import estimate_weight_bytes
from unit.test_resources import RESOURCES


@pytest.mark.parametrize("dtype, quantization", [("float32", "none"), ("bfloat16", "none"), ("float32", "int8_dynamic")])
def test_weight_estimate_from_config_equals_loaded_bytes(dtype, quantization):
    model = tiny_llama(0, tie_word_embeddings=True).to(getattr(torch, dtype))
    if quantization == "int8_dynamic":
        model = quantize_int8_dynamic(model)
    estimate = estimate_weight_bytes(tiny_llama(0, tie_word_embeddings=True).config, dtype, quantization)
    assert abs(estimate - weight_bytes(model)) <= 256  # rotary buffers' dtype may differ


def test_gate_bill_on_a_policy_and_on_configs(tmp_path, tiny_model_dir, tiny_draft_dir, prompts_file):
    text = tiny_policy(tiny_model_dir, prompts_file) + RESOURCES
    policy = write_policy(tmp_path, text)
    result = CliRunner().invoke(cli, ["bill", str(policy), "--json"])
    assert result.exit_code == 0, result.output
    bills = {b["draft"]: b for b in json.loads(result.output)}
    assert set(bills) == {"fallback", "same_bf16", "lookup", "exit1"}
    lines = {x["name"]: x["bytes"] for x in bills["same_bf16"]["lines"]}
    assert lines["workspace"] == 64 * 1024 and bills["same_bf16"]["sequences"] == 2
    assert "draft weights" in lines and {x["name"]: x["bytes"] for x in bills["exit1"]["lines"]}["draft weights"] == 0
    budget = bills["fallback"]["budget"]
    assert budget["capacity_bytes"] == 2 * 2**20 and budget["headroom_bytes"] == 2 * 2**20 - sum(lines_of(bills["fallback"]))
    result = CliRunner().invoke(cli, ["bill", "--target", str(tiny_model_dir), "--draft", str(tiny_draft_dir),
                                      "--num-draft-tokens", "3", "--context-tokens", "100", "--sequences", "4", "--capacity", "1 GiB"])
    assert result.exit_code == 0, result.output
    assert "verification positions" in result.output and "more sequences that fit" in result.output
    bad = CliRunner().invoke(cli, ["bill", "--target", str(tmp_path)])
    assert bad.exit_code == 2 and "cannot read a model config" in bad.output


def lines_of(bill):
    return [x["bytes"] for x in bill["lines"] if x["coexists_at_peak"]]


def test_rules_on_bill_lines_and_headroom(tmp_path, tiny_model_dir, prompts_file):
    rules = ("  - id: draft-kv\n    metric: memory_line_bytes\n    line: draft KV cache\n    aggregation: max\n"
             "    comparison: '<='\n    threshold: 1 KiB\n    scope: {drafts: [same_bf16]}\n"
             "  - id: headroom\n    metric: memory_headroom_bytes\n    aggregation: min\n    comparison: '>='\n    threshold: 0 B\n"
             "  - id: room\n    metric: extra_sequences\n    aggregation: min\n    comparison: '>='\n    threshold: 1\n")
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, rules) + RESOURCES)
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"),
                                      "--no-warmup"])
    out = {(o["rule_id"], o["draft"]): o for o in json.loads((tmp_path / "r.json").read_text())["outcomes"]}
    assert out[("draft-kv", "same_bf16")]["status"] == "fail"  # the bf16 draft's cache is several KiB
    assert "'draft KV cache'" in out[("draft-kv", "same_bf16")]["message"]
    assert out[("headroom", "lookup")]["status"] == "pass"
    assert out[("room", "lookup")]["measured"] >= 1
    assert result.exit_code == 1


def test_bill_line_rule_validation(tmp_path, tiny_model_dir, prompts_file):
    rules = "  - id: x\n    metric: memory_line_bytes\n    aggregation: max\n    comparison: '<='\n    threshold: 1 KiB\n"
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, rules))
    result = CliRunner().invoke(cli, ["validate", str(policy)])
    assert result.exit_code == 2 and "rules[2].line" in result.output
