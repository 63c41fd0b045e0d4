"""The tests of tests/unit/test_wall_budget.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from conftest import stub_policy, tiny_policy, write_policy
from gate.cli import cli
from served_stub import Stub
from unit.test_wall_budget import LOOKUP


def served_policy(model_dir: Path, prompts: Path, fallback: str, draft: str, budget: str, concurrency: int,
                  timeout_s: float) -> str:
    return stub_policy(model_dir, prompts, fallback, draft, timeout_s=timeout_s, load=f"{{concurrency: [{concurrency}]}}",
                       measurement=f"repetitions: 2, warmup_requests: 0, max_cpu_stall: null, max_wall_s: '{budget}'")

def timed_check(tmp_path: Path, text: str) -> tuple[int, dict[str, Any], ET.Element, str, float]:
    path = write_policy(tmp_path, text)
    t0 = time.monotonic()
    result = CliRunner().invoke(cli, ["check", str(path), "--json", str(tmp_path / "out.json"), "--junit",
                                      str(tmp_path / "out.xml"), "--markdown", str(tmp_path / "out.md"), "--no-progress"])
    wall = time.monotonic() - t0
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    report = json.loads((tmp_path / "out.json").read_text())
    return result.exit_code, report, ET.parse(tmp_path / "out.xml").getroot(), result.output, wall


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_served_run_against_a_slow_server_ends_within_its_budget(tmp_path: Path, tiny_model_dir: Path,
                                                                    prompts_file: Path, concurrency: int) -> None:
    # 2.45 s per request: 5 prompts x 2 repetitions x 2 runners = 20 requests, 49 s at concurrency 1 without a budget
    budget_s, timeout_s = 2.0, 5.0
    with Stub(ttft_s=0.05, itl_s=0.2) as fallback, Stub(ttft_s=0.05, itl_s=0.2) as draft:
        code, report, junit, out, wall = timed_check(tmp_path, served_policy(
            tiny_model_dir, prompts_file, fallback.url, draft.url, "2 s", concurrency, timeout_s))
    # the bound the field documents: the budget plus one request's time limit, plus the reports (generous margin)
    assert wall < budget_s + timeout_s + 15.0, wall
    assert code == 3, out  # measurements missing: not an interrupt's 143
    assert report["exit_code"] == 3
    m = report["measurements"]
    n = len(m["requests"])
    assert 1 <= n < 20
    missing = [f for f in m["failures"] if f["stage"] == "request"]
    assert missing and {f["message"] for f in missing} == {
        f"not measured: measurement.max_wall_s (2 s) ran out after {n} of 20 requests"}
    assert sum(int(f["what"].split()[0]) for f in missing) == 20 - n  # every request not measured is named
    assert all(f"at concurrency {concurrency}" in f["what"] and f["concurrency"] == concurrency for f in missing)
    assert any(f["stage"] == "exactness" and f["message"] == "not measured: measurement.max_wall_s (2 s) ran out during "
               "the requests, before the served exactness pass" for f in m["failures"])
    (note,) = [x for x in report["notes"] if "max_wall_s" in x]
    assert note.startswith("measurement.max_wall_s (2 s) ran out during the requests, ") and \
        f"({n} of 20 requests measured)" in note
    assert not any("interrupted" in x for x in report["notes"])
    assert all(o["status"] == "error" for o in report["outcomes"])  # each rule lacks some of its requests
    assert int(junit.get("errors")) > 0
    assert "max_wall_s (2 s) ran out" in (tmp_path / "out.md").read_text()


def test_an_in_process_run_stops_measuring_when_its_budget_runs_out(tmp_path: Path, tiny_model_dir: Path,
                                                                    prompts_file: Path) -> None:
    # 5 prompts x 2 runners x 40 repetitions x 32 tokens: far longer than the budget
    text = tiny_policy(tiny_model_dir, prompts_file, drafts=LOOKUP, max_new_tokens=32)
    text += ("measurement:\n  sequential: false\n  repetitions: 40\n  warmup_requests: 0\n  max_cpu_stall: null\n"
             "  max_wall_s: 3 s\n")
    code, report, junit, out, wall = timed_check(tmp_path, text)
    assert wall < 3.0 + 15.0, wall
    assert code == 3, out
    m = report["measurements"]
    n = len(m["requests"])
    assert 1 <= n < 400
    missing = [f for f in m["failures"] if f["stage"] == "request"]
    assert {f["message"] for f in missing} == {f"not measured: measurement.max_wall_s (3 s) ran out after {n} of 400 requests"}
    assert {f["draft"] for f in missing} == {"fallback", "lookup"}
    assert sum(int(f["what"].split()[0]) for f in missing) == 400 - n
    assert any(f["stage"] == "overlap" and "before the overlap pass" in f["message"] for f in m["failures"])
    assert m["bills"]  # made from the loaded weights all the same
    assert any(x.startswith("measurement.max_wall_s (3 s) ran out during the requests") and f"({n} of 400 requests "
               "measured)" in x for x in report["notes"])
    assert int(junit.get("errors")) > 0


def test_a_budget_that_does_not_run_out_changes_nothing(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    text = tiny_policy(tiny_model_dir, prompts_file, drafts=LOOKUP, max_new_tokens=6)
    text += "measurement:\n  warmup_requests: 0\n  max_cpu_stall: null\n  max_wall_s: 20 min\n"
    code, report, _, out, _ = timed_check(tmp_path, text)
    assert code == 0, out
    assert len(report["measurements"]["requests"]) == 10 and not report["measurements"]["failures"]
    assert not any("max_wall_s" in x for x in report["notes"])
    assert report["policy"]["measurement"]["max_wall_s"] == "20 min"


@pytest.mark.parametrize("value", ["0 s", "-5 min", "2 GiB", "soon", "30", True])
def test_max_wall_s_refuses_what_is_not_a_positive_time(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path,
                                                         value: Any) -> None:
    shown = json.dumps(value) if not isinstance(value, str) else f"'{value}'"
    text = tiny_policy(tiny_model_dir, prompts_file, drafts=LOOKUP) + f"measurement:\n  max_wall_s: {shown}\n"
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, text))])
    assert result.exit_code == 2, result.output
    assert "measurement.max_wall_s" in result.output
