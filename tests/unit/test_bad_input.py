"""Bad input: one clear message naming the file, the YAML path and the line; exit code 2;
never a traceback. Each case is checked twice: through `gate validate` / `gate check`
(click's CliRunner) and through the Python API (InputError.problems)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import write_policy
from gate.cli import cli
from gate.core.errors import InputError, Problem
from gate.policy import load_policy

MEMORY_RULE = "  - id: memory\n    metric: memory_bill_bytes\n    aggregation: max\n    comparison: '<='\n    threshold: {}\n"


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the nth line of `text` that contains `needle`."""
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(hits) >= nth, f"{needle!r} not in the policy {nth} time(s)"
    return hits[nth - 1]


def one_problem(exc: InputError) -> Problem:
    assert len(exc.problems) == 1, "expected exactly one problem, got:\n" + str(exc)
    return exc.problems[0]


def assert_cli_error(args: list[str], policy: Path, yaml_path: str, line: int | None, *words: str) -> str:
    """The command exits 2 with one 'gate: error:' line naming file, YAML path and line."""
    result = CliRunner().invoke(cli, args)
    out = result.output
    assert result.exit_code == 2, out
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out
    assert out.count("gate: error:") == 1, out
    assert len(out.strip().splitlines()) == 1, out
    assert str(policy) in out
    where = f"policy.yaml:{line}: " if line is not None else "policy.yaml: "
    assert f"{where}{yaml_path or '(document)'}: " in out, out
    for word in words:
        assert word in out, (word, out)
    return out


def assert_bad_policy(policy: Path, yaml_path: str, line: int | None, *words: str, loader=load_policy,
                      tmp_path: Path | None = None) -> Problem:
    """One problem from `loader` (file, path, line, message), the same through `gate validate`
    and `gate check` (which writes no report for an invalid policy)."""
    with pytest.raises(InputError) as info:
        loader(policy)
    problem = one_problem(info.value)
    assert problem.file == str(policy)
    assert problem.path == yaml_path
    assert problem.line == line
    for word in words:
        assert word in problem.message, (word, problem.message)
    assert info.value.exit_code == 2
    assert_cli_error(["validate", str(policy)], policy, yaml_path, line, *words)
    if tmp_path is not None:
        junit, report = tmp_path / "junit.xml", tmp_path / "report.json"
        assert_cli_error(["check", str(policy), "--no-warmup", "--no-progress", "--junit", str(junit), "--json", str(report)],
                         policy, yaml_path, line, *words)
        assert not junit.exists() and not report.exists()
    return problem


# --- malformed YAML -----------------------------------------------------------------------


# --- unknown keys, types, units ------------------------------------------------------------


# --- files the policy names ------------------------------------------------------------------


def test_missing_policy_file(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    problem = assert_bad_policy(policy, "", None, "policy file not found", tmp_path=tmp_path)
    assert str(problem) == f"{policy}: (document): policy file not found"


def test_file_names_are_printed_as_written(tmp_path: Path) -> None:
    policy = tmp_path / ":cat:" / "policy.yaml"
    result = CliRunner().invoke(cli, ["validate", str(policy)])
    assert result.exit_code == 2
    assert f"gate: error: {policy}: (document): policy file not found" in result.output


@pytest.mark.parametrize("value, words", [
    ('"3"', ["expected a number, got '3'"]),
    ("true", ["expected a number, got True"]),
    (".nan", ["finite number", "nan"]),
    ("1.0e+400", ["finite number", "inf"]),
    ("1e400", ["expected a number, got '1e400'"]),  # YAML 1.1 reads it as a string
])
def test_a_value_that_is_not_a_number_where_one_is_due_is_one_clear_error(tmp_path, value, words):
    """Strict policy values: no string or boolean coerced to a number, no NaN or infinity."""
    text = ("version: 1\ntarget: {model: m}\ndrafts:\n  d: {kind: prompt_lookup}\n"
            f"measurement:\n  repetitions: 2\n  confidence: {value}\n"
            "rules:\n  - {id: s, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 0.9x}\n")
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "measurement.confidence", line_of(text, "confidence:"), *words)
    int_text = text.replace(f"confidence: {value}", "confidence: 0.9").replace("repetitions: 2", f"repetitions: {value}")
    policy = write_policy(tmp_path, int_text)
    with pytest.raises(InputError) as info:
        load_policy(policy)
    assert one_problem(info.value).path == "measurement.repetitions"
    drafts_text = text.replace(f"confidence: {value}", "confidence: 0.9").replace(
        "{kind: prompt_lookup}", f"{{kind: prompt_lookup, num_draft_tokens: {value}}}")
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, drafts_text))
    assert one_problem(info.value).path == "drafts.d.num_draft_tokens"


@pytest.mark.parametrize("value, words", [
    ("0", ["expected auto or an integer from 1 to 1,024, got 0"]),
    ('"2"', ["got '2'"]),
    ("true", ["got True"]),
    ("2.5", ["got 2.5"]),
    ("AUTO", ["got 'AUTO' (write it as auto: lower case, no spaces)"]),
    ('"auto "', ["no spaces"]),
])
def test_a_key_that_takes_auto_or_a_count_says_so_in_one_error(tmp_path, value, words):
    """measurement.threads and rules[].next_token_samples take auto or an integer: a bad value is
    one error naming both (not one error per alternative of the union)."""
    text = ("version: 1\ntarget: {model: m}\ndrafts:\n  d: {kind: prompt_lookup}\n"
            f"measurement:\n  threads: {value}\n"
            "rules:\n  - {id: e, kind: exactness}\n")
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, text))
    problem = one_problem(info.value)
    assert problem.path == "measurement.threads" and all(w in problem.message for w in words), problem.message
    if value == "0":
        return  # no next-token test: a valid next_token_samples
    samples = text.replace(f"threads: {value}", "threads: auto").replace(
        "kind: exactness}", f"kind: exactness, next_token_samples: {value}}}")
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, samples))
    problem = one_problem(info.value)
    assert problem.path == "rules[0].next_token_samples" and "expected auto or an integer from 0 to 1,000,000" in problem.message
