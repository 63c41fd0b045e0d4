"""`gate check` on served runners end to end, against the fault-injecting stub server
(tests/served_stub.py): every load point and runner measured, rules per concurrency, the
crossover, and the served path's faults as error outcomes with the reports written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import stub_policy, write_policy
from gate.cli import cli
from served_stub import Stub

LLAMA_CPP_METRICS = """\
# HELP llamacpp:spec_decode_num_drafts_total Number of speculative decoding drafts.
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 7
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 28
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 20
"""


def policy(model_dir: Path, prompts: Path, fallback: str, draft: str, draft_metrics: str | None = None,
           extra: str = "", max_cpu_stall: str = "null") -> str:
    """A served policy on two stub endpoints. Contention handling is off by default: these tests
    are about the served path, and a shared test machine would make timing verdicts inconclusive."""
    rules = ("  - {id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 1.0x, per: concurrency}\n"
             "  - {id: exact, kind: exactness}\n")
    return stub_policy(model_dir, prompts, fallback, draft, draft_metrics=draft_metrics, rules=rules, extra=extra,
                       measurement=f"repetitions: 1, warmup_requests: 1, max_cpu_stall: {max_cpu_stall}, max_client_lag_ms: null")


def check(tmp_path: Path, text: str) -> tuple[int, dict, str]:
    path = write_policy(tmp_path, text)
    out = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["check", str(path), "--json", str(out), "--junit", str(tmp_path / "j.xml"),
                                      "--no-progress"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, json.loads(out.read_text()), result.output


def test_a_faster_served_draft_passes_at_every_load_point_and_has_no_crossover(tmp_path, tiny_model_dir, prompts_file):
    with Stub(ttft_s=0.02, itl_s=0.012) as slow, Stub(ttft_s=0.02, itl_s=0.004, draft_n=9, draft_n_accepted=6) as fast:
        code, report, out = check(tmp_path, policy(tiny_model_dir, prompts_file, slow.url, fast.url))
    assert code == 0, out
    m = report["measurements"]
    # 2 runners x 2 load points x 1 repetition windows, each at its own load point
    assert sorted((w["runner"], w["load"]["concurrency"]) for w in m["runs"]) == [
        ("fallback", 1), ("fallback", 2), ("fast", 1), ("fast", 2)]
    assert {r["concurrency"] for r in m["requests"]} == {1, 2} and len(m["requests"]) == 2 * 2 * 5
    # each served request carries the machine's CPU pressure over its wall time (contention handling)
    assert all(r["cpu_stall_ms"] is not None for r in m["requests"]) or not Path("/proc/pressure/cpu").exists()
    speedups = {o["scope"]: o for o in report["outcomes"] if o["rule_id"] == "speedup"}
    assert set(speedups) == {"fast/greedy/concurrency=1", "fast/greedy/concurrency=2"}
    assert all(o["status"] == "pass" and o["measured"] > 1.5 for o in speedups.values())
    (exact,) = [o for o in report["outcomes"] if o["rule_id"] == "exact"]
    assert exact["status"] == "pass"
    rows = {(p["runner"], p["value"]): p for p in report["load"]}
    assert rows[("fast", 2.0)]["acceptance_rate"] == pytest.approx(6 / 9)  # the server's per-response counts
    assert rows[("fallback", 1.0)]["output_throughput"] > 0
    (crossover,) = report["crossovers"]
    assert crossover["at"] is None and "no crossover up to concurrency 2" in crossover["message"]


def test_served_greedy_divergences_within_the_fallbacks_own_deviation_cannot_be_decided(tmp_path, tiny_model_dir,
                                                                                         prompts_file):
    # The stub streams ids 10, 11, ... whatever the prompt: the fallback runner itself does not follow the local
    # target, so a draft runner that differs from it (an early EOS) cannot be told apart from numerics.
    with Stub() as good, Stub(draft_n=8, draft_n_accepted=4) as bad:  # a speculating server (llama.cpp's draft_n)
        bad.faults = {i: "eos" for i in range(50_000)}  # every output of the draft runner ends early with an EOS
        code, report, out = check(tmp_path, policy(tiny_model_dir, prompts_file, good.url, bad.url))
    (exact,) = [o for o in report["outcomes"] if o["rule_id"] == "exact"]
    (rec,) = report["measurements"]["exactness"]
    assert rec["numerical_tolerance"] > 0.01 and len(rec["divergences"]) == rec["compared"] >= 5, rec
    assert exact["status"] == "inconclusive" and code in (1, 3), out  # exit 3 unless the speedup rule failed (1)
    assert "cannot be decided" in exact["message"]


def test_a_draft_runner_whose_counters_do_not_move_had_speculation_off(tmp_path, tiny_model_dir, prompts_file):
    with Stub() as fallback, Stub(metrics_text=LLAMA_CPP_METRICS) as draft:
        code, report, out = check(tmp_path, policy(tiny_model_dir, prompts_file, fallback.url, draft.url,
                                                   draft_metrics=draft.url + "/metrics"))
    assert code == 3, out
    off = [s for s in report["measurements"]["speculation"] if s["status"] == "off"]
    assert sorted(s["concurrency"] for s in off) == [1, 2]
    assert all(s["draft_tokens"] == 0 and s["floor_steps"] >= 2 for s in off)  # no draft_n in a response: 0 proposals
    assert all(w["counters"]["num_draft_tokens"] == 0 for w in report["measurements"]["runs"] if w["runner"] == "fast")
    outcomes = [o for o in report["outcomes"] if o["draft"] == "fast"]
    assert outcomes and all(o["status"] == "error" and o["message"].startswith("speculation did not run: draft fast made 0 "
                                                                               "draft tokens") for o in outcomes)


def test_an_endpoint_that_is_down_is_an_error_naming_runner_and_load_point(tmp_path, tiny_model_dir, prompts_file):
    with Stub() as up:
        code, report, out = check(tmp_path, policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", up.url))
    assert code == 3
    failures = report["measurements"]["failures"]
    assert any(f["draft"] == "fallback" and "connection refused" in f["message"] and "concurrency 2" in f["what"]
               for f in failures)
    assert len(report["measurements"]["requests"]) == 10  # the draft runner's requests are kept


def test_validate_names_an_unset_api_key_variable(tmp_path, tiny_model_dir, prompts_file, monkeypatch):
    monkeypatch.delenv("GATE_TEST_KEY", raising=False)
    text = policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:9").replace(
        "  request_timeout_s: 5\n", "  request_timeout_s: 5\n  api_key_env: GATE_TEST_KEY\n")
    path = write_policy(tmp_path, text)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2 and "runner.api_key_env" in result.output and "GATE_TEST_KEY is not set" in result.output


def test_sample_requests_that_fail_are_a_failure_of_the_exactness_rule_never_a_sample(tmp_path, tiny_model_dir,
                                                                                      prompts_file):
    """Served exactness samples go through the loop as every timed request does (gate.loop.run
    _draw, between the same counter scrapes): a sample request that failed is counted in one
    Failure (stage exactness) per runner, law and load point, never kept as a sample, and the
    exactness rule of that runner errs; the fallback's samples are drawn all the same. An
    error is no verdict more samples settle: the sample looks (sequential, the default) stop
    after the first, 1/8 of the plan."""
    rules = "  - {id: exact, kind: exactness, next_token_samples: 60}\n"
    with Stub() as good, Stub(draft_n=8, draft_n_accepted=4) as bad:
        bad.fault_all = "http500"
        text = stub_policy(tiny_model_dir, prompts_file, good.url, bad.url, rules=rules, load="{concurrency: [1]}")
        code, report, out = check(tmp_path, text.replace("law: {temperature: 0}", "law: {temperature: 0.8}"))
    m = report["measurements"]
    assert code == 3, out
    assert {s["runner"] for s in m["samples"]} == {"fallback"} and len(m["samples"]) == 8
    (failed,) = [f for f in m["failures"] if f["stage"] == "exactness" and f["draft"] == "fast"]
    assert failed["what"] == "8 of 8 sample requests at concurrency 1" and "500" in failed["message"], failed
    (exact,) = [o for o in report["outcomes"] if o["rule_id"] == "exact"]
    assert exact["status"] == "error", exact["message"]
    assert m["sample_looks"]["taken"] == 1 and m["sample_looks"]["planned"]["fast/t0.8"] == 60
    assert any(n.startswith("served exactness samples of fallback under t0.8 (sample look 1 of 4)")
               and "8 requests" in n for n in m["notes"])


def test_a_served_sampled_exactness_rule_asking_no_next_token_test_is_refused(tmp_path, tiny_model_dir, prompts_file):
    """A served run tests sampled exactness by next-token tests only: next_token_samples 0 would
    test nothing, so gate validate refuses it at the rule's YAML path (auto or a number pass)."""
    rules = "  - {id: exact, kind: exactness, next_token_samples: 0}\n"
    text = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:9", rules=rules)
    sampled = write_policy(tmp_path, text.replace("law: {temperature: 0}", "law: {temperature: 0.8}"))
    result = CliRunner().invoke(cli, ["validate", str(sampled)])
    assert result.exit_code == 2 and "rules[0].next_token_samples" in result.output, result.output
    assert "use auto (gate chooses) or a number" in result.output and "Traceback" not in result.output
    for folder, edited in (("greedy", text),  # greedy: nothing sampled to test
                           ("auto", text.replace("next_token_samples: 0", "next_token_samples: auto")
                            .replace("law: {temperature: 0}", "law: {temperature: 0.8}"))):
        (tmp_path / folder).mkdir()
        assert CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path / folder, edited))]).exit_code == 0


def test_a_thread_count_on_a_served_runner_is_warned_to_set_nothing(tmp_path, tiny_model_dir, prompts_file):
    text = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:9",
                       measurement="repetitions: 1, warmup_requests: 0, max_cpu_stall: null, max_client_lag_ms: null, threads: 2")
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, text))])
    assert result.exit_code == 0 and "measurement.threads" in result.output, result.output
    assert "computes in its servers: threads sets nothing" in result.output


def test_the_sample_budget_caps_what_gate_may_choose_and_validate_says_so(tmp_path, tiny_model_dir, prompts_file):
    """measurement.budget.samples is the most next-token samples per prompt and runner gate may
    choose (next_token_samples auto; 4096 when auto): gate validate prints the most it may draw
    from it; below 100 it is one error at its YAML path."""
    rules = "  - {id: exact, kind: exactness}\n"
    text = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:9", rules=rules,
                       load="{concurrency: [1]}").replace("law: {temperature: 0}", "law: {temperature: 0.8}")
    default = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, text))])
    assert default.exit_code == 0 and "4096 per prompt" in default.output, default.output
    (tmp_path / "capped").mkdir()
    capped = text.replace("max_client_lag_ms: null", "max_client_lag_ms: null, budget: {samples: 300}")
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path / "capped", capped))])
    assert result.exit_code == 0 and "300 per prompt" in result.output and "4096" not in result.output, result.output
    (tmp_path / "low").mkdir()
    low = text.replace("max_client_lag_ms: null", "max_client_lag_ms: null, budget: {samples: 50}")
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path / "low", low))])
    assert result.exit_code == 2 and "measurement.budget.samples" in result.output and "Traceback" not in result.output
