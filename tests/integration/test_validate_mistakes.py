"""The tests of tests/unit/test_validate_mistakes.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch
from click.testing import CliRunner
from conftest import tiny_llama, tiny_policy, tiny_tokenizer, write_policy

from gate.cli import cli
from gate.measure.bill import bill_lines
from gate.policy.model import BILL_LINES


def validate(tmp_path, text):
    policy = write_policy(tmp_path, text)
    return CliRunner().invoke(cli, ["validate", str(policy)])


@pytest.mark.parametrize("edit, where, words", [
    (lambda t: t.replace("law:\n  - temperature: 0\n", "law: []\n"), "law", "at least one law"),
    (lambda t: t[: t.index("rules:")] + "rules: []\n", "rules", "at least 1"),
    (lambda t: t + "    scope: {drafts: []}\n", "rules[1].scope.drafts", "at least 1"),
    (lambda t: t + "    scope: {categories: [repaet]}\n", "rules[1].scope.categories[0]", "did you mean 'repeat'"),
    (lambda t: t + "  - id: kv\n    metric: memory_line_bytes\n    line: draft kv cache\n    aggregation: max\n"
                   "    comparison: '<='\n    threshold: 1 GiB\n", "rules[2].line", "did you mean 'draft KV cache'"),
    (lambda t: t + "  - id: room\n    metric: extra_sequences\n    aggregation: min\n    comparison: '>='\n    threshold: 1\n",
     "rules[2].metric", "needs resources.capacity"),
    (lambda t: t.replace("num_layers: 1", "num_layers: 5"), "drafts.exit1.num_layers", "below the target's 2 layers"),
    (lambda t: t.replace("max_new_tokens: 12", "max_new_tokens: 600"), "workload.max_new_tokens", "max_position_embeddings"),
    (lambda t: t.replace("max_new_tokens: 12", "max_new_tokens: 100000000"), "workload.max_new_tokens", "1,000,000"),
    (lambda t: t.replace("  lookup:\n", "  target:\n"), "drafts.target", "reserved"),
])
def test_validate_catches_it(tmp_path, tiny_model_dir, prompts_file, edit, where, words):
    result = validate(tmp_path, edit(tiny_policy(tiny_model_dir, prompts_file)))
    assert result.exit_code == 2, result.output
    assert f": {where}: " in result.output and words in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("line, words", [
    ({"prompt": "w1", "categroy": "x"}, "did you mean 'category'"),
    ({"prompt": "w1", "messages": [{"role": "user", "content": "w2"}]}, "exactly one of"),
    ({"messages": [{"role": "usr", "content": "w2"}]}, "role one of system, user, assistant"),
    ({"id": "a", "prompt": "w3"}, "used twice (first on line 1)"),
])
def test_jsonl_prompt_lines_are_strict(tmp_path, tiny_model_dir, line, words):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\ufeff" + json.dumps({"id": "a", "prompt": "w1 w2"}) + "\n" + json.dumps(line) + "\n")
    result = validate(tmp_path, tiny_policy(tiny_model_dir, prompts))
    assert result.exit_code == 2 and f"{prompts}:2: " in result.output and words in result.output, result.output


def test_every_bill_line_name_is_known_to_the_policy():
    from gate.measure.bill import SERVER_POOL_LINE, BillInputs
    from gate.measure.kv import cache_model

    c = cache_model(tiny_llama(0).config, "float32")
    lines = bill_lines(BillInputs("d", c, 1, 96, 10, 1, 3, c, 1, True, 2, 1, 1, 1, 0.1, draft_vocab_size=200))
    # the lines of gate's own bill, and the served bill's line for a server's preallocated KV pool
    assert {x.name for x in lines} | {SERVER_POOL_LINE} == set(BILL_LINES)


def test_a_draft_with_a_padded_vocabulary_runs(tmp_path, tiny_model_dir, prompts_file):
    padded = tmp_path / "padded"
    tiny_llama(1, vocab_size=128).save_pretrained(padded)
    tiny_tokenizer().save_pretrained(padded)
    drafts = f"  padded:\n    kind: model\n    model: {padded}\n    num_draft_tokens: 3\n"
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, drafts=drafts, laws="  - temperature: 0\n  - temperature: 0.8\n"))
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["measurements"]["failures"] == [], report["measurements"]["failures"]
    assert result.exit_code == 0, result.output
    assert all(o["status"] == "pass" for o in report["outcomes"])


def test_fail_on_warn_makes_warnings_junit_failures(tmp_path, tiny_model_dir, prompts_file):
    rule = "  - id: w\n    level: warn\n    metric: itl_ms\n    aggregation: p99\n    comparison: '<='\n    threshold: 0.000001 ms\n"
    # a violated ceiling must fail even on a busy test machine (contended: inconclusive, see test_contention.py)
    text = tiny_policy(tiny_model_dir, prompts_file, rule) + "measurement:\n  max_cpu_stall: null\n"
    policy = write_policy(tmp_path, text)
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"),
                                      "--no-warmup", "--fail-on-warn"])
    assert result.exit_code == 1
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert int(suite.get("failures")) == 3  # w[...] for each of the three drafts


def test_roofline_report_must_be_a_report_of_this_policy(tmp_path, tiny_model_dir, prompts_file):
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    base = ["roofline", str(policy), "--bandwidth", "100GB/s", "--peak", "1TFLOP/s"]
    result = CliRunner().invoke(cli, base + ["--report", str(broken)])
    assert result.exit_code == 2 and "not a gate check JSON report" in result.output
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "gate-report/1", "measurements": {"drafts": {}}}))
    result = CliRunner().invoke(cli, base + ["--report", str(other)])
    assert result.exit_code == 2 and "not made with this policy" in result.output
    result = CliRunner().invoke(cli, ["roofline", "--bandwidth", "1GiB/s", "--peak", "1TFLOP/s", "--report", str(other)])
    assert result.exit_code == 2 and "--report needs the POLICY" in result.output


def test_markdown_summary_appends_and_explain_reads_the_report(tmp_path, tiny_model_dir, prompts_file):
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file))
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    args = ["check", str(policy), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"), "--no-warmup",
            "--markdown", str(summary)]
    assert CliRunner().invoke(cli, args).exit_code == 0
    text = summary.read_text()
    assert text.startswith("earlier step\n## gate: passed") and "| lookup | greedy |" in text
    result = CliRunner().invoke(cli, ["explain", str(tmp_path / "r.json"), "itl", "--scope", "lookup/greedy"])
    assert result.exit_code == 0 and "itl[lookup/greedy]: PASS" in result.output and "mean taken:" in result.output
    bad = CliRunner().invoke(cli, ["explain", str(policy), "itl"])
    assert bad.exit_code == 2 and "not a gate JSON report" in bad.output


def test_a_hub_id_already_in_the_local_cache_is_used_offline(tmp_path, prompts_file):
    """`model: acme/tiny` resolves from the Hugging Face cache without any network."""
    import os
    import subprocess
    import sys

    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("0123abc")
    tiny_llama(0).save_pretrained(snapshot)
    tiny_tokenizer().save_pretrained(snapshot)
    policy = write_policy(tmp_path, tiny_policy("acme/tiny", prompts_file))
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    run = [sys.executable, "-c", "from gate.cli import main; main()", "check", str(policy), "--json", str(tmp_path / "r.json"),
           "--junit", str(tmp_path / "j.xml"), "--no-warmup"]
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    models = json.loads((tmp_path / "r.json").read_text())["measurements"]["environment"]["models"]
    assert models[0]["source"] == "acme/tiny"
    missing = subprocess.run(run[:4] + [str(write_policy(tmp_path, tiny_policy("acme/absent", prompts_file), "p2.yaml"))],
                             env=env, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "not in the local Hugging Face cache" in missing.stderr


def test_exactness_rules_refuse_category_scopes(tmp_path, tiny_model_dir, prompts_file):
    rule = "  - id: exact\n    kind: exactness\n    scope: {categories: [repeat]}\n"
    result = validate(tmp_path, tiny_policy(tiny_model_dir, prompts_file, rule))
    assert result.exit_code == 2 and "rules[2].scope: an exactness rule covers every prompt" in result.output


def test_exactness_is_an_error_when_requests_failed(tmp_path, tiny_model_dir, prompts_file, monkeypatch):
    from gate.runners.transformers import TransformersRunner

    generate = TransformersRunner._generate

    def flaky(self, prompt_ids, draft, *args, **kwargs):  # fails on the draft's requests for one prompt only
        if draft is not None and draft.name == "lookup" and 14 in prompt_ids:  # "w10": prompt c
            raise RuntimeError("simulated failure")
        return generate(self, prompt_ids, draft, *args, **kwargs)

    monkeypatch.setattr(TransformersRunner, "_generate", flaky)
    rule = "  - id: exact\n    kind: exactness\n"
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, rule))
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"),
                                      "--no-warmup"])
    out = {o["scope"]: o for o in json.loads((tmp_path / "r.json").read_text())["outcomes"] if o["rule_id"] == "exact"}
    assert out["lookup/greedy"]["status"] == "error" and "simulated failure" in out["lookup/greedy"]["message"]
    assert out["same_bf16/greedy"]["status"] == "pass"
    assert result.exit_code == 3


def test_recorded_samples_matching_no_rule_scope_are_an_error(tmp_path, tiny_model_dir, prompts_file):
    rule = "  - id: exact\n    kind: exactness\n    scope: {laws: [greedy]}\n"
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, rule))
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"prompt_ids": [1, 5], "output_ids": [7, 8], "law": {"temperature": 0.7}}) + "\n")
    result = CliRunner().invoke(cli, ["exactness", str(policy), str(samples), "--json", str(tmp_path / "r.json"),
                                      "--junit", str(tmp_path / "j.xml")])
    assert result.exit_code == 3
    outcome = json.loads((tmp_path / "r.json").read_text())["outcomes"][0]
    assert outcome["status"] == "error" and "nothing recorded matches" in outcome["message"]
    conflicting = tmp_path / "c.jsonl"
    conflicting.write_text(json.dumps({"prompt_ids": [1], "output_ids": [7], "law": {"name": "x", "temperature": 0.7}}) + "\n"
                           + json.dumps({"prompt_ids": [1], "output_ids": [7], "law": {"name": "x", "temperature": 0.9}}) + "\n")
    result = CliRunner().invoke(cli, ["exactness", str(policy), str(conflicting), "--json", str(tmp_path / "r2.json")])
    assert result.exit_code == 2 and "c.jsonl:2: law.name: law name 'x' was used on an earlier line" in result.output


def test_sliding_window_targets_run_inside_their_window_and_beyond(tmp_path, prompts_file):
    """Inside the window, and past it (gate's loop rolls sliding-window layers back past their window:
    gate.models.cache.record_past): the run passes and the measured KV cache is the predicted one."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=512, sliding_window=64, bos_token_id=1,
                           eos_token_id=2, pad_token_id=0)
    model_dir = tmp_path / "mistral"
    MistralForCausalLM(config).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    policy = write_policy(tmp_path, tiny_policy(model_dir, prompts_file, max_new_tokens=12))
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"),
                                      "--no-warmup"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    kv = next(x for x in report["measurements"]["bills"][0]["lines"] if x["name"] == "target KV cache")
    assert kv["measured_bytes"] == kv["predicted_at_measured_bytes"]
    long = write_policy(tmp_path, tiny_policy(model_dir, prompts_file, max_new_tokens=64), "long.yaml")
    result = CliRunner().invoke(cli, ["check", str(long), "--json", str(tmp_path / "long.json"), "--no-warmup"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "long.json").read_text())
    m = report["measurements"]
    assert not m["failures"] and max(len(r["output_ids"]) for r in m["requests"]) == 64
    kv = next(x for x in m["bills"][0]["lines"] if x["name"] == "target KV cache")
    assert kv["measured_at_tokens"] > 64 and kv["measured_bytes"] == kv["predicted_at_measured_bytes"]
    outputs = {}
    for r in m["requests"]:
        if r["draft"] in ("fallback", "lookup", "exit1"):  # float32 drafts: greedy outputs are the fallback's
            outputs.setdefault(r["prompt_id"], {})[r["draft"]] = r["output_ids"]
    assert all(len({tuple(v) for v in o.values()}) == 1 for o in outputs.values())


def test_a_fixed_thread_count_that_oversubscribes_the_cpus_is_warned_about(tmp_path, tiny_model_dir, prompts_file):
    """measurement.threads above the CPUs this process may use oversubscribes them (auto fits them):
    gate validate warns at the key and still passes the policy."""
    from gate.measure.environment import cpu_count

    text = tiny_policy(tiny_model_dir, prompts_file).replace("  chat_template: true\n",
                                                             f"  chat_template: true\nmeasurement:\n  threads: {(cpu_count() or 1) + 1}\n")
    result = validate(tmp_path, text)
    assert result.exit_code == 0, result.output
    assert "measurement.threads" in result.output and "oversubscribe" in result.output and "auto fits them" in result.output
    fitted = validate(tmp_path, text.replace(f"threads: {(cpu_count() or 1) + 1}", "threads: auto"))
    assert fitted.exit_code == 0 and "measurement.threads" not in fitted.output
