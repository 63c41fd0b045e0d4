"""The tests of tests/unit/test_messages.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from conftest import stub_policy, write_policy
from gate.cli import cli
from served_stub import Stub
from integration.test_served_check import check


def test_a_server_that_is_down_is_named_once_per_rule(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    rules = "  - {id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 0.5x}\n"
    with Stub(draft_n=8, draft_n_accepted=4) as up:
        code, report, out = check(tmp_path, stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", up.url,
                                                         rules=rules))
    (o,) = [o for o in report["outcomes"] if o["rule_id"] == "speedup"]
    assert code == 3 and o["status"] == "error"
    assert o["message"].count("connection refused") == 1, o["message"]
    assert "fallback: 10 measurements failed at concurrency 1, 2 (first: " in o["message"]


def test_the_reports_line_names_every_report_written(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    rules = "  - {id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 0.5x}\n"
    with Stub() as fallback, Stub(draft_n=8, draft_n_accepted=4) as draft:
        path = write_policy(tmp_path, stub_policy(tiny_model_dir, prompts_file, fallback.url, draft.url, rules=rules))
        files = [tmp_path / name for name in ("r.json", "j.xml", "s.md", "r.html")]
        result = CliRunner().invoke(cli, ["check", str(path), "--json", str(files[0]), "--junit", str(files[1]),
                                          "--markdown", str(files[2]), "--html", str(files[3]), "--no-progress"])
    assert f"reports: {' '.join(str(f) for f in files)}" in result.output
    assert all(f.is_file() for f in files)


def test_a_base_url_holding_the_api_path_is_refused_at_validate(tmp_path: Path, tiny_model_dir: Path,
                                                               prompts_file: Path) -> None:
    text = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:18081/v1")
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, text))])
    assert result.exit_code == 2
    assert ("runner.endpoints.fast.base_url: base_url 'http://127.0.0.1:18081/v1' ends in '/v1', an API path gate adds "
            "itself (api completions: <base_url>/v1/completions, api llama_cpp: <base_url>/completion): give the server "
            "root, 'http://127.0.0.1:18081'") in result.output
    for tail in ("/v1/completions", "/V1/", "/completion", "/v1/chat/completions"):  # whichever api the endpoint has
        bad = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", f"http://127.0.0.1:18081{tail}")
        assert CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, bad))]).exit_code == 2, tail
    prefixed = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:18081/llm")
    assert CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, prefixed))]).exit_code == 0  # a proxy's prefix


