"""The whole declared law in the policy (issue 13): min-p, the penalties, logit bias and the
convention on `law`; grammar constraints (workload.constraints and a JSONL line's
response_format) through validation and planning, scopes by constraint, and the reports'
side-by-side figures. Bad input exits 2 with one message naming the file, YAML path and line."""

from __future__ import annotations


import pytest


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "total": {"type": "number"}},
          "required": ["name", "total"], "additionalProperties": False}


ROWS = [
    {"id": "a", "category": "x", "prompt": "w1 w2 w3", "response_format": {"type": "json_schema", "schema": SCHEMA}},
    {"id": "b", "category": "x", "prompt": "w4 w5 w6",
     "response_format": {"type": "json_schema", "json_schema": {"name": "bill", "schema": SCHEMA}}},
    {"id": "c", "category": "y", "prompt": "w7 w8", "response_format": {"type": "regex", "pattern": "w[0-9]+( w[0-9]+)*"}},
    {"id": "d", "category": "y", "prompt": "w9 w10", "response_format": {"type": "choice", "choices": ["w1", "w2"]}},
    {"id": "e", "category": "y", "prompt": "w11 w12"},
]


# --- law fields --------------------------------------------------------------------------


# --- constraints: policy entries, plan expansion ------------------------------------------


# --- a JSONL line's response_format ------------------------------------------------------


# --- rules scoped by constraint -----------------------------------------------------------


def test_selections_scope_keys_and_summaries_keep_constraints_apart():
    from dataclasses import replace

    from gate.records import Environment, Measurements, OverlapRecord, RequestRecord, WorkloadInfo
    from gate.report.console import ConsoleReport
    from gate.report.document import make_report
    from gate.report.html import HtmlReport
    from gate.report.markdown import MarkdownReport
    from gate.rules.scope import parse_scope, scope_key
    from gate.rules.selection import Selection
    from gate.analysis.summary import summarize

    def request(draft: str, prompt: str, constraint: str, accepted: int) -> RequestRecord:
        steps = [1, 1 + accepted] if draft != "fallback" else [1, 1]
        proposed = [0, 4] if draft != "fallback" else [0, 0]
        return RequestRecord(draft, "greedy", f"{prompt}#{constraint}", "x", 8, 0, 5, [7] * sum(steps), [1.0] * sum(steps),
                             steps, proposed, [0, accepted] if draft != "fallback" else [0, 0], "length", 10.0,
                             4 if draft != "fallback" else 0, None, None, None, constraint=constraint)

    reqs = [request(d, p, c, 3 if c == "none" else 1) for p in "ab" for c in ("none", "json") for d in ("fallback", "lookup")]
    overlaps = [OverlapRecord("lookup", "greedy", f"{p}#{c}", "x", "point_mass", [0.9 if c == "none" else 0.3], [True],
                              constraint=c) for p in "ab" for c in ("none", "json")]
    env = Environment("3", "2", "4", "0", "linux", "cpu", "cpu", 0)
    m = Measurements(env, requests=reqs, overlaps=overlaps, laws=["greedy"],
                     workload=WorkloadInfo("jsonl", 0, 2, ["a", "b"], constraints=["none", "json"]))
    m.drafts = {"lookup": None}  # only the names matter to the summary
    sel = Selection("lookup", "greedy", None, constraints=("json",))
    assert [r.prompt_id for r in reqs if sel.takes(r)] == ["a#json", "b#json"]
    assert parse_scope(scope_key(sel)) == sel and scope_key(sel) == "lookup/greedy/constraint=json"
    row = next(r for r in summarize(m) if r.runner == "lookup")
    assert list(row.by_constraint) == ["none", "json"]
    assert row.by_constraint["none"].acceptance_rate == 0.75 and row.by_constraint["json"].acceptance_rate == 0.25
    assert row.by_constraint["none"].overlap_mean == pytest.approx(0.9) and row.by_constraint["json"].overlap_mean == pytest.approx(0.3)
    report = make_report("p.yaml", {}, m, [], summarize(m), 0)
    console = ConsoleReport().render(report)
    assert "By grammar constraint" in console and "constraint" in console and "accept rate" in console
    # one row per constraint, the draft and law's constraints adjacent: none then json
    rows = [line for line in console.splitlines() if "lookup" in line and ("│ none " in line or "│ json " in line)]
    assert len(rows) == 2 and "0.750" in rows[0] and "│ none " in rows[0] and "0.250" in rows[1] and "│ json " in rows[1], rows
    markdown = MarkdownReport().render(report)
    assert "### By grammar constraint" in markdown and "| lookup | greedy | 0.900 | 0.750 | 4.00 | 0.300 | 0.250 | 2.00 |" in markdown
    page = HtmlReport().render(report)
    assert 'id="constraints"' in page and '<th colspan="3">json</th>' in page
    from gate.policy.model import RuleSpec
    from gate.rules.evaluate import evaluate

    per = RuleSpec(id="ov", metric="overlap", aggregation="mean", comparison=">=", threshold=0.5, per="constraint")
    scoped = RuleSpec(id="acc", metric="acceptance_rate", aggregation="pooled", comparison=">=", threshold=0.5,
                      scope={"constraints": ["json"]})
    outcomes = evaluate([per, scoped], m)
    assert [(o.scope, o.measured) for o in outcomes if o.rule_id == "ov"] == [
        ("lookup/greedy/constraint=none", pytest.approx(0.9)), ("lookup/greedy/constraint=json", pytest.approx(0.3))]
    assert [(o.scope, o.measured) for o in outcomes if o.rule_id == "acc"] == [("lookup/greedy/constraint=json", 0.25)]
    one = replace(report, summary=[replace(r, by_constraint={k: v for k, v in r.by_constraint.items() if k == "none"})
                                   for r in report.summary])
    assert "By grammar constraint" not in ConsoleReport().render(one)  # one constraint: nothing to set side by side
