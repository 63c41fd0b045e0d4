"""The tests of tests/unit/test_contention.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import tiny_policy, write_policy
from gate.cli import cli
from gate.measure.contention import (Reading)
from unit.test_contention import env  # noqa: F401 - shared with that tier
from unit.test_contention import DRAFTS, RULES


def run_check(tmp_path: Path, model: Path, prompts: Path, measurement: str) -> dict:
    text = tiny_policy(model, prompts, RULES, drafts=DRAFTS, max_new_tokens=6) + measurement + "  sequential: false\n"
    policy = write_policy(tmp_path, text)
    CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml")])
    return json.loads((tmp_path / "r.json").read_text())


def test_check_records_cpu_time_and_pressure_per_request(tmp_path, tiny_model_dir, prompts_file) -> None:
    report = run_check(tmp_path, tiny_model_dir, prompts_file, "measurement:\n  warmup_requests: 0\n")
    requests = report["measurements"]["requests"]
    assert requests
    psi = Path("/proc/pressure/cpu").exists()
    for r in requests:
        assert r["cpu_time_ms"] is not None and r["cpu_time_ms"] >= 0
        assert r["threads"] is not None and r["threads"] >= 1
        assert (r["cpu_stall_ms"] is not None) == psi
        assert r["contention_reruns"] in (0, 1, 2)
    env = report["measurements"]["environment"]
    assert env["cpu_count"] >= 1 and env["threads"] >= 1
    assert env["cpu_pressure_source"] == ("/proc/pressure/cpu" if psi else "load average")
    assert env["cpu_stall_share"] is not None and 0.0 <= env["cpu_stall_share"] <= 1.0


class BusyProbe:
    """A probe that reports every request of the first `busy` windows as fully stalled."""

    calls = 0
    busy = 0

    def __init__(self, *_: object) -> None:
        self.available = True

    def start(self) -> None:
        return None

    def stop(self, _: object) -> Reading:
        BusyProbe.calls += 1
        stalled = BusyProbe.calls <= BusyProbe.busy
        return Reading(1.0, 1.0, 1e6 if stalled else 0.0, 1.0)


@pytest.mark.parametrize("busy, reruns, contended", [(2, 2, False), (10**6, 1, True)])
def test_contended_cells_are_rerun_then_left_out(tmp_path, tiny_model_dir, prompts_file, monkeypatch, busy, reruns,
                                                 contended) -> None:
    """The first two windows contended: the first cell (fallback, lookup) is rerun once and
    comes out clean. Always contended: every cell is rerun (until the machine is found busy
    for good) and the speedup verdict is inconclusive, naming the contention."""
    monkeypatch.setattr("gate.runners.transformers.Probe", BusyProbe)
    BusyProbe.calls, BusyProbe.busy = 0, busy
    # a loose time budget here: this test is about when reruns stop (the budget has its own tests below)
    report = run_check(tmp_path, tiny_model_dir, prompts_file, f"measurement:\n  warmup_requests: 0\n  "
                       f"contention_reruns: {reruns}\n  contention_rerun_budget: 10\n")
    requests = report["measurements"]["requests"]
    assert len(requests) == 10  # 5 prompts x (fallback, lookup): reruns replace, never add
    (o,) = [o for o in report["outcomes"] if o["rule_id"] == "speedup"]
    if not contended:
        assert [r["contention_reruns"] for r in requests] == [1, 1] + [0] * 8
        assert all(r["cpu_stall_ms"] == 0.0 for r in requests)
        assert o["status"] == "pass" and "contended" not in o["message"]
    else:
        assert [r["contention_reruns"] for r in requests] == [1] * 6 + [0] * 4  # 3 cells stuck: reruns stop
        assert o["status"] == "inconclusive"
        assert "machine contended: 100% of wall time without CPU on 5 of 5 paired requests" in o["message"]
        assert any(n.startswith("machine busy") and "10 of 10 requests contended" in n for n in report["notes"])
        assert ("contention reruns: the machine stayed busy across 3 consecutive cells: reruns cannot help, stopped "
                "rerunning after cell 3 of 5 (2 contended cell(s) after it not rerun); verdicts resting on contended "
                "requests are inconclusive") in report["notes"]
        assert report["measurements"]["notes"] == [n for n in report["notes"] if n.startswith("contention reruns")]
        explained = CliRunner().invoke(cli, ["explain", str(tmp_path / "r.json"), "speedup"])
        assert "lookup: 5 of 5 requests contended (over 10% of wall time without CPU; 100% of theirs pooled" in explained.output and "the most first" in explained.output, explained.output
    # overlap is measured whatever the machine did
    (ov,) = [o for o in report["outcomes"] if o["rule_id"] == "overlap-floor" and o["draft"] == "lookup"]
    assert ov["status"] != "inconclusive" or "contended" not in ov["message"]


