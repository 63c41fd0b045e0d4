"""`gate compare` accounts for every draft: paired by --draft, by name, or as the only draft of
each report; a draft left without a partner is named and, unless allowed, makes the exit
code 3. Exit codes follow gate check's (inconclusive: 3 by default) and a summary line closes
the output."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gate.cli import cli
from gate.commands.compare import compare, pair_drafts
from gate.core.errors import InputError
from gate.report.document import make_report
from gate.report.json import JsonReport
from gate.analysis.summary import summarize
from unit.test_verdicts import run


def report(speedups: dict[str, float], **kw):  # type: ignore[no-untyped-def]
    m = run(speedups, **kw)
    return make_report("p.yaml", {}, m, [], summarize(m), 0)


def test_drafts_pair_by_mapping_then_name_then_as_the_only_ones():
    assert pair_drafts(["released"], ["released", "int8"], {}) == ([("released", "released", "by name")], ["candidate int8"])
    assert pair_drafts(["released"], ["released", "int8"], {"int8": "released"}) == (
        [("int8", "released", "--draft"), ("released", "released", "by name")], [])
    assert pair_drafts(["bf16"], ["int8"], {}) == ([("int8", "bf16", "the only draft of each report")], [])
    assert pair_drafts(["a", "b"], ["c"], {}) == ([], ["candidate c", "baseline a", "baseline b"])
    with pytest.raises(InputError) as info:
        pair_drafts(["released"], ["int8"], {"int8": "relased"})
    text = str(info.value)
    assert "did you mean 'released'?" in text and "(document)" not in text and text.startswith("--draft: int8=relased")


def test_a_new_draft_without_a_partner_is_named_and_not_decided():
    """The issue's run: the candidate report holds released and int8 (whose speedup halved),
    the baseline only released. Before, int8 was never mentioned and the exit code was 0."""
    base = report({"released": 1.5}, noise=0.01, seed=1)
    cand = report({"released": 1.5, "int8": 0.75}, noise=0.01, seed=1)
    result = compare(base, cand)
    assert result.unmatched == ["candidate int8"] and result.exit_code == 3
    assert {c.draft for c in result.comparisons} == {"released"}
    assert result.summary().endswith("; unmatched: candidate int8; exit code 3")
    allowed = compare(base, cand, allow_unmatched=True)
    assert allowed.exit_code == 0 and "unmatched (allowed): candidate int8" in allowed.summary()
    paired = compare(base, cand, drafts={"int8": "released"})
    assert paired.unmatched == [] and paired.exit_code == 1  # int8's speedup against released: 0.5x, regressed
    assert any(c.draft == "int8" and c.figure == "speedup" and c.verdict == "regressed" for c in paired.comparisons)
    reverse = compare(cand, base)  # the arguments the other way round: the baseline's int8 has no partner
    assert reverse.unmatched == ["baseline int8"] and reverse.exit_code == 3


def test_inconclusive_figures_exit_3_as_gate_check_unless_told_otherwise():
    base = report({"d": 1.5}, noise=0.3, seed=1, n=6)
    cand = report({"d": 1.5}, noise=0.3, seed=2, n=6)
    result = compare(base, cand)
    assert any(c.verdict == "inconclusive" for c in result.comparisons)
    assert not any(c.verdict == "regressed" for c in result.comparisons)
    assert result.exit_code == 3
    assert compare(base, cand, inconclusive="fail").exit_code == 1
    assert compare(base, cand, inconclusive="warn").exit_code == 0


def test_the_cli_names_the_unmatched_draft_and_closes_with_a_summary(tmp_path: Path) -> None:
    JsonReport().write(report({"released": 1.5}, noise=0.01, seed=1), tmp_path / "released.json")
    JsonReport().write(report({"released": 1.5, "int8": 0.75}, noise=0.01, seed=1), tmp_path / "new.json")
    args = ["compare", str(tmp_path / "released.json"), str(tmp_path / "new.json")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 3, result.output
    assert ("unmatched: the candidate draft int8 has no partner in the other report (pair it with --draft int8=BASE, or "
            "pass --allow-unmatched)") in result.output
    assert "paired: released=released (by name)" in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("gate compare: ") and last.endswith("; unmatched: candidate int8; exit code 3")
    assert CliRunner().invoke(cli, [*args, "--allow-unmatched"]).exit_code == 0
    mapped = CliRunner().invoke(cli, [*args, "--draft", "int8=released"])
    assert mapped.exit_code == 1 and "regressed" in mapped.output.strip().splitlines()[-1]
    typo = CliRunner().invoke(cli, [*args, "--draft", "int8=relased"])
    assert typo.exit_code == 2
    assert "gate: error: --draft: int8=relased: the baseline report has no draft 'relased' (did you mean 'released'?)" \
        in typo.output


def test_a_draft_that_did_not_speculate_is_not_compared_nor_shown_as_real():
    from gate.records import SpeculationRecord, SpeculationStatus
    from gate.report.console import ConsoleReport

    base = report({"lookup": 1.5}, noise=0.01, seed=1)
    cand = report({"lookup": 1.0}, noise=0.01, seed=1)
    cand.measurements.speculation = [SpeculationRecord("lookup", "greedy", SpeculationStatus.OFF, 12, 48, 0, 12, "rule",
                                                       "per-request counts")]
    result = compare(base, cand)
    rows = {c.figure: c for c in result.comparisons}
    assert rows["speedup"].verdict == "inconclusive" and rows["speedup"].note.startswith(
        "did not speculate in the candidate run")
    assert rows["overlap"].verdict != "inconclusive" or "did not speculate" not in rows["overlap"].note  # not speculative
    assert result.exit_code == 3
    assert "lookup (did not speculate)" in ConsoleReport().render(cand)
