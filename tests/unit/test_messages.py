"""What a user reads: greedy exactness verdicts in plain words, divergences placed by repetition
and load point in `gate explain`, one statement of a failed connection per rule, tables that
fit a CI log, the complete `reports:` line, and a base_url that already holds the API path."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from gate.cli import cli
from gate.policy.model import RuleSpec
from gate.records import Divergence, ExactnessRecord, Failure, FailureStage, Measurements, describe_failures
from gate.report.console import LOAD_COLUMNS, fit
from gate.exactness.verdict import evaluate_exactness


def _greedy(divergences: list[Divergence], control: float | None) -> str:
    m = Measurements(environment=None, laws=["greedy"])
    m.exactness = [ExactnessRecord("lookup", "greedy", True, compared=12, divergences=divergences,
                                   numerical_tolerance=control)]
    (o,) = evaluate_exactness(RuleSpec(id="exact", kind="exactness", tie_tolerance=0.01), m, ["lookup"], ["greedy"])
    return f"{o.status}|{o.message}"


def test_a_served_greedy_verdict_within_the_servers_numerics_says_so_plainly():
    near = [Divergence("mt_bench-137", 27, 5, 6, 0.8, repetition=1, concurrency=2),
            Divergence("mt_bench-137", 27, 5, 6, 0.02, repetition=0, concurrency=2),
            Divergence("mt_bench-101", 3, 7, 8, 0.004, repetition=0, concurrency=1)]
    status, message = _greedy(near, 2.39389).split("|")
    assert status == "inconclusive"
    assert message == (
        "exactness (greedy): 2 of 12 requests diverged from the fallback runner with tokens 0.02-0.8 logits below the "
        "local target's top (worst: mt_bench-137 repetition 1 at concurrency 2, output position 27, token 6 where the "
        "fallback runner's is 5, 0.8 logits below the target's top): beyond the rule's 0.01-logit tie tolerance, but "
        "within the 2.39 logits by which the fallback runner's own tokens stray from the local target (the server's "
        "dtype and kernels), so the server's numerics could explain them and this cannot be decided; a token more than "
        "2.39 logits below the top would fail; 1 near-tie(s) within the 0.01-logit tie tolerance (not faults): inconclusive")
    status, message = _greedy([Divergence("p", 3, 5, 6, 3.5, repetition=0, concurrency=1), *near], 2.39389).split("|")
    assert status == "fail" and message.startswith(
        "exactness (greedy): 1 of 12 requests committed tokens more than 2.39 logits below the target's top (worst: p "
        "repetition 0 at concurrency 1, output position 3, token 6 where the fallback runner's is 5, 3.5 logits below the "
        "target's top); 2 more diverged with tokens 0.02-0.8 logits below the top, within the 2.39 logits")
    assert "cannot be decided" not in message  # a failed verdict is decided
    status, message = _greedy([], None).split("|")
    assert (status, message) == ("pass", "exactness (greedy): every committed token of 12 requests matches the "
                                         "target's argmax: pass")
    status, message = _greedy([], 0.0).split("|")
    assert message.endswith("matches the fallback runner's output; the fallback runner's own tokens are the local "
                            "target's argmax throughout: pass")


def test_explain_places_each_divergence_by_repetition_and_load_point(tmp_path: Path) -> None:
    from gate.records import DraftInfo, Environment
    from gate.report.document import make_report
    from gate.report.explain import explain_rule

    m = Measurements(environment=Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0), laws=["greedy"],
                     drafts={"lookup": DraftInfo("prompt_lookup")})
    m.exactness = [ExactnessRecord("lookup", "greedy", True, compared=4, numerical_tolerance=1.0, divergences=[
        Divergence("mt_bench-137", 27, 5, 6, 0.5, repetition=0, concurrency=2),
        Divergence("mt_bench-137", 27, 5, 6, 0.5, repetition=1, concurrency=2)])]
    outcomes = evaluate_exactness(RuleSpec(id="exact", kind="exactness"), m, ["lookup"], ["greedy"])
    text = explain_rule(make_report("p.yaml", {"rules": [{"id": "exact", "kind": "exactness"}]}, m, outcomes, [], 3),
                        "exact", None, 5)
    rows = [line for line in text.splitlines() if line.startswith("  - prompt_id=mt_bench-137")]
    assert rows == [f"  - prompt_id=mt_bench-137, repetition={r}, concurrency=2, position=27, draft_token=6, "
                    "fallback_token=5, gap_logits=0.5, near_tie=False, within_server_numerics=True" for r in (0, 1)]


def test_one_cause_is_stated_once_with_where_it_struck():
    refused = "ServedError: runner 'fallback' at http://127.0.0.1:9/completion: connection refused at connect"
    failed = [Failure(FailureStage.REQUEST, "fallback", "greedy", f"request {i} at concurrency {c}", refused, c)
              for c in (1, 2) for i in "ab"] + [Failure(FailureStage.WARM_UP, "lookup", "greedy", "warm-up", "HTTP 500")]
    assert describe_failures(failed) == (f"fallback: 4 measurements failed at concurrency 1, 2 (first: request a at "
                                         f"concurrency 1: {refused}); lookup: warm-up: HTTP 500")


def test_a_table_too_wide_for_a_ci_log_is_split_with_its_key_columns_repeated():
    table = Table(title="At each load point")
    for col in LOAD_COLUMNS:
        table.add_column(col)
    for runner in ("fallback", "lookup"):
        table.add_row(runner, "greedy", "concurrency 16", *(f"{runner}-{i}-value" for i in range(len(LOAD_COLUMNS) - 3)))
    parts = fit(table, 160)
    assert len(parts) > 1
    console = Console(width=160, record=True, no_color=True, force_terminal=False)
    for part in parts:
        assert [str(c.header) for c in part.columns][:3] == ["runner", "law", "load"]
        console.print(part)
    text = console.export_text()
    assert "…" not in text and "fallback" in text and "concurrency 16" in text
    assert all(f"{runner}-{i}-value" in text for runner in ("fallback", "lookup") for i in range(len(LOAD_COLUMNS) - 3))
    assert parts[0].title == f"At each load point (1/{len(parts)})"
    narrow = Table()
    narrow.add_column("runner")
    narrow.add_column("req")
    assert fit(narrow, 160) == [narrow]


def test_report_paths_are_checked_before_anything_is_measured(tmp_path: Path) -> None:
    from gate.cli import check_report_paths

    import click
    import pytest

    with pytest.raises(click.UsageError, match="--junit .*same: --json writes the same file"):
        check_report_paths([("json", tmp_path / "same"), ("junit", tmp_path / "same")])
    (tmp_path / "file").write_text("x")
    with pytest.raises(click.UsageError, match="--junit .*cannot be written .*file is not a writable directory"):
        check_report_paths([("junit", tmp_path / "file" / "j.xml")])
    with pytest.raises(click.UsageError, match="--report toy= .*is a directory"):
        check_report_paths([("toy", tmp_path)])
    check_report_paths([("json", tmp_path / "new" / "r.json"), ("junit", tmp_path / "j.xml"), ("markdown", None)])
    # gate check refuses them before reading the policy's models or measuring anything
    result = CliRunner().invoke(cli, ["check", str(tmp_path / "policy.yaml"), "--json", str(tmp_path / "same"),
                                      "--junit", str(tmp_path / "same")])
    assert result.exit_code == 2 and "writes the same file" in result.output


def test_explain_names_the_scopes_of_a_rule_when_the_scope_is_unknown() -> None:
    import pytest

    from gate.records import Environment
    from gate.report.document import make_report
    from gate.report.explain import explain_rule

    m = Measurements(environment=Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0), laws=["greedy"])
    m.exactness = [ExactnessRecord("lookup", "greedy", True, compared=4)]
    outcomes = evaluate_exactness(RuleSpec(id="exact", kind="exactness"), m, ["lookup"], ["greedy"])
    report = make_report("p.yaml", {"rules": [{"id": "exact", "kind": "exactness"}]}, m, outcomes, [], 0)
    with pytest.raises(KeyError, match="in scope 'lookup/grdy' \\(did you mean 'lookup/greedy'\\?\\); its scopes: "
                                       "lookup/greedy"):
        explain_rule(report, "exact", "lookup/grdy", 5)
    with pytest.raises(KeyError, match="no outcome for rule 'exct' \\(did you mean 'exact'\\?\\); rules: exact"):
        explain_rule(report, "exct", None, 5)
