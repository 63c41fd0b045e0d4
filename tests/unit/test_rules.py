"""Rule evaluation on synthetic records: aggregation, relative_to fallback, pooled counters,
errors for missing measurements, levels; and the JUnit and JSON reports built from them."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from gate.policy.model import RuleSpec
from gate.records import (DraftInfo, BillLine, BillRecord, Environment, Failure, Measurements, OverlapRecord, RequestRecord)
from gate.report.document import make_report, report_schema
from gate.report.json import JsonReport
from gate.report.junit import JunitReport
from gate.rules.evaluate import evaluate, exit_code
from gate.analysis.summary import summarize

ROOT = Path(__file__).resolve().parents[2]


def req(draft, e2el, n, proposed=(), accepted=(), law="greedy", category="qa", prompt="p1"):
    times = [e2el * (i + 1) / n for i in range(n)]
    steps = len(proposed) or n
    committed = [a + 1 for a in accepted] if accepted else [1] * n
    return RequestRecord(draft, law, prompt, category, n, 0, 10, list(range(n)), times, committed,
                         list(proposed) or [0] * steps, list(accepted) or [0] * steps, "length", e2el, 4, 20, 1000, 500)


def env():
    return Environment("3.11", "2.x", "5.x", "0.1.0", "linux", "cpu", "cpu", 0)


def measurements(prompts: int = 5):
    """Five prompts (an interval needs 5 units), alternating categories qa and code."""
    m = Measurements(environment=env(), laws=["greedy"], drafts={"good": DraftInfo("model"), "bad": DraftInfo("model")})
    for i in range(1, prompts + 1):
        p, cat = f"p{i}", "qa" if i % 2 else "code"
        # fallback: 10 tokens in 1000 ms -> 10 tokens/s pooled
        m.requests.append(req("fallback", 1000.0, 10, prompt=p, category=cat))
        # good: same tokens in 500 ms -> 2x; steps: prefill + 3 steps of gamma 4
        m.requests.append(req("good", 500.0, 10, [0, 4, 4, 4], [0, 3, 2, 1], prompt=p, category=cat))
        m.requests.append(req("bad", 2000.0, 10, [0, 4] + [4] * 8, [0, 1] + [0] * 8, prompt=p, category=cat))
        m.overlaps += [OverlapRecord("good", "greedy", p, cat, "distribution", [1.0, 0.9, None], [True, True, None]),
                       OverlapRecord("bad", "greedy", p, cat, "distribution", [0.1, 0.3], [False, False])]
    m.bills += [BillRecord("good", 1, 100, [BillLine("target weights", "", 1000), BillLine("draft weights", "", 3 * 2**30)])]
    return m


def rule(**kw):
    base = dict(id="r", metric="overlap", aggregation="mean", comparison=">=", threshold=0.5)
    base.update(kw)
    return RuleSpec(**base)


def by_draft(outcomes):
    return {o.draft: o for o in outcomes}


def test_mean_overlap_skips_positions_without_proposals():
    out = by_draft(evaluate([rule()], measurements()))
    assert out["good"].status == "pass" and out["good"].measured == pytest.approx(0.95) and out["good"].samples == 10
    assert out["bad"].status == "fail" and "measured 0.200" in out["bad"].message and "threshold >= 0.500" in out["bad"].message


def test_speedup_relative_to_fallback_is_a_ratio_of_pooled_throughput():
    out = by_draft(evaluate([rule(metric="committed_tokens_per_s", aggregation="pooled", relative_to="fallback", threshold="1.1x")],
                            measurements()))
    assert out["good"].measured == pytest.approx(2.0) and out["good"].status == "pass"
    assert out["bad"].measured == pytest.approx(0.5) and out["bad"].status == "fail"
    assert out["good"].fallback_value == pytest.approx(10.0)


def test_pooled_acceptance_counters_not_averaged_ratios():
    out = by_draft(evaluate([rule(metric="acceptance_rate", aggregation="pooled", threshold=0.4)], measurements()))
    assert out["good"].measured == pytest.approx(12 / 24)
    out = by_draft(evaluate([rule(metric="mean_acceptance_length", aggregation="pooled", threshold="2 tokens")], measurements()))
    assert out["good"].measured == pytest.approx(1 + 12 / 6)
    assert out["bad"].measured == pytest.approx(1 + 2 / 18)


def test_category_scope_and_percentiles():
    r = rule(metric="ttft_ms", aggregation="p99", comparison="<=", threshold="100 ms", scope={"categories": ["code"]})
    out = by_draft(evaluate([r], measurements()))
    assert out["good"].scope == "good/greedy/code" and out["good"].samples == 2  # p2 and p4
    assert out["good"].measured == pytest.approx(50.0) and out["bad"].measured == pytest.approx(200.0)


def test_missing_measurement_is_an_error_not_a_pass_or_failure():
    m = measurements()
    m.failures.append(Failure("request", "bad", "greedy", "request p3", "RuntimeError: boom"))
    out = by_draft(evaluate([rule(metric="ttft_ms", comparison="<=", threshold="10 s")], m))
    assert out["bad"].status == "error" and "boom" in out["bad"].message
    assert out["good"].status == "pass"
    # a memory bill that was never built: error, with the reason
    out = by_draft(evaluate([rule(metric="memory_bill_bytes", aggregation="max", comparison="<=", threshold="2 GiB")], m))
    assert out["good"].status == "fail" and out["bad"].status == "error"
    assert exit_code(evaluate([rule(metric="ttft_ms", comparison="<=", threshold="10 s")], m), m) == 3


def test_levels_warn_and_off():
    m = measurements()
    outs = evaluate([rule(level="warn"), rule(id="off", level="off")], m)
    statuses = {(o.rule_id, o.draft): o.status for o in outs}
    assert statuses[("r", "bad")] == "warn" and statuses[("off", "bad")] == "skipped"
    assert exit_code(outs, m) == 0 and exit_code(outs, m, fail_on_warn=True) == 1


def test_reports_junit_parses_and_json_validates(tmp_path):
    m = measurements()
    m.failures.append(Failure("request", "bad", "greedy", "request p3", "RuntimeError: <boom> & \"quotes\""))
    outcomes = evaluate([rule(), rule(id="t", metric="ttft_ms", comparison="<=", threshold="1 s"), rule(id="w", level="warn")], m)
    report = make_report("policy.yaml", {"version": 1}, m, outcomes, summarize(m), exit_code(outcomes, m))
    JunitReport().write(report, tmp_path / "j.xml")
    root = ET.parse(tmp_path / "j.xml").getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert "r[good/greedy]" in cases and cases["r[good/greedy]"].find("failure") is None
    failure = cases["r[bad/greedy]"].find("failure")
    assert failure is not None and "measured" in failure.get("message") and "threshold" in failure.get("message")
    assert cases["t[bad/greedy]"].find("error") is not None
    assert cases["w[bad/greedy]"].find("skipped") is not None
    suite = root.find("testsuite")
    assert int(suite.get("failures")) == 1 and int(suite.get("errors")) == 2  # t[bad] + the failed request
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["torch"] == "2.x" and props["seed"] == "0"
    JsonReport().write(report, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    jsonschema.Draft202012Validator(report_schema()).validate(doc)
    assert doc["summary"][0]["runner"] == "fallback"
    good = next(r for r in doc["summary"] if r["runner"] == "good")
    assert good["speedup"] == pytest.approx(2.0) and good["mean_acceptance_length"] == pytest.approx(3.0)


def test_checked_in_schemas_match_the_models():
    from gate.policy.schema import policy_schema

    assert json.loads((ROOT / "schemas" / "policy.schema.json").read_text()) == policy_schema()
    assert json.loads((ROOT / "schemas" / "report.schema.json").read_text()) == report_schema()


def test_example_policies_validate_against_the_schema():
    import yaml

    schema = json.loads((ROOT / "schemas" / "policy.schema.json").read_text())
    for path in [*ROOT.glob("examples/*/policy.yaml"), *ROOT.glob("policies/*.yaml")]:
        jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(path.read_text()))


def test_markdown_summary_and_explain(tmp_path):
    from gate.report.explain import explain_rule
    from gate.policy.saved import read_report as load_report
    from gate.report.markdown import MarkdownReport

    m = measurements()
    rules = [rule(), rule(id="speed", metric="committed_tokens_per_s", aggregation="pooled", relative_to="fallback", threshold="1.1x"),
             rule(id="ttft", metric="ttft_ms", aggregation="p99", comparison="<=", threshold="100 ms")]
    outcomes = evaluate(rules, m)
    policy = {"version": 1, "rules": [r.model_dump(mode="json") for r in rules]}
    report = make_report("policy.yaml", policy, m, outcomes, summarize(m), exit_code(outcomes, m))
    md = MarkdownReport().render(report)
    assert md.startswith("## gate: failed")
    assert "| **FAIL** | `r[bad/greedy]` |" in md and "r[good/greedy]" not in md  # passing rows are counted, not listed
    assert "| good | greedy | 0.950 |" in md
    JsonReport().write(report, tmp_path / "r.json")
    loaded = load_report(tmp_path / "r.json")
    text = explain_rule(loaded, "ttft", "bad/greedy", 5)
    assert "bad: 5 samples (one request), p99 taken: 200.0 ms, 200.0 ms" in text
    assert "decided by counting: 5 of 5 samples beyond the threshold" in text and "decision: fail" in text
    assert "value: p99 = 200.0 ms; threshold: <= 100.0 ms" in text
    text = explain_rule(loaded, "speed", None, 5)
    assert "pooled(draft) / pooled(fallback) = 2.000" in text and "speed[bad/greedy]: FAIL" in text
    with pytest.raises(KeyError, match="rules: r, speed, ttft"):
        explain_rule(loaded, "nope", None, 5)
