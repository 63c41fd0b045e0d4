"""One reader for saved reports (gate.policy.saved): plain JSON or gzip (told by the magic bytes)
for gate explain, compare and report alike; a missing report names the file and the
command that writes one."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner
from unit.test_rules import measurements, rule

from gate.cli import cli
from gate.core.errors import InputError
from gate.report.document import make_report
from gate.report.json import JsonReport
from gate.rules.evaluate import evaluate, exit_code
from gate.analysis.summary import summarize
from gate.policy.saved import absent, read_data, read_report


@pytest.fixture
def saved(tmp_path):
    """A report written plainly (r.json) and the same bytes gzip-compressed (r.json.gz, and r.bin: no telling name)."""
    m = measurements()
    rules = [rule()]
    outcomes = evaluate(rules, m)
    report = make_report("policy.yaml", {"version": 1, "rules": [r.model_dump(mode="json") for r in rules]}, m, outcomes,
                         summarize(m), exit_code(outcomes, m))
    plain = tmp_path / "r.json"
    JsonReport().write(report, plain)
    for name in ("r.json.gz", "r.bin"):
        (tmp_path / name).write_bytes(gzip.compress(plain.read_bytes()))
    return tmp_path


def test_plain_and_gzip_read_the_same(saved):
    assert read_data(saved / "r.json.gz") == read_data(saved / "r.bin") == json.loads((saved / "r.json").read_text())
    assert read_report(saved / "r.bin").outcomes == read_report(saved / "r.json").outcomes


def test_explain_and_compare_read_gzip(saved):
    runner = CliRunner()
    plain = runner.invoke(cli, ["explain", str(saved / "r.json"), "r"])
    packed = runner.invoke(cli, ["explain", str(saved / "r.json.gz"), "r"])
    assert plain.exit_code == packed.exit_code == 0 and plain.output == packed.output and "r[bad/greedy]" in plain.output
    compared = runner.invoke(cli, ["compare", str(saved / "r.json"), str(saved / "r.bin")])
    assert "not a gate JSON report" not in compared.output and compared.exit_code in (0, 1, 3)


def test_a_missing_report_names_the_command_that_writes_one(tmp_path):
    missing = tmp_path / "base.json"
    assert absent(missing) == f"does not exist (gate check --json {missing} writes one)"
    assert absent(tmp_path) == "is a directory, not a report"
    with pytest.raises(InputError) as info:
        read_report(missing)
    assert str(info.value) == f"{missing}: (document): the report does not exist (gate check --json {missing} writes one)"
    for args in (["explain", str(missing), "r"], ["compare", str(missing), str(missing)], ["report", str(missing), "--markdown", str(tmp_path / "m.md")]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and f"gate check --json {missing} writes one" in result.output, args


def test_a_file_that_is_not_a_report_says_so(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_bytes(gzip.compress(b"{}"))
    with pytest.raises(InputError, match="not a gate JSON report .format 'gate-report/1' expected"):
        read_report(bad)
    bad.write_bytes(b"\x1f\x8bnot gzip")
    with pytest.raises(InputError, match="not a gate check JSON report: "):
        read_data(bad, "gate check")
