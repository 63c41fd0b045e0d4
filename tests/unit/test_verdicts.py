"""What verdicts do downstream: inconclusive actions and exit codes, waivers, the JUnit
mapping and junit-xml's traps, baselines (`relative_to: baseline`, `gate compare`), extra
repetitions and the under-powered warnings of `gate validate`."""

from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner
import junit_xml

from gate.cli import cli
from gate.commands.compare import compare
from gate.policy.model import RuleSpec, WaiverSpec
from gate.records import DraftInfo, Environment, Measurements, ModelInfo, OverlapRecord, RequestRecord
from gate.report.document import make_report
from gate.report.junit import JunitReport
from gate.rules.evaluate import Settings, evaluate, exit_code
from gate.analysis.summary import summarize

DRAFTS = "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n"


def env(torch: str = "2.x") -> Environment:
    e = Environment("3.11", torch, "5.x", "0", "linux", "cpu", "cpu", 0)
    e.models = [ModelInfo("target", "t", "target", "float32", "abc", 1, 4)]
    return e


def req(runner: str, prompt: int, e2el: float, rep: int = 0, accepted: int = 0) -> RequestRecord:
    n = 10
    proposed = [0] + [4] * (n - 1) if runner != "fallback" else [0] * n
    acc = [0] + [accepted] * (n - 1) if runner != "fallback" else [0] * n
    return RequestRecord(runner, "greedy", f"p{prompt}", "qa" if prompt % 2 else "code", n, rep, 10, list(range(n)),
                         [e2el * (i + 1) / n for i in range(n)], [1] * n, proposed, acc, "length", e2el, 4, 20, 0, 0)


def run(speedups: dict[str, float], n: int = 12, noise: float = 0.0, seed: int = 0, torch: str = "2.x",
        overlap: float = 0.8) -> Measurements:
    """n paired requests per draft; each draft's per-request speedup is its value times lognormal noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    m = Measurements(environment=env(torch), laws=["greedy"], drafts={d: DraftInfo("model") for d in speedups})
    for i in range(n):
        base = 1000.0 * rng.lognormal(0, 0.1)
        m.requests.append(req("fallback", i, base))
        for d, s in speedups.items():
            m.requests.append(req(d, i, base / (s * rng.lognormal(0, noise)) if noise else base / s, accepted=2))
            m.overlaps.append(OverlapRecord(d, "greedy", f"p{i}", "qa" if i % 2 else "code", "distribution",
                                            [overlap + rng.normal(0, 0.05) for _ in range(8)], [True] * 8))
    return m


SPEEDUP = dict(id="speedup", metric="speedup", aggregation="pooled", comparison=">=", threshold="1.1x")


def test_inconclusive_action_decides_the_exit_code():
    m = run({"edge": 1.1}, n=12, noise=0.2)
    (o,) = evaluate([RuleSpec(**SPEEDUP)], m, Settings(inconclusive="error"))
    assert o.status == "inconclusive" and o.inconclusive_as == "error"
    assert "12 paired requests, 95% CI" in o.message and o.message.endswith(": inconclusive")
    assert exit_code([o], m) == 3 and exit_code([o], m, fail_on_inconclusive=True) == 1
    (o,) = evaluate([RuleSpec(**SPEEDUP)], m, Settings(inconclusive="fail"))
    assert exit_code([o], m) == 1
    (o,) = evaluate([RuleSpec(**SPEEDUP)], m, Settings(inconclusive="warn"))
    assert exit_code([o], m) == 0
    (o,) = evaluate([RuleSpec(**SPEEDUP, level="warn")], m, Settings(inconclusive="fail"))
    assert o.inconclusive_as == "warn" and exit_code([o], m) == 0  # a warn-level rule never fails the run by itself


def waiver(**kw):
    base = dict(rule="speedup", scope="slow/*", reason="known regression, fix in #12", owner="ana", expires="2026-12-31")
    base.update(kw)
    return WaiverSpec(**base)


def test_waiver_reports_skipped_with_owner_date_and_reason_and_expired_fails_closed():
    m = run({"slow": 0.8, "fast": 1.5})
    rules = [RuleSpec(**SPEEDUP)]
    live = Settings(waivers=[waiver()], today=dt.date(2026, 11, 29))
    out = {o.draft: o for o in evaluate(rules, m, live)}
    assert out["slow"].status == "waived" and out["slow"].waived_status == "fail"
    assert out["slow"].message.startswith("waived by ana until 2026-12-31: known regression, fix in #12")
    assert out["fast"].status == "pass" and out["fast"].waiver is None  # out of the waiver's scope
    assert exit_code(list(out.values()), m) == 0
    expired = Settings(waivers=[waiver()], today=dt.date(2027, 1, 1))
    out = {o.draft: o for o in evaluate(rules, m, expired)}
    assert out["slow"].status == "fail" and "expired on 2026-12-31: not applied" in out["slow"].message
    assert exit_code(list(out.values()), m) == 1
    report = make_report("p.yaml", {}, m, evaluate(rules, m, live), summarize(m), 0)
    root = ET.fromstring(JunitReport().render(report))
    skipped = {c.get("name"): c.find("skipped") for c in root.iter("testcase")}
    assert skipped["speedup[slow/greedy]"] is not None and "waived by ana" in skipped["speedup[slow/greedy]"].get("message")


def test_junit_mapping_names_and_the_packages_traps():
    m = run({"slow": 0.8, "edge": 1.1, "fast": 1.5}, noise=0.2)
    rules = [RuleSpec(**SPEEDUP), RuleSpec(**dict(SPEEDUP, id="soft", level="warn"))]
    outcomes = evaluate(rules, m, Settings(waivers=[waiver(rule="soft", scope="fast/*")]))
    report = make_report("p.yaml", {}, m, outcomes, summarize(m), exit_code(outcomes, m))
    statuses = {o.name: o.status for o in outcomes}
    assert statuses["speedup[slow/greedy]"] == "fail" and statuses["soft[slow/greedy]"] == "warn"
    assert statuses["speedup[edge/greedy]"] == "inconclusive" and statuses["speedup[fast/greedy]"] == "pass"
    root = ET.fromstring(JunitReport().render(report))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert len(cases) == len(outcomes)  # unique names: GitLab drops duplicates
    assert all(c.get("classname") == f"gate.{name.split('[')[0]}" for name, c in cases.items())
    assert all(cases["speedup[fast/greedy]"].find(tag) is None for tag in ("failure", "error", "skipped"))  # passing cases stay
    assert cases["speedup[edge/greedy]"].find("error") is not None  # inconclusive -> error (exit 3) by default
    assert cases["soft[slow/greedy]"].find("skipped") is not None
    forced = ET.fromstring(JunitReport(fail_on_inconclusive=True, warn_as="failure").render(report))
    forced_cases = {c.get("name"): c for c in forced.iter("testcase")}
    assert forced_cases["speedup[edge/greedy]"].find("failure") is not None
    assert forced_cases["soft[slow/greedy]"].find("failure") is not None
    # trap 1: junit-xml's <testsuites> does not sum skipped; gate's does
    suite = root.find("testsuite")
    assert int(root.get("skipped")) == int(suite.get("skipped")) >= 2
    raw = ET.fromstring(junit_xml.to_xml_report_string([junit_xml.TestSuite("s", [_skipped()])]))
    assert raw.get("skipped") is None  # the trap is real: this is why gate writes the totals itself
    # trap 2: a failure without a message is silently a pass in junit-xml; gate never writes one
    silent = junit_xml.TestCase("x")
    silent.add_failure_info()
    assert not silent.is_failure()
    for case in root.iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                assert child.get("message"), ET.tostring(case)


def _skipped() -> junit_xml.TestCase:
    case = junit_xml.TestCase("y")
    case.add_skipped_info("skip")
    return case


def test_relative_to_baseline_pairs_cells_and_an_environment_mismatch_is_inconclusive():
    base = run({"released": 1.5}, noise=0.05, seed=1)
    cand = run({"candidate": 1.2}, noise=0.05, seed=2)
    rule = RuleSpec(id="vs-release", metric="speedup", aggregation="pooled", relative_to="baseline", comparison=">=", threshold="0.95x")
    (o,) = evaluate([rule], cand, Settings(baseline=base, baseline_drafts={"candidate": "released"}))
    assert o.status == "fail" and o.measured == pytest.approx(0.8, rel=0.05)
    assert "relative to baseline" in o.message and "CI" in o.message
    (o,) = evaluate([rule], cand, Settings(baseline=base, baseline_drafts={"candidate": "released"},
                                           baseline_mismatch="torch: '2.x' vs '2.y'"))
    assert o.status == "inconclusive" and "the baseline cannot be compared: torch" in o.message
    better = run({"candidate": 2.5}, noise=0.05, seed=3)
    (o,) = evaluate([rule], better, Settings(baseline=base, baseline_drafts={"candidate": "released"}))
    assert o.status == "pass" and "consider refreshing it" in o.message
    # a lax threshold cleared by a candidate worse than the baseline is no improvement (a new user's finding: 0.956x
    # of the baseline read "a large improvement over the baseline")
    lax = rule.model_copy(update={"threshold": "0.5x"})
    (o,) = evaluate([lax], cand, Settings(baseline=base, baseline_drafts={"candidate": "released"}))
    assert o.status == "pass" and o.measured == pytest.approx(0.8, rel=0.05) and "refreshing" not in o.message


def test_a_baseline_comparison_of_a_time_holds_the_fallbacks_change_between_the_runs():
    """The candidate run's machine is 20% slower for every runner (the fallback too): the
    draft's TTFT over the baseline's reads 1.2x, but the fallback moved as much, so a 1.1x
    ceiling is not failed on the machine's drift: the interval holds both readings. Where
    the fallback did not move, the comparison stands as measured. A speedup (a ratio to the
    run's own fallback already) is not widened."""
    base = run({"d": 1.5}, noise=0.05, seed=1)
    rule = RuleSpec(id="ttft-vs-release", metric="e2el_ms", aggregation="mean", relative_to="baseline",
                    comparison="<=", threshold="1.1x")
    settings = Settings(baseline=base)
    slower = run({"d": 1.5}, noise=0.05, seed=1)  # the same prompts and noise as the baseline's, 20% slower
    for r in slower.requests:
        r.e2el_ms *= 1.2
    (o,) = evaluate([rule], slower, settings)
    assert o.status == "inconclusive" and o.interval.low < 1.1 < o.interval.high, o.message
    assert "by the fallback's change between the runs (1.200x-1.200x)" in o.message and "widened from 1.2" in o.message
    same = run({"d": 1.5}, noise=0.05, seed=1)  # nothing moved
    slow_draft = run({"d": 1.5 / 1.2}, noise=0.05, seed=1)  # the draft alone slower, the fallback as in the baseline
    (o,) = evaluate([rule], slow_draft, settings)
    assert o.status == "fail", o.message
    (o,) = evaluate([rule], same, settings)
    assert o.status == "pass" and "fallback's change between the runs (1.000x-1.000x)" in o.message, o.message
    (o,) = evaluate([RuleSpec(**dict(SPEEDUP, relative_to="baseline", threshold="0.9x"))], slower, settings)
    assert "between the runs" not in o.message


def test_compare_reports_regressions_improvements_and_environment_mismatch(tmp_path):
    base_m = run({"bf16": 1.5, "int8": 1.3}, noise=0.05, seed=1, overlap=0.9)
    cand_m = run({"bf16": 1.5, "int8": 1.0}, noise=0.05, seed=2, overlap=0.9)
    base = make_report("b.yaml", {}, base_m, [], summarize(base_m), 0)
    cand = make_report("c.yaml", {}, cand_m, [], summarize(cand_m), 0)
    result = compare(base, cand, tolerance=0.05)
    rows = {(r.draft, r.figure): r for r in result.comparisons}
    assert rows[("int8", "speedup")].verdict == "regressed" and rows[("int8", "speedup")].ratio == pytest.approx(1 / 1.3, rel=0.05)
    assert rows[("bf16", "speedup")].verdict in ("unchanged", "inconclusive")
    assert {"overlap", "overlap[qa]", "overlap[code]", "mean_acceptance_length"} <= {f for d, f in rows if d == "bf16"}
    assert result.exit_code == 1
    other = make_report("c.yaml", {}, run({"int8": 1.0}, torch="2.y"), [], [], 0)
    mismatch = compare(base, other)
    assert mismatch.environment_differences == ["torch: '2.x' vs '2.y'"]
    assert all(r.verdict in ("inconclusive", "missing") for r in mismatch.comparisons if not r.figure.startswith("memory"))
    # the CLI: tables, JSON, exit code
    from gate.report.json import JsonReport

    JsonReport().write(base, tmp_path / "b.json")
    JsonReport().write(cand, tmp_path / "c.json")
    result = CliRunner().invoke(cli, ["compare", str(tmp_path / "b.json"), str(tmp_path / "c.json"), "--json", str(tmp_path / "cmp.json")])
    assert result.exit_code == 1 and "regressed" in result.output
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert any(c["verdict"] == "regressed" and c["draft"] == "int8" for c in doc["comparisons"])
    renamed = CliRunner().invoke(cli, ["compare", str(tmp_path / "b.json"), str(tmp_path / "c.json"), "--draft", "int8=bf16"])
    assert "int8 (was bf16)" in renamed.output
    bad = CliRunner().invoke(cli, ["compare", str(tmp_path / "b.json"), str(tmp_path / "c.json"), "--draft", "int8"])
    assert bad.exit_code == 2 and "CANDIDATE=BASE" in bad.output


def test_interleave_false_runs_each_runner_in_one_block():
    from gate.core.law import Law
    from gate.core.requests import PlannedPrompt
    from gate.plan.matrix import plan_requests

    prompts = [PlannedPrompt("a", "x", (1, 2)), PlannedPrompt("b", "x", (3,))]
    law = Law("greedy", 0.0, None, None)
    interleaved = [r.draft for r in plan_requests(["d"], [law], prompts, [4], 2, 0)]
    blocks = [r.draft for r in plan_requests(["d"], [law], prompts, [4], 2, 0, interleave=False)]
    assert interleaved[:4] == ["fallback", "d", "fallback", "d"]
    assert blocks == ["fallback"] * 4 + ["d"] * 4


def test_category_breakdown_pools_and_sums_to_the_totals_and_rules_bind_per_category():
    m = run({"d": 1.3}, n=12, noise=0.1)
    # make one category slow: the "code" prompts (even) run at 0.7x
    for r in m.requests:
        if r.draft == "d" and r.category == "code":
            r.e2el_ms *= 1.3 / 0.7
            r.token_times_ms = [t * 1.3 / 0.7 for t in r.token_times_ms]
    (row,) = [r for r in summarize(m) if r.runner == "d"]
    assert set(row.by_category) == {"qa", "code"}
    assert sum(b.requests for b in row.by_category.values()) == row.requests
    assert sum(b.output_tokens for b in row.by_category.values()) == row.output_tokens
    assert sum(b.num_accepted_tokens for b in row.by_category.values()) == sum(r.counters.num_accepted_tokens for r in m.requests)
    assert row.by_category["code"].speedup == pytest.approx(0.7, rel=0.1) and row.by_category["qa"].speedup == pytest.approx(1.3, rel=0.1)
    assert row.by_category["code"].slower_than_fallback == pytest.approx(1.0) and row.slower_than_fallback == pytest.approx(0.5)
    rule = RuleSpec(id="no-slow-category", metric="speedup", aggregation="pooled", comparison=">=", threshold="0.95x", per="category")
    out = {o.scope: o.status for o in evaluate([rule], m)}
    assert out == {"d/greedy/category=code": "fail", "d/greedy/category=qa": "pass"}
    decile = RuleSpec(id="slowest-decile", metric="request_speedup", aggregation="p10", comparison=">=", threshold="0.95x")
    (o,) = evaluate([decile], m)
    assert o.status in ("fail", "inconclusive") and "below 0.950" in o.message  # half the requests are at 0.7x
    from gate.rules.scope import parse_scope

    assert parse_scope("d/greedy/category=code").categories == ("code",)
    assert parse_scope("d/greedy/context_length=1024").context_length == 1024


def test_compare_refuses_unknown_mappings_and_names_workload_differences(tmp_path):
    from gate.core.errors import InputError

    base_m, cand_m = run({"bf16": 1.5}, seed=1), run({"bf16": 1.5}, n=6, seed=2)
    base = make_report("b.yaml", {}, base_m, [], summarize(base_m), 0)
    cand = make_report("c.yaml", {}, cand_m, [], summarize(cand_m), 0)
    with pytest.raises(InputError, match="nosuch"):
        compare(base, cand, drafts={"bf16": "nosuch"})
    result = compare(base, cand)  # 12 prompts against 6: not the same workload
    assert any(d.startswith("prompts differ") and "p11" in d for d in result.environment_differences)
    assert result.exit_code == 3 and all(r.verdict in ("inconclusive", "missing") for r in result.comparisons
                                         if not r.figure.startswith("memory"))


def test_a_request_speedup_rule_sees_a_failed_fallback_request():
    """request_speedup compares each request with the fallback's, as speedup does: a failed
    fallback request leaves a hole in both (it was read as `metric == "speedup"` only, so
    request_speedup was decided on what was left)."""
    from gate.records import Failure, FailureStage

    m = run({"d": 1.3}, n=12, noise=0.05)
    m.failures.append(Failure(FailureStage.REQUEST, "fallback", "greedy", "request p3", "HTTP 500"))
    for metric, aggregation in (("speedup", "pooled"), ("request_speedup", "p10")):
        rule = RuleSpec(id="r", metric=metric, aggregation=aggregation, comparison=">=", threshold="0.9x")
        (o,) = evaluate([rule], m, Settings(resamples=200))
        assert o.status == "error" and "fallback: request p3: HTTP 500" in o.message, (metric, o.message)
