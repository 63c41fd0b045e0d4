"""A sequential run end to end on the tiny model (gate.plan.rounds, gate.rules.sequential): a
cell is measured again only while one of its error-level verdicts is undecided, each verdict
says its look, and the report and console say what the run spent."""

from __future__ import annotations

import json
from collections import Counter

from click.testing import CliRunner

from gate.cli import cli
from conftest import stub_policy, tiny_policy, write_policy
from served_stub import Stub

DRAFTS = ("  same_bf16:\n    kind: model\n    model: target\n    dtype: bfloat16\n    num_draft_tokens: 3\n"
          "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n")
# Two of the five prompts are chat: an interval needs 5 units, so a rule on them alone is
# undecided until later looks (further repetitions) bring 5. The error-level one extends
# lookup's cell; the warn-level one never extends same_bf16's.
RULES = ("  - id: chat-ttft\n    metric: ttft_ms\n    aggregation: mean\n    comparison: '<='\n    threshold: 10 s\n"
         "    scope: {drafts: [lookup], categories: [chat]}\n"
         "  - id: chat-ttft-warn\n    metric: ttft_ms\n    aggregation: mean\n    comparison: '<='\n    threshold: 10 s\n"
         "    scope: {drafts: [same_bf16], categories: [chat]}\n    level: warn\n")


def test_only_the_undecided_cell_is_measured_again_and_its_verdict_says_its_look(tmp_path, tiny_model_dir, prompts_file):
    text = tiny_policy(tiny_model_dir, prompts_file, RULES, drafts=DRAFTS, max_new_tokens=4)
    text += "measurement: {warmup_requests: 0, max_cpu_stall: null, budget: {requests: 20}}\n"
    policy = write_policy(tmp_path, text)
    validated = CliRunner().invoke(cli, ["validate", str(policy)])
    assert "sequential: looks at 5, 10, 20 prompts per runner and law (past the workload's 5, its prompts again, one more " \
           "repetition each time); 15 timed requests at the first look, at most 60 " \
           "(measurement.budget), against the fixed plan's 15" in validated.output, validated.output
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(out), "--junit", str(tmp_path / "j.xml"),
                                      "--markdown", str(tmp_path / "r.md"), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "sequential: 45 timed requests, 3.00x the fixed plan's 15" in (tmp_path / "r.md").read_text()
    report = json.loads(out.read_text())
    m = report["measurements"]
    assert Counter(r["draft"] for r in m["requests"]) == {"fallback": 20, "lookup": 20, "same_bf16": 5}
    assert m["looks"]["schedule"] == [5, 10, 20]
    assert m["looks"]["taken"] == {"fallback/greedy": 3, "lookup/greedy": 3, "same_bf16/greedy": 1}
    outcomes = {o["rule_id"] + "/" + o["draft"]: o for o in report["outcomes"]}
    chat = outcomes["chat-ttft/lookup"]
    assert chat["status"] == "pass" and chat["samples"] == 8  # the chat prompts of 4 repetitions
    assert "look 3 of 3" in chat["message"] and "97.50% CI" not in chat["message"], chat["message"]
    assert outcomes["chat-ttft-warn/same_bf16"]["status"] == "inconclusive"  # warn level: decided on what was measured
    assert "look 1 of 3" in outcomes["itl/same_bf16"]["message"]
    cost = report["cost"]
    assert cost["requests"] == 45 and cost["fixed_plan"] == 15 and cost["budget"] == 60
    last = [line for line in result.output.splitlines() if not line.startswith("reports:")][-1]  # the console's last
    assert last.startswith("sequential: 45 timed requests, 3.00x the fixed plan's 15 (budget 60;"), last
    assert "lookup/greedy (look 3 of 3)" in last and "same_bf16" not in last


def test_a_fixed_plan_is_decided_once_at_the_policys_confidence(tmp_path, tiny_model_dir, prompts_file):
    text = tiny_policy(tiny_model_dir, prompts_file, RULES, drafts=DRAFTS, max_new_tokens=4)
    text += "measurement: {warmup_requests: 0, max_cpu_stall: null, sequential: false}\n"
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["check", str(write_policy(tmp_path, text)), "--json", str(out), "--junit",
                                      str(tmp_path / "j.xml"), "--no-progress"])
    assert result.exit_code == 3, result.output  # chat-ttft: 2 units, inconclusive, error level
    report = json.loads(out.read_text())
    assert report["measurements"]["looks"] is None and report["cost"] is None
    assert len(report["measurements"]["requests"]) == 15
    assert all(" of 3" not in o["message"] and "look 1" not in o["message"] for o in report["outcomes"])
    assert "sequential:" not in result.output


def test_a_served_run_looks_in_whole_windows_and_measures_its_searches_and_samples_once(
        tmp_path, tiny_model_dir, prompts_file):
    """Served, at a load point: a look is a window of every prompt. The error-level rule on the
    two chat prompts needs 5 of them: the first look (the plan's one window) leaves it
    undecided, the budget's 3 windows decide it. The envelope search runs once, after the
    first look's requests, not again with each further look."""
    rules = ("  - {id: chat-ttft, metric: ttft_ms, aggregation: mean, comparison: '<=', threshold: 10 s, "
             "scope: {categories: [chat]}}\n"
             "  - {id: sustains, kind: envelope, comparison: '>=', threshold: 1, level: warn}\n")
    load = "{concurrency: [1], search: {start: 1, max: 2, requests_per_load: 1}}"
    measurement = "repetitions: 1, warmup_requests: 0, max_cpu_stall: null, max_client_lag_ms: null, budget: {requests: 15}"
    with Stub(ttft_s=0.01, itl_s=0.002) as fallback, Stub(ttft_s=0.01, itl_s=0.002, draft_n=8, draft_n_accepted=4) as draft:
        policy = write_policy(tmp_path, stub_policy(tiny_model_dir, prompts_file, fallback.url, draft.url, load=load,
                                                    rules=rules, measurement=measurement, max_new_tokens=4))
        out = tmp_path / "r.json"
        result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(out), "--junit", str(tmp_path / "j.xml"),
                                          "--no-progress"])
    assert "Traceback" not in result.output, result.output
    report = json.loads(out.read_text())
    m = report["measurements"]
    assert m["looks"]["unit"] == "window" and m["looks"]["schedule"] == [1, 2, 3], m["looks"]
    assert m["looks"]["taken"] == {"fallback/greedy": 3, "fast/greedy": 3}
    assert Counter((r["draft"], r["repetition"]) for r in m["requests"]) == {
        (d, rep): 5 for d in ("fallback", "fast") for rep in (0, 1, 2)}
    assert len(m["envelopes"]) == 2  # one search per runner, after the first look only
    (chat,) = [o for o in report["outcomes"] if o["rule_id"] == "chat-ttft"]
    assert chat["status"] == "pass" and "look 3 of 3" in chat["message"], chat["message"]


def test_greedy_exactness_stops_its_cell_at_the_look_that_found_a_fault(tmp_path, tiny_model_dir, prompts_file,
                                                                        monkeypatch):
    """An error-level exactness rule holds its cell to the fixed plan while it passes (a pass
    states no power against a fault that hits some requests), but the greedy check runs after
    every look: a verifier that accepts every proposal diverges from the target's argmax at
    once, and the cell stops at the first look (8 of the plan's 15 prompts)."""
    from gate.core.speculative import Verdict, sample

    drafts = "  exit1:\n    kind: early_exit\n    num_layers: 1\n    num_draft_tokens: 3\n"
    text = tiny_policy(tiny_model_dir, prompts_file, "  - {id: exact, kind: exactness}\n", drafts=drafts,
                       max_new_tokens=8)
    text += "measurement: {repetitions: 3, warmup_requests: 0, max_cpu_stall: null}\n"

    def run(folder: str) -> dict:
        (tmp_path / folder).mkdir()
        policy = write_policy(tmp_path / folder, text)
        CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / folder / "r.json"), "--no-progress"])
        return json.loads((tmp_path / folder / "r.json").read_text())

    correct = run("correct")
    assert correct["measurements"]["looks"]["schedule"][:2] == [8, 15]
    (exact,) = [o for o in correct["outcomes"] if o["rule_id"] == "exact"]
    assert exact["status"] == "pass" and correct["measurements"]["looks"]["taken"]["exit1/greedy"] == 2
    assert sum(r["draft"] == "exit1" for r in correct["measurements"]["requests"]) == 15  # the fixed plan

    def accept_all(p, q, proposals, generator):
        n = int(proposals.shape[0])
        return Verdict(n, sample(p[n], generator))

    monkeypatch.setattr("gate.runners.transformers.verify", accept_all)
    faulty = run("faulty")
    (exact,) = [o for o in faulty["outcomes"] if o["rule_id"] == "exact"]
    assert exact["status"] == "fail", exact["message"]
    assert faulty["measurements"]["looks"]["taken"]["exit1/greedy"] == 1
    assert sum(r["draft"] == "exit1" for r in faulty["measurements"]["requests"]) == 8
    assert "of 8 requests committed tokens" in exact["message"], exact["message"]  # checked at the look: all 8


def test_a_budget_below_the_plan_or_the_first_look_is_a_warning_naming_both(tmp_path, tiny_model_dir, prompts_file):
    text = tiny_policy(tiny_model_dir, prompts_file, "", max_new_tokens=4)
    shown = {}
    for budget in (3, 10, 30):
        (tmp_path / str(budget)).mkdir()
        policy = write_policy(tmp_path / str(budget), text + f"measurement: {{repetitions: 3, budget: {{requests: {budget}}}}}\n")
        result = CliRunner().invoke(cli, ["validate", str(policy)])
        assert result.exit_code == 0, result.output
        shown[budget] = result.output
    assert "measurement.budget.requests: 3 is below the first look's 8 timed requests" in shown[3]
    assert "the first look is measured whole, so the budget is exceeded (the fixed plan is 15)" in shown[3]
    assert "measurement.budget.requests: 10 is below the fixed plan's 15 timed requests" in shown[10]
    assert "is below the" not in shown[30]  # a budget over the plan warns of nothing
    fixed = write_policy(tmp_path, text + "measurement: {sequential: false, budget: {requests: 30}}\n")
    result = CliRunner().invoke(cli, ["validate", str(fixed)])
    assert result.exit_code == 0 and "measurement.budget.requests: sequential: false measures the fixed plan" \
        in result.output, result.output
