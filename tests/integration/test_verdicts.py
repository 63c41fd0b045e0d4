"""The tests of tests/unit/test_verdicts.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import tiny_policy, write_policy
from gate.cli import cli
from unit.test_verdicts import DRAFTS


def test_malformed_waivers_are_policy_errors(tmp_path, tiny_model_dir, prompts_file):
    text = tiny_policy(tiny_model_dir, prompts_file, drafts=DRAFTS)
    for bad, where in (("  - {rule: itl, scope: '*', reason: why not, owner: ana}\n", "waivers[0].expires"),
                       ("  - {rule: nope, scope: '*', reason: why not, owner: ana, expires: 2026-12-31}\n", "waivers[0].rule"),
                       ("  - {rule: itl, scope: '*', reason: why not, owner: ana, expires: next week}\n", "waivers[0].expires")):
        policy = write_policy(tmp_path, text + "waivers:\n" + bad)
        result = CliRunner().invoke(cli, ["validate", str(policy)])
        assert result.exit_code == 2 and where in result.output and "Traceback" not in result.output, result.output


def test_extra_repetitions_settle_an_inconclusive_verdict_and_are_noted(tmp_path, tiny_model_dir, prompts_file):
    # a mean TTFT ceiling at a value the tiny model surely meets, but with 3 requests the
    # interval is unreliable; the policy asks for extra repetitions when inconclusive.
    rule = ("  - id: ttft-median\n    metric: ttft_ms\n    aggregation: median\n    comparison: '<='\n    threshold: 10 s\n"
            "    scope: {drafts: [lookup]}\n")
    text = tiny_policy(tiny_model_dir, prompts_file, rule, drafts=DRAFTS)
    text += "measurement:\n  sequential: false\n  extra_repetitions: 2\n  warmup_requests: 0\n"
    policy = write_policy(tmp_path, text)
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml")])
    report = json.loads((tmp_path / "r.json").read_text())
    (o,) = [o for o in report["outcomes"] if o["rule_id"] == "ttft-median"]
    # median from 3 requests cannot be bounded at 95% (needs 6); after 1 extra repetition (6) it can
    assert o["status"] == "pass", o["message"]
    assert any(n.startswith("extra repetition 1 of 2") for n in report["notes"])
    reps = {r["repetition"] for r in report["measurements"]["requests"] if r["draft"] == "lookup"}
    assert reps == {0, 1} and result.exit_code == 0, result.output


def test_validate_warns_about_an_underpowered_policy(tmp_path, tiny_model_dir, prompts_file):
    rule = "  - id: ttft-p99\n    metric: ttft_ms\n    aggregation: p99\n    comparison: '<='\n    threshold: 1 s\n"
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, rule, drafts=DRAFTS))
    result = CliRunner().invoke(cli, ["validate", str(policy)])
    assert result.exit_code == 0 and "warning" in result.output
    assert ("rules[2].aggregation: p99 of ttft_ms can never pass at 95% confidence: even with no sample beyond the threshold it needs at least 368"
            in result.output)
    assert "policy.yaml:" in result.output  # the file and line are named


def test_a_percentile_the_fixed_plan_cannot_pass_but_the_budget_can_is_not_called_never(tmp_path, tiny_model_dir,
                                                                                       prompts_file):
    """A new user's finding: validate said a p99 rule "can never pass", and the run's further looks
    (another verdict of the cell undecided) passed it. With 5 prompts of 16 tokens (80 gaps at
    most) and a budget of 25 prompts (400), the rule's own cell stays undecided until 368."""
    from types import SimpleNamespace

    from gate.policy.reader import load_policy
    from gate.plan.validate import _budget_scale
    from gate.rules.power import underpowered

    rule = "  - {id: itl-p99, metric: itl_ms, aggregation: p99, comparison: '<=', threshold: 1 s}\n"
    text = tiny_policy(tiny_model_dir, prompts_file, rule, drafts=DRAFTS, max_new_tokens=16)
    for measurement, never in (("measurement: {budget: {requests: 25}}\n", False),
                               ("measurement: {sequential: false}\n", True),
                               ("measurement: {budget: {requests: 20}}\n", True)):
        policy = load_policy(write_policy(tmp_path, text + measurement)).policy
        prompts = [SimpleNamespace(category="qa")] * 5
        (w,) = [w for w in underpowered(policy, ["qa"] * 5, _budget_scale(policy, prompts)) if w.rule == 2]
        assert w.undecidable == never, w.message
        assert ("can never pass" in w.message) == never and ("cannot pass on the fixed plan" in w.message) != never
        assert never or "up to 400 tokens at the budget's last look" in w.message, w.message


def test_check_against_a_saved_baseline_report(tmp_path, tiny_model_dir, prompts_file):
    reps = "measurement:\n  repetitions: 4\n"
    text = tiny_policy(tiny_model_dir, prompts_file, drafts=DRAFTS) + reps
    first = CliRunner().invoke(cli, ["check", str(write_policy(tmp_path, text, "base.yaml")), "--json", str(tmp_path / "base.json"),
                                     "--junit", str(tmp_path / "b.xml"), "--no-warmup"])
    assert first.exit_code == 0, first.output
    rule = ("  - id: vs-release\n    metric: mean_acceptance_length\n    aggregation: pooled\n    relative_to: baseline\n"
            "    comparison: '>='\n    threshold: 0.5x\n    scope: {drafts: [lookup]}\n")
    text2 = tiny_policy(tiny_model_dir, prompts_file, rule, drafts=DRAFTS) + reps + "baseline:\n  report: base.json\n"
    second = CliRunner().invoke(cli, ["check", str(write_policy(tmp_path, text2)), "--json", str(tmp_path / "r.json"),
                                      "--junit", str(tmp_path / "j.xml"), "--no-warmup"])
    (o,) = [o for o in json.loads((tmp_path / "r.json").read_text())["outcomes"] if o["rule_id"] == "vs-release"]
    # prompt lookup is deterministic under greedy: the same accepted lengths, cell by cell, as the baseline run
    assert o["status"] == "pass" and o["measured"] == pytest.approx(1.0) and second.exit_code == 0, o["message"]
    # a baseline from another torch is not comparable: inconclusive, named, never silently wrong
    doc = json.loads((tmp_path / "base.json").read_text())
    torch_version = doc["measurements"]["environment"]["torch"]
    doc["measurements"]["environment"]["torch"] = "0.0-other"
    (tmp_path / "base.json").write_text(json.dumps(doc))
    third = CliRunner().invoke(cli, ["check", str(tmp_path / "policy.yaml"), "--json", str(tmp_path / "r.json"),
                                     "--junit", str(tmp_path / "j.xml"), "--no-warmup"])
    report = json.loads((tmp_path / "r.json").read_text())
    (o,) = [o for o in report["outcomes"] if o["rule_id"] == "vs-release"]
    assert o["status"] == "inconclusive" and "0.0-other" in o["message"] and third.exit_code == 3
    assert any(n.startswith("the baseline was measured otherwise") for n in report["notes"])
    # nor is one of another workload (a new user's finding: it was used silently, where gate compare refused it)
    doc["measurements"]["environment"]["torch"] = torch_version
    doc["measurements"]["workload"]["prompt_ids"][0] = "another-prompt"
    (tmp_path / "base.json").write_text(json.dumps(doc))
    fourth = CliRunner().invoke(cli, ["check", str(tmp_path / "policy.yaml"), "--json", str(tmp_path / "r.json"),
                                      "--junit", str(tmp_path / "j.xml"), "--no-warmup"])
    (o,) = [o for o in json.loads((tmp_path / "r.json").read_text())["outcomes"] if o["rule_id"] == "vs-release"]
    assert o["status"] == "inconclusive" and "prompts differ" in o["message"] and "another-prompt" in o["message"]
    assert fourth.exit_code == 3
    # a baseline that is not there is bad input at validate
    (tmp_path / "base.json").unlink()
    missing = CliRunner().invoke(cli, ["validate", str(tmp_path / "policy.yaml")])
    assert missing.exit_code == 2 and "baseline.report" in missing.output and "does not exist" in missing.output
    (tmp_path / "base.json").write_text("{not json")
    garbage = CliRunner().invoke(cli, ["validate", str(tmp_path / "policy.yaml")])
    assert garbage.exit_code == 2 and "policy.yaml:" in garbage.output and "baseline.report" in garbage.output


