"""The tests of tests/unit/test_speculation.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

from pathlib import Path


from conftest import stub_policy
from served_stub import Stub
from integration.test_served_check import check
from unit.test_speculation import LOOKUP, RULES


# --- end to end on stub servers (tests/served_stub.py) ---------------------------------------


def test_a_draft_endpoint_that_is_the_plain_server_decides_nothing(tmp_path: Path, tiny_model_dir: Path,
                                                                    prompts_file: Path) -> None:
    """The lookup runner's URL points at the same plain server as the fallback (no speculation,
    no draft_n in its responses): speedup ~1.0x would pass >= 0.9x and greedy exactness would
    pass; both are errors naming the cause, and the run exits 3."""
    with Stub(cycle=3) as plain:
        code, report, out = check(tmp_path, stub_policy(tiny_model_dir, prompts_file, plain.url, plain.url,
                                                         draft_name="lookup", draft_spec=LOOKUP, rules=RULES))
    assert code == 3, out
    records = report["measurements"]["speculation"]
    assert {(s["concurrency"], s["status"]) for s in records} == {(1, "off"), (2, "off")}
    outcomes = [o for o in report["outcomes"] if o["draft"] == "lookup"]
    assert {o["rule_id"] for o in outcomes} == {"speedup", "exact"}
    for o in outcomes:
        assert o["status"] == "error" and o["message"].startswith("speculation did not run: draft lookup made 0 draft "
                                                                  "tokens (per-request counts)"), o["message"]
    assert any(n.startswith("speculation did not run") for n in report["notes"])


def test_a_lookup_draft_with_nothing_to_copy_keeps_its_verdicts(tmp_path: Path, tiny_model_dir: Path,
                                                                prompts_file: Path) -> None:
    """Outputs with no repeated n-gram (10, 11, 12, ...): a lookup that proposed nothing found
    nothing to copy; its speedup is measured as it ran (pass), with the reason in the message."""
    with Stub(ttft_s=0.02, itl_s=0.006) as fallback, Stub(ttft_s=0.02, itl_s=0.004) as lookup:
        code, report, out = check(tmp_path, stub_policy(tiny_model_dir, prompts_file, fallback.url, lookup.url,
                                                         draft_name="lookup", draft_spec=LOOKUP, rules=RULES))
    records = report["measurements"]["speculation"]
    assert {s["status"] for s in records} == {"nothing_to_propose"} and all(s["floor_steps"] == 0 for s in records)
    speedups = [o for o in report["outcomes"] if o["rule_id"] == "speedup"]
    assert len(speedups) == 2 and all(o["status"] == "pass" and "nothing to propose: draft lookup" in o["message"]
                                      for o in speedups), out
    assert code == 0, out


def test_validate_warns_where_speculation_cannot_be_checked(tmp_path: Path, tiny_model_dir: Path,
                                                           prompts_file: Path) -> None:
    from click.testing import CliRunner

    from conftest import write_policy
    from gate.cli import cli

    same = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:18080", "http://127.0.0.1:18080/",
                       draft_name="lookup", draft_spec=LOOKUP, rules=RULES)
    out = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, same))]).output
    assert "runner.endpoints.lookup.base_url: draft 'lookup' is served at the fallback's own URL" in out, out
    uncounted = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:18080", "http://127.0.0.1:18081",
                            draft_name="lookup", draft_spec=LOOKUP, rules=RULES).replace(
        "lookup: {base_url: 'http://127.0.0.1:18081', api: llama_cpp}", "lookup: {base_url: 'http://127.0.0.1:18081'}")
    out = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, uncounted))]).output
    assert "gate cannot count the proposals of draft 'lookup' (api 'completions' returns no per-response draft" in out, out
    counted = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:18080", "http://127.0.0.1:18081",
                          draft_name="lookup", draft_spec=LOOKUP, rules=RULES)
    out = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, counted))]).output
    assert "runner.endpoints" not in out, out
