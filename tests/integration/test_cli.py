"""The tests of tests/unit/test_cli.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from conftest import tiny_policy, write_policy
from gate.cli import cli
from unit.test_cli import one_thread  # noqa: F401 - shared with that tier
from unit.test_cli import DRAFTS, ITL_IMPOSSIBLE, NAME, OVERLAP_HIGH, TTFT_OK

# Two quick drafts: prompt lookup and the first layer of the target.
# Rules that pass on the tiny models (tiny_policy adds overlap-floor >= 0 and mean ITL <= 10 s).


@dataclass
class Run:
    exit_code: int
    output: str
    report: dict[str, Any]
    junit: ET.ElementTree

    def outcomes(self, rule: str) -> dict[str, dict[str, Any]]:
        """draft -> outcome of `rule` (one law in these policies)."""
        return {o["draft"]: o for o in self.report["outcomes"] if o["rule_id"] == rule}

    def cases(self) -> dict[str, ET.Element]:
        return {c.get("name"): c for c in self.junit.iter("testcase")}


@pytest.fixture(scope="module")
def report_schema() -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["schema", "--report"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.output)
    Draft202012Validator.check_schema(schema)
    return schema


def gate_check(folder: Path, policy_text: str, *options: str, report_schema: dict[str, Any]) -> Run:
    """Run `gate check` through click; the reports must be written, parse and validate."""
    folder.mkdir(parents=True, exist_ok=True)
    policy = write_policy(folder, policy_text)
    junit, report = folder / "junit.xml", folder / "report.json"
    result = CliRunner().invoke(cli, ["check", str(policy), "--junit", str(junit), "--json", str(report),
                                      "--no-progress", "--no-warmup", *options])
    assert result.exception is None or isinstance(result.exception, SystemExit), (repr(result.exception), result.output)
    assert "Traceback" not in result.output
    assert junit.is_file() and report.is_file(), result.output
    doc = json.loads(report.read_text())
    errors = sorted(Draft202012Validator(report_schema).iter_errors(doc), key=str)
    assert not errors, "\n".join(e.message for e in errors[:5])
    assert doc["exit_code"] == result.exit_code
    assert f"exit code {result.exit_code}" in result.output
    tree = ET.parse(junit)
    names = [c.get("name") for c in tree.iter("testcase") if c.get("classname") != "gate.measurement"]
    assert names == [f"{o['rule_id']}[{o['scope']}]" for o in doc["outcomes"]]
    for name in names:
        assert NAME.match(name), name
    return Run(result.exit_code, result.output, doc, tree)


def policy(tiny_model_dir: Path, prompts_file: Path, extra_rules: str = "") -> str:
    # These tests check exit codes: a violated latency ceiling must fail even when the test
    # machine is busy (a contended one would make it inconclusive; see test_contention.py), and
    # an overlap of 0.68 over 5 continuations fails a 0.99 floor at the fixed plan's 95% (a
    # sequential look's 98.75% leaves 5 continuations inconclusive; see test_sequential.py).
    return (tiny_policy(tiny_model_dir, prompts_file, extra_rules=extra_rules, drafts=DRAFTS, max_new_tokens=8)
            + "measurement:\n  max_cpu_stall: null\n  sequential: false\n")


@pytest.fixture(scope="module")
def warn_and_off(tmp_path_factory, tiny_model_dir: Path, prompts_file: Path) -> str:
    """Passing error-level rules, a violated warn-level rule and a rule that is off."""
    return policy(tiny_model_dir, prompts_file,
                  TTFT_OK + ITL_IMPOSSIBLE.format(level="warn") + OVERLAP_HIGH + "    level: off\n")


@pytest.fixture(scope="module")
def warn_run(tmp_path_factory, warn_and_off: str, report_schema: dict[str, Any]) -> Run:
    return gate_check(tmp_path_factory.mktemp("warn"), warn_and_off, report_schema=report_schema)


def test_exit_0_when_every_error_level_rule_passes(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path,
                                                    report_schema: dict[str, Any]) -> None:
    run = gate_check(tmp_path, policy(tiny_model_dir, prompts_file, TTFT_OK), report_schema=report_schema)
    assert run.exit_code == 0, run.output
    assert run.report["status_counts"] == {"pass": 6}
    assert set(run.cases()) == {f"{rule}[{draft}/greedy]" for rule in ("overlap-floor", "itl", "ttft")
                                for draft in ("lookup", "exit1")}
    for case in run.cases().values():
        assert case.find("failure") is None and case.find("error") is None and case.find("skipped") is None
    suite = run.junit.getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "gate" and suite.get("failures") == "0"
    for o in run.report["outcomes"]:
        assert o["status"] == "pass" and "measured" in o["message"] and o["samples"] > 0


def test_exit_1_when_an_error_level_rule_fails(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path,
                                               report_schema: dict[str, Any]) -> None:
    text = policy(tiny_model_dir, prompts_file, OVERLAP_HIGH + ITL_IMPOSSIBLE.format(level="error"))
    run = gate_check(tmp_path, text, report_schema=report_schema)
    assert run.exit_code == 1, run.output
    assert run.outcomes("overlap-high")["exit1"]["status"] == "fail"
    assert {d: o["status"] for d, o in run.outcomes("itl-tight").items()} == {"lookup": "fail", "exit1": "fail"}
    assert {d: o["status"] for d, o in run.outcomes("overlap-floor").items()} == {"lookup": "pass", "exit1": "pass"}
    cases = run.cases()
    for name in ("overlap-high[exit1/greedy]", "itl-tight[lookup/greedy]", "itl-tight[exit1/greedy]"):
        failure = cases[name].find("failure")
        assert failure is not None, name
        message = failure.get("message") or ""
        assert "measured" in message and "threshold" in message, message
    assert cases["overlap-floor[exit1/greedy]"].find("failure") is None
    suite = run.junit.getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "3"


def test_a_violated_warn_rule_alone_exits_0_with_status_warn(warn_run: Run) -> None:
    assert warn_run.exit_code == 0, warn_run.output
    assert {d: o["status"] for d, o in warn_run.outcomes("itl-tight").items()} == {"lookup": "warn", "exit1": "warn"}
    assert warn_run.report["status_counts"]["warn"] == 2
    assert "fail" not in warn_run.report["status_counts"]
    skipped = warn_run.cases()["itl-tight[exit1/greedy]"].find("skipped")
    assert skipped is not None and "warning" in (skipped.get("message") or "")


def test_fail_on_warn_turns_a_violated_warn_rule_into_exit_1(tmp_path: Path, warn_and_off: str,
                                                             report_schema: dict[str, Any]) -> None:
    run = gate_check(tmp_path, warn_and_off, "--fail-on-warn", report_schema=report_schema)
    assert run.exit_code == 1, run.output
    assert {d: o["status"] for d, o in run.outcomes("itl-tight").items()} == {"lookup": "warn", "exit1": "warn"}


def test_level_off_is_skipped(warn_run: Run) -> None:
    outcome = warn_run.outcomes("overlap-high")["exit1"]
    assert outcome["status"] == "skipped" and outcome["measured"] is None
    assert warn_run.report["status_counts"]["skipped"] == 1
    case = warn_run.cases()["overlap-high[exit1/greedy]"]
    assert case.find("skipped") is not None and case.find("failure") is None


def test_exit_3_when_a_measurement_could_not_be_made(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path,
                                                     report_schema: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from gate.runners.transformers import TransformersRunner

    generate = TransformersRunner._generate

    def broken_for_exit1(self, prompt_ids, draft, *args, **kwargs):  # type: ignore[no-untyped-def]
        if draft is not None and draft.name == "exit1":
            raise RuntimeError("simulated device failure")
        return generate(self, prompt_ids, draft, *args, **kwargs)

    monkeypatch.setattr(TransformersRunner, "_generate", broken_for_exit1)
    # Request metrics only: every rule of exit1 needs the requests that failed.
    text = tiny_policy(tiny_model_dir, prompts_file, extra_rules=TTFT_OK, drafts=DRAFTS, max_new_tokens=8)
    text = text.replace("  - id: overlap-floor\n    metric: overlap\n    aggregation: mean\n    comparison: '>='\n    threshold: 0.0\n", "")
    run = gate_check(tmp_path, text, report_schema=report_schema)
    assert run.exit_code == 3, run.output
    for rule in ("itl", "ttft"):
        outcomes = run.outcomes(rule)
        assert outcomes["exit1"]["status"] == "error", outcomes["exit1"]
        assert "simulated device failure" in outcomes["exit1"]["message"]
        assert outcomes["lookup"]["status"] == "pass", outcomes["lookup"]  # the other draft was still measured
    failures = run.report["measurements"]["failures"]
    assert failures and {(f["stage"], f["draft"]) for f in failures} == {("request", "exit1")}
    assert {r["draft"] for r in run.report["measurements"]["requests"]} == {"fallback", "lookup"}
    cases = run.cases()
    error = cases["itl[exit1/greedy]"].find("error")
    assert error is not None and "simulated device failure" in (error.get("message") or "")
    assert cases["itl[lookup/greedy]"].find("error") is None and cases["itl[lookup/greedy]"].find("failure") is None


def test_exit_3_with_reports_when_the_failure_escapes_a_request(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path,
                                                                  report_schema: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """With the warm-up on, the failing draft fails before any timed request: still exit 3,
    both reports, and that draft's rules are errors (not a crash, not a pass)."""
    from gate.runners.transformers import TransformersRunner

    generate = TransformersRunner._generate

    def broken_for_exit1(self, prompt_ids, draft, *args, **kwargs):  # type: ignore[no-untyped-def]
        if draft is not None and draft.name == "exit1":
            raise RuntimeError("simulated device failure")
        return generate(self, prompt_ids, draft, *args, **kwargs)

    monkeypatch.setattr(TransformersRunner, "_generate", broken_for_exit1)
    folder = tmp_path
    policy_file = write_policy(folder, policy(tiny_model_dir, prompts_file, TTFT_OK))
    junit, report = folder / "junit.xml", folder / "report.json"
    result = CliRunner().invoke(cli, ["check", str(policy_file), "--junit", str(junit), "--json", str(report), "--no-progress"])
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    doc = json.loads(report.read_text())
    assert not list(Draft202012Validator(report_schema).iter_errors(doc))
    # rules on the timed requests are errors; overlap is teacher-forced, measured apart, and stands
    outcomes = [o for o in doc["outcomes"] if o["draft"] == "exit1"]
    assert {o["status"] for o in outcomes if o["metric"] != "overlap"} == {"error"}
    assert {o["status"] for o in outcomes if o["metric"] == "overlap"} <= {"pass", "fail"}
    assert any("simulated device failure" in f["message"] for f in doc["measurements"]["failures"])
    assert any(f["what"] == "warm-up" and f["draft"] == "exit1" for f in doc["measurements"]["failures"])
    errors = [c for c in ET.parse(junit).iter("testcase") if c.find("error") is not None]
    assert any(c.get("name") == "itl[exit1/greedy]" for c in errors)


