"""The tests of tests/unit/test_robustness.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from conftest import tiny_llama, tiny_policy, write_policy
from gate.cli import cli
from gate.core.errors import InputError
from gate.policy.reader import load_policy
from unit.test_robustness import one_problem  # noqa: F401 - shared with that tier
from unit.test_robustness import LOOKUP


# --- 7. YAML alias amplification -------------------------------------------------------


def test_ordinary_anchors_and_aliases_still_work(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    text = tiny_policy(tiny_model_dir, prompts_file, drafts=LOOKUP, max_new_tokens=4) + (
        "  - id: ttft\n    metric: ttft_ms\n    comparison: '<='\n    threshold: 10 s\n    scope: &only_lookup {drafts: [lookup]}\n"
        "  - id: tpot\n    metric: tpot_ms\n    comparison: '<='\n    threshold: 10 s\n    scope: *only_lookup\n"
        "  - id: e2el\n    metric: e2el_ms\n    comparison: '<='\n    threshold: 10 s\n    scope: *only_lookup\n")
    loaded = load_policy(write_policy(tmp_path, text))
    assert [r.scope.drafts for r in loaded.policy.rules[-3:]] == [["lookup"]] * 3


# --- 6. thresholds, aggregations, "did you mean" ----------------------------------------

def _rule_problem(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path, rule: str):  # type: ignore[no-untyped-def]
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, drafts=LOOKUP) + rule)
    with pytest.raises(InputError) as info:
        load_policy(policy)
    return one_problem(info.value)


def test_a_percentage_threshold_on_speedup_is_refused_with_the_ratio_to_write(tmp_path: Path, tiny_model_dir: Path,
                                                                               prompts_file: Path) -> None:
    problem = _rule_problem(tmp_path, tiny_model_dir, prompts_file, "  - id: sp\n    metric: speedup\n    aggregation: pooled\n"
                            "    comparison: '>='\n    threshold: 5%\n")
    assert problem.path == "rules[2].threshold"
    assert "'5%' is a percentage" in problem.message and "0.05x" in problem.message and "'1.05x'" in problem.message


def test_a_percentage_threshold_relative_to_the_fallback_is_refused(tmp_path: Path, tiny_model_dir: Path,
                                                                    prompts_file: Path) -> None:
    problem = _rule_problem(tmp_path, tiny_model_dir, prompts_file, "  - id: t\n    metric: ttft_ms\n    relative_to: fallback\n"
                            "    comparison: '<='\n    threshold: 110%\n")
    assert "percentage" in problem.message and "'1.1x'" in problem.message


def test_a_percentage_share_still_reads_as_a_share(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    text = tiny_policy(tiny_model_dir, prompts_file, drafts=LOOKUP) + (
        "  - id: ov\n    metric: overlap\n    comparison: '>='\n    threshold: 60%\n")
    assert load_policy(write_policy(tmp_path, text)).policy.rules[-1].threshold_value == pytest.approx(0.6)


def test_an_unknown_metric_gets_a_did_you_mean(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    problem = _rule_problem(tmp_path, tiny_model_dir, prompts_file, "  - id: x\n    metric: itl\n    aggregation: p99\n"
                            "    comparison: '<='\n    threshold: 50 ms\n")
    assert problem.path == "rules[2].metric"
    assert "did you mean 'itl_ms'?" in problem.message


# --- a small gate check run, shared: p95, JUnit times, progress lines, explain, compare --

@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir: Path, prompts_file: Path) -> dict[str, Any]:
    import torch

    folder = tmp_path_factory.mktemp("issue10-run")
    rules = ("  - id: itl95\n    metric: itl_ms\n    aggregation: p95\n    comparison: '<='\n    threshold: 10 s\n"
             "  - id: exact\n    kind: exactness\n"
             "  - id: memory\n    metric: memory_bill_bytes\n    aggregation: max\n    comparison: '<='\n    threshold: 1 GiB\n")
    text = tiny_policy(tiny_model_dir, prompts_file, extra_rules=rules, drafts=LOOKUP, max_new_tokens=8,
                       laws="  - temperature: 0\n  - temperature: 0.8\n")
    policy = write_policy(folder, text)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(cli, ["check", str(policy), "--junit", str(folder / "junit.xml"), "--json",
                                          str(folder / "report.json"), "--no-warmup"])
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code in (0, 3), result.output
    return {"folder": folder, "stderr": result.stderr, "report": json.loads((folder / "report.json").read_text()),
            "junit": ET.parse(folder / "junit.xml")}


def test_p95_rule_is_evaluated_and_decided_by_counting(run: dict[str, Any]) -> None:
    import numpy as np

    from gate.rules.confidence import QUANTILES, decide_exceedance, exceedance
    from gate.rules.resampling import UnitSet

    outcomes = [o for o in run["report"]["outcomes"] if o["rule_id"] == "itl95"]
    assert outcomes and all(o["aggregation"] == "p95" and o["message"].startswith("itl_ms (p95)") for o in outcomes)
    # 200 requests of 10 ITL samples: none above 10 ms passes a p95 <= 10 ms ceiling; 20% above fails it
    rng = np.random.default_rng(0)
    keys = [(f"p{i}", 8, 0) for i in range(200)]
    fast = UnitSet("p95", "request", keys, [rng.uniform(1, 9, 10) for _ in keys])
    slow = UnitSet("p95", "request", keys, [np.r_[rng.uniform(1, 9, 8), [20.0, 30.0]] for _ in keys])
    assert decide_exceedance(exceedance(fast, 10.0, "<=", QUANTILES["p95"], 0.95)) == "pass"
    ex = exceedance(slow, 10.0, "<=", QUANTILES["p95"], 0.95)
    assert ex.allowed == pytest.approx(0.05) and decide_exceedance(ex) == "fail"


def test_progress_lines_when_stderr_is_not_a_terminal(run: dict[str, Any]) -> None:
    lines = [x for x in run["stderr"].splitlines() if x.startswith("gate: ")]
    assert any(re.fullmatch(r"gate: loading models 0/1 \(0%\), \d+s", x) for x in lines), lines
    assert any(re.fullmatch(r"gate: requests \d+/\d+ \(100%\), (\d+m)?\d+s", x) for x in lines), lines
    assert any(x.startswith("gate: overlap ") for x in lines) and any(x.startswith("gate: exactness ") for x in lines)


def test_junit_cases_carry_the_time_of_their_requests(run: dict[str, Any]) -> None:
    report, tree = run["report"], run["junit"]
    cases = {c.get("name"): c for c in tree.iter("testcase")}
    total = sum(r["e2el_ms"] for r in report["measurements"]["requests"]) / 1e3
    suite = next(tree.iter("testsuite"))
    assert float(suite.get("time")) == pytest.approx(total, rel=1e-3) and total > 0
    assert float(tree.getroot().get("time")) == pytest.approx(total, rel=1e-3)
    itl = cases["itl[lookup/greedy]"]
    own = sum(r["e2el_ms"] for r in report["measurements"]["requests"] if r["draft"] == "lookup" and r["law"] == "greedy") / 1e3
    assert float(itl.get("time")) == pytest.approx(own, rel=1e-3) and own > 0
    assert cases["memory[lookup/greedy]"].get("time") is None  # rests on no timed request


def test_explain_prints_statistics_with_a_few_significant_digits(run: dict[str, Any]) -> None:
    from gate.report.explain import explain_rule
    from gate.policy.saved import read_report as load_report

    report = load_report(run["folder"] / "report.json")
    text = explain_rule(report, "exact", "lookup/t0.8", 5)
    tests = [line for line in text.splitlines() if line.startswith("  - name=")]
    assert tests, text
    for line in tests:
        assert "statistic=" in line and "pvalue=" in line
        assert not re.search(r"\d\.\d{6,}", line), line  # was: pvalue=0.7369551229098266


def test_compare_declares_every_verdict_inconclusive_when_not_comparable_bill_lines_included(run: dict[str, Any]) -> None:
    from gate.commands.compare import compare
    from gate.policy.saved import read_report as load_report

    base = load_report(run["folder"] / "report.json")
    cand = copy.deepcopy(base)
    cand.measurements.environment.torch = "0.0-other"
    for bill in cand.measurements.bills:
        for line in bill.lines:
            line.bytes = line.bytes // 2  # "improved" before
    result = compare(base, cand)
    assert result.environment_differences and result.exit_code == 3
    memory = [c for c in result.comparisons if c.figure.startswith("memory")]
    assert memory and all(c.verdict == "inconclusive" and c.note.startswith("not comparable") for c in memory)
    assert {c.verdict for c in result.comparisons} <= {"inconclusive", "missing"}


# --- 6. model sources: a missing tokenizer, gate bill on a .gguf ------------------------

def test_a_model_directory_without_a_tokenizer_says_so(tmp_path: Path, prompts_file: Path) -> None:
    bare = tmp_path / "no-tokenizer"
    tiny_llama(0).save_pretrained(bare)
    policy = write_policy(tmp_path, tiny_policy(bare, prompts_file, drafts=LOOKUP))
    result = CliRunner().invoke(cli, ["validate", str(policy)])
    assert result.exit_code == 2
    assert f"{bare} has no tokenizer" in result.output and "save_pretrained" in result.output
    assert "sentencepiece" not in result.output


# --- 5. interrupts and cancellation ---------------------------------------------------

def _signal_policy(folder: Path, tiny_model_dir: Path, prompts_file: Path, repetitions: int = 1) -> Path:
    text = tiny_policy(tiny_model_dir, prompts_file, drafts=LOOKUP, max_new_tokens=32)
    return write_policy(folder, text + f"measurement:\n  repetitions: {repetitions}\n")


def _check_interrupted(folder: Path, code: int, signame: str, partial: bool = True) -> dict[str, Any]:
    """The reports of an interrupted run: written, exit code as the process's, a note; a
    partial one has JUnit errors (its rules lack measurements)."""
    report = json.loads((folder / "report.json").read_text())
    assert report["exit_code"] == code
    assert any(f"interrupted by {signame}" in n for n in report["notes"]), report["notes"]
    tree = ET.parse(folder / "junit.xml")
    assert not partial or int(tree.getroot().get("errors")) > 0
    return report


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_real_signal_while_measuring_writes_the_reports_and_exits_128_plus_the_signal(
        tmp_path: Path, tiny_model_dir: Path, prompts_file: Path, signum: int, code: int) -> None:
    # 5 prompts x 2 runners x 40 repetitions x 32 tokens: far longer than it takes to interrupt it
    policy = _signal_policy(tmp_path, tiny_model_dir, prompts_file, repetitions=40)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gate", "check", str(policy), "--json", str(tmp_path / "report.json"),
                             "--junit", str(tmp_path / "junit.xml"), "--no-warmup"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stderr:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith("gate: requests "):
                break
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(seen) + err
    assert proc.returncode == code, (out, err)
    assert "Aborted!" not in err and "Traceback" not in err
    assert f"exit code {code}" in out
    report = _check_interrupted(tmp_path, code, signal.Signals(signum).name)
    assert report["outcomes"] and all(o["status"] == "error" for o in report["outcomes"])
    assert any(f["message"].startswith("interrupted") for f in report["measurements"]["failures"])


def test_ctrl_c_before_measuring_starts_writes_the_reports_and_exits_130(
        tmp_path: Path, tiny_model_dir: Path, prompts_file: Path, in_process_main, monkeypatch, capsys) -> None:
    import gate.commands.check

    def interrupted_while_loading(*_):  # type: ignore[no-untyped-def]
        os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT to this process, as Ctrl-C sends it
        time.sleep(30)  # never reached: the handler raises first
        raise AssertionError("the interrupt did not stop the run")

    monkeypatch.setattr(gate.commands.check, "open_session", interrupted_while_loading)
    policy = _signal_policy(tmp_path, tiny_model_dir, prompts_file)
    code = in_process_main("check", str(policy), "--json", str(tmp_path / "report.json"), "--junit", str(tmp_path / "junit.xml"))
    assert code == 130  # was: 1 with "Aborted!" (a failed rule's code) and no report
    err = capsys.readouterr().err
    assert "Aborted!" not in err
    report = _check_interrupted(tmp_path, 130, "SIGINT")
    assert any("before measuring started" in n for n in report["notes"])
    assert report["outcomes"] and all(o["status"] == "error" for o in report["outcomes"])


def test_sigterm_while_the_reports_are_made_writes_them_whole_and_exits_143(
        tmp_path: Path, tiny_model_dir: Path, prompts_file: Path, in_process_main, monkeypatch) -> None:
    import gate.commands.check

    real = gate.commands.check.summarize

    def summarize_then_sigterm(m):  # type: ignore[no-untyped-def]
        os.kill(os.getpid(), signal.SIGTERM)  # CI cancels the job while the verdicts are made
        return real(m)

    monkeypatch.setattr(gate.commands.check, "summarize", summarize_then_sigterm)
    policy = _signal_policy(tmp_path, tiny_model_dir, prompts_file)
    code = in_process_main("check", str(policy), "--json", str(tmp_path / "report.json"), "--junit", str(tmp_path / "junit.xml"),
                           "--no-warmup")
    assert code == 143
    report = _check_interrupted(tmp_path, 143, "SIGTERM", partial=False)
    assert any("after every measurement was made" in n for n in report["notes"])
    assert report["measurements"]["requests"] and not any(
        f["message"].startswith("interrupted") for f in report["measurements"]["failures"])
    assert {o["status"] for o in report["outcomes"]} != {"error"}  # the verdicts were made whole


def test_an_interrupt_in_any_other_command_exits_130_not_1(tmp_path: Path, in_process_main, monkeypatch, capsys) -> None:
    import gate.commands.check

    def interrupted(path):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(gate.commands.check, "validate", interrupted)
    assert in_process_main("validate", str(tmp_path / "policy.yaml")) == 130
    err = capsys.readouterr().err
    assert "interrupted by SIGINT" in err and "Aborted!" not in err
