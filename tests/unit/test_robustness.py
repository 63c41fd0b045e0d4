"""Issue 10, items 5-7: interrupts and cancellation, small wrong results and gaps, YAML
alias amplification. Each test first reproduced the problem the issue describes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import write_policy
from gate.cli import cli
from gate.core.errors import InputError
from gate.policy.reader import load_policy

REPO = Path(__file__).resolve().parents[2]
LOOKUP = "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n"


def one_problem(error: InputError):  # type: ignore[no-untyped-def]
    assert len(error.problems) == 1, error.problems
    return error.problems[0]


# --- 7. YAML alias amplification -------------------------------------------------------

BOMB = """version: 1
a: &a ["x","x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_a_billion_laughs_policy_is_refused_quickly_at_the_alias_line(tmp_path: Path) -> None:
    policy = write_policy(tmp_path, BOMB)
    start = time.monotonic()
    with pytest.raises(InputError) as info:
        load_policy(policy)
    assert time.monotonic() - start < 2.0  # hung past 30 s before (10^9 nodes walked)
    problem = one_problem(info.value)
    assert problem.file == str(policy)
    assert problem.line == 5  # the first alias that crosses the bound (c's tree holds 111 nodes, 10 of them: 1,110)
    assert "aliases expand to more than 10,000 YAML nodes" in problem.message
    result = CliRunner().invoke(cli, ["validate", str(policy)])
    assert result.exit_code == 2
    assert f"{policy}:5:" in result.output and "Traceback" not in result.output


def test_an_alias_inside_its_own_anchor_names_its_line(tmp_path: Path) -> None:
    policy = write_policy(tmp_path, "version: 1\ndrafts: &d\n  x: *d\n")
    with pytest.raises(InputError) as info:
        load_policy(policy)
    problem = one_problem(info.value)
    assert problem.line == 3 and "refers to its own anchor" in problem.message


# --- 6. thresholds, aggregations, "did you mean" ----------------------------------------


def test_p95_is_an_aggregation() -> None:
    import numpy as np

    from gate.rules.confidence import QUANTILES
    from gate.rules.samples import aggregate

    values = [float(v) for v in range(101)]
    assert aggregate(values, "p95") == pytest.approx(float(np.percentile(values, 95)))
    assert QUANTILES["p95"] == 0.95


def test_a_synonym_is_suggested_before_the_nearest_spelling() -> None:
    """'p50' is the median, not 'p95' (a new user's finding: "did you mean 'p95'?")."""
    from gate.policy.reader import _close

    known = ["mean", "median", "p10", "p90", "p95", "p99", "min", "max", "pooled"]
    assert _close("p50", known) == "median" and _close("avg", known) == "mean" and _close("p98", known) == "p99"


# --- a small gate check run, shared: p95, JUnit times, progress lines, explain, compare --


def test_progress_lines_come_at_phase_changes_and_at_most_every_interval() -> None:
    from gate.cli import ProgressLines

    now = [0.0]
    out: list[str] = []
    p = ProgressLines(out.append, interval=10.0, clock=lambda: now[0])
    for i in range(100):  # 100 requests, one a second
        now[0] = float(i)
        p("requests", i, 100)
    now[0] = 100.0
    p("requests", 100, 100)
    p("requests", 100, 100)  # the end reported twice: one line
    p("overlap", 0, 4)
    assert out[0] == "gate: requests 0/100 (0%), 0s"
    assert out[1] == "gate: requests 10/100 (10%), 10s"
    assert out[-2] == "gate: requests 100/100 (100%), 1m40s"
    assert out[-1] == "gate: overlap 0/4 (0%), 1m40s"
    assert len(out) == 12  # 0, 10, ..., 90, the end, the next phase


# --- 6. model sources: a missing tokenizer, gate bill on a .gguf ------------------------


def test_make_example_prints_gates_exit_code_and_the_readme_says_what_make_returns() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("\nexample:"):makefile.index("\ntest:")]
    assert 'echo "gate exit code: $$code"; exit $$code' in recipe
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "`gate exit code: N`" in readme and "make itself then exits 2" in readme


# --- 5. interrupts and cancellation ---------------------------------------------------


