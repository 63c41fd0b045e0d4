"""The tests of tests/unit/test_no_silent_gaps.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from conftest import stub_policy, write_policy
from gate.cli import cli
from gate.policy.reader import load_policy
from gate.plan.validate import load_gaps
from served_stub import Stub
from unit.test_no_silent_gaps import ACCEPTANCE, PER_CONCURRENCY, PER_RATE, STATIC_METRICS


def policy(model_dir: Path, prompts: Path, fallback: str, draft: str, load: str, rules: str, draft_metrics: str = "") -> str:
    """A served policy on two stub endpoints with a prompt-lookup draft; contention handling off
    (these tests are about what is reported, not about the machine)."""
    return stub_policy(model_dir, prompts, fallback, draft, draft_name="lookup",
                       draft_spec="{kind: prompt_lookup, max_ngram_size: 2, num_draft_tokens: 3}",
                       draft_metrics=draft_metrics or None, load=load, max_new_tokens=8, rules=rules)


def check(tmp_path: Path, text: str) -> tuple[int, dict, str]:
    path = write_policy(tmp_path, text)
    out = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["check", str(path), "--json", str(out), "--no-progress"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, json.loads(out.read_text()), result.output


def test_per_concurrency_says_it_does_not_apply_at_request_rates(tmp_path, tiny_model_dir, prompts_file):
    load = "{concurrency: [1, 2], request_rate: [50]}"
    with Stub(ttft_s=0.01, itl_s=0.004) as slow, Stub(ttft_s=0.01, itl_s=0.002) as fast:
        text = policy(tiny_model_dir, prompts_file, slow.url, fast.url, load, PER_CONCURRENCY + PER_RATE)
        code, report, out = check(tmp_path, text)
    assert {r["request_rate"] for r in report["measurements"]["requests"]} == {None, 50.0}  # the open loop ran
    speedup = {o["scope"]: o for o in report["outcomes"] if o["rule_id"] == "speedup"}
    assert set(speedup) == {"lookup/greedy/concurrency=1", "lookup/greedy/concurrency=2", "lookup/greedy/request_rate=50"}
    gap = speedup["lookup/greedy/request_rate=50"]
    assert gap["status"] == "skipped"
    assert gap["message"] == ("speedup (pooled): per: concurrency does not apply at request rate 50/s: an open-loop load "
                              "point offers a request rate and has no fixed concurrency; not evaluated (a rule with "
                              "per: request_rate decides it)")
    assert all(speedup[f"lookup/greedy/concurrency={c}"]["status"] != "skipped" for c in (1, 2))
    # and the other way round: per: request_rate at the closed-loop points
    ttft = {o["scope"]: o for o in report["outcomes"] if o["rule_id"] == "ttft"}
    assert ttft["lookup/greedy/request_rate=50"]["status"] != "skipped"
    for c in (1, 2):
        assert ttft[f"lookup/greedy/concurrency={c}"]["status"] == "skipped"
        assert (f"per: request_rate does not apply at concurrency {c}: a closed-loop load point keeps a fixed number "
                "of requests in flight and offers no request rate") in ttft[f"lookup/greedy/concurrency={c}"]["message"]
    explained = CliRunner().invoke(cli, ["explain", str(tmp_path / "report.json"), "speedup",
                                         "--scope", "lookup/greedy/request_rate=50"])
    assert explained.exit_code == 0 and "SKIPPED" in explained.output and "does not apply" in explained.output, \
        explained.output
    # the validation warnings reach the report's notes, naming the rule and its line
    notes = [n for n in report["notes"] if "gives no verdict" in n]
    assert len(notes) == 2 and "rules[0].per" in notes[0] and "rules[1].per" in notes[1], report["notes"]


def test_validate_warns_at_the_rules_yaml_path_and_line(tmp_path, tiny_model_dir, prompts_file):
    load = "{concurrency: [1, 2], request_rate: [2, 8]}"
    text = policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:9", load,
                  PER_CONCURRENCY + PER_RATE + "  - {id: scoped, metric: speedup, aggregation: pooled, comparison: '>=', "
                  "threshold: 1.0x, per: concurrency, scope: {concurrency: [2]}}\n")
    path = write_policy(tmp_path, text)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    line = next(i for i, x in enumerate(text.splitlines(), 1) if "id: speedup" in x)
    flat = " ".join(result.output.split())
    assert "rules[0].per" in flat and f":{line}" in flat, result.output
    assert ("rule 'speedup': per: concurrency gives no verdict at load.request_rate 2, 8: an open-loop load point "
            "offers a request rate and has no fixed concurrency; those points are reported as not evaluated (add a "
            "rule with per: request_rate to decide them, or list this rule's points in scope.concurrency)") in flat
    assert "rule 'ttft': per: request_rate gives no verdict at load.concurrency 1, 2" in flat
    assert "rule 'scoped'" not in flat  # a rule scoped to its own axis's points leaves no gap
    # the same warnings as data: one per rule with a gap
    assert [at for at, _ in load_gaps(load_policy(path).policy)] == ["rules[0].per", "rules[1].per"]


def test_one_axis_only_gives_no_warning(tmp_path, tiny_model_dir, prompts_file):
    text = policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:9", "{concurrency: [1, 2]}",
                  PER_CONCURRENCY)
    assert load_gaps(load_policy(write_policy(tmp_path, text)).policy) == []


def test_a_lookup_runner_whose_server_never_proposed_says_so(tmp_path, tiny_model_dir, prompts_file):
    """Counters that never move (a static /metrics) and draft_n 0 in every response: the
    acceptance rule says the server made no proposal, at which load point and over how many
    requests, instead of "measurement missing"."""
    load = "{concurrency: [1, 2]}"
    with Stub() as fallback, Stub(metrics_text=STATIC_METRICS, draft_n=0, draft_n_accepted=0) as draft:
        text = policy(tiny_model_dir, prompts_file, fallback.url, draft.url, load, ACCEPTANCE, draft.url + "/metrics")
        code, report, out = check(tmp_path, text)
    assert code == 3, out
    acc = {o["scope"]: o for o in report["outcomes"] if o["rule_id"] == "acceptance"}
    n = sum(1 for r in report["measurements"]["requests"] if r["draft"] == "lookup" and r["concurrency"] == 2)
    assert n == 5
    for c in (1, 2):
        o = acc[f"lookup/greedy/concurrency={c}"]
        assert o["status"] == "error"
        assert o["message"] == (f"acceptance_rate (pooled): no proposal: the server made no draft proposal at concurrency "
                                f"{c} (0 draft tokens over {n} requests: speculation off, or prompt lookup found no n-gram "
                                "to copy) vs threshold >= 0.100")
        assert "measurement missing" not in o["message"]


