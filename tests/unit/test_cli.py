"""`gate check` exit codes and reports on the tiny models, and `gate schema`.

0: every error-level rule passed; 1: a rule failed (or a warn-level one with
--fail-on-warn); 2: invalid policy, input or usage; 3: a measurement could not be made.
The JUnit file parses, the JSON report validates against `gate schema --report`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from gate.cli import cli

REPO = Path(__file__).resolve().parents[2]
# Two quick drafts: prompt lookup and the first layer of the target.
DRAFTS = (
    "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n"
    "  exit1:\n    kind: early_exit\n    num_layers: 1\n    num_draft_tokens: 2\n"
)
# Rules that pass on the tiny models (tiny_policy adds overlap-floor >= 0 and mean ITL <= 10 s).
TTFT_OK = "  - id: ttft\n    metric: ttft_ms\n    aggregation: mean\n    comparison: '<='\n    threshold: 10 s\n"
ITL_IMPOSSIBLE = "  - id: itl-tight\n    metric: itl_ms\n    aggregation: p99\n    comparison: '<='\n    threshold: 0.001 ms\n    level: {level}\n"
OVERLAP_HIGH = ("  - id: overlap-high\n    metric: overlap\n    aggregation: mean\n    comparison: '>='\n    threshold: 0.99\n"
                "    scope: {drafts: [exit1]}\n")
NAME = re.compile(r"^(?P<rule>[A-Za-z0-9][A-Za-z0-9_.\-]*)\[(?P<draft>[^/\[\]]+)/(?P<law>[^/\[\]]+)\]$")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny models gain nothing from intra-op threads, and on a busy machine the
    threads' spinning makes each small matmul milliseconds slower: run on one."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_unknown_option_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["check", str(tmp_path / "policy.yaml"), "--no-such-option"])
    assert result.exit_code == 2
    assert "No such option" in result.output and "Traceback" not in result.output


def test_missing_policy_file_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    junit, report = tmp_path / "junit.xml", tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["check", str(missing), "--junit", str(junit), "--json", str(report)])
    assert result.exit_code == 2
    assert f"{missing}: (document): policy file not found" in result.output
    assert "Traceback" not in result.output
    assert not junit.exists() and not report.exists()


def test_schema_matches_the_checked_in_file() -> None:
    result = CliRunner().invoke(cli, ["schema"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.output)
    Draft202012Validator.check_schema(schema)
    assert schema["title"] == "gate policy" and "drafts" in schema["properties"]
    checked_in = REPO / "schemas" / "policy.schema.json"
    if not checked_in.is_file():
        pytest.skip("schemas/policy.schema.json is not checked in yet")
    assert schema == json.loads(checked_in.read_text()), "regenerate it: gate schema > schemas/policy.schema.json"
