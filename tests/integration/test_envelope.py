"""The tests of tests/unit/test_envelope.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import stub_policy, write_policy
from gate.cli import cli
from served_stub import Stub
from unit.test_envelope import RULES, SEARCH


# -- through gate check, on stub servers of a known capacity -----------------------------------

# Each stub generates at most 4 requests at once (the others wait, FIFO); a request takes
# 20 ms + 11 x 5 ms = 75 ms, so at concurrency 5 one request in five waits ~75 ms for a slot.


def run_search(tmp_path: Path, model: Path, prompts: Path, ttft: str) -> dict:
    with Stub(ttft_s=0.02, itl_s=0.005, slots=4) as fallback, Stub(ttft_s=0.02, itl_s=0.005, slots=4, draft_n=8, draft_n_accepted=4) as draft:
        text = stub_policy(model, prompts, fallback.url, draft.url, load=SEARCH % ttft, rules=RULES)
        out = tmp_path / "out.json"
        result = CliRunner().invoke(cli, ["check", str(write_policy(tmp_path, text)), "--json", str(out),
                                          "--markdown", str(tmp_path / "out.md"), "--html", str(tmp_path / "out.html"),
                                          "--no-progress"])
        assert fallback.max_in_flight > 4 and draft.max_in_flight > 4  # the probes went past the capacity (the rest waited)
    assert "Traceback" not in result.output, result.output
    assert out.exists(), (result.output, result.exception)
    return json.loads(out.read_text())


@pytest.mark.parametrize("ttft,stop", [("60 ms", "slo"), ("10 s", "saturation")])
def test_gate_check_finds_a_servers_known_capacity(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path,
                                                   ttft: str, stop: str) -> None:
    """A TTFT ceiling of 60 ms breaks at concurrency 5 (one request in five waits for a slot);
    with a 10 s ceiling nothing breaks, and the throughput stops rising past 4 slots."""
    report = run_search(tmp_path, tiny_model_dir, prompts_file, ttft)
    found = {e["runner"]: e for e in report["measurements"]["envelopes"]}
    assert set(found) == {"fallback", "fast"}
    for e in found.values():
        assert (e["lower"], e["upper"], e["stop"]) == (4, 5, stop), [(p["load"], p["verdict"], p["why"]) for p in e["probes"]]
        assert [p["load"] for p in e["probes"]][:4] == [1, 2, 4, 8]
        assert all(p["requests"] >= 4 * p["load"] for p in e["probes"])
    probes = report["measurements"]["probe_requests"]
    assert len(probes) == sum(p["requests"] for e in found.values() for p in e["probes"])
    requests = report["measurements"]["requests"]  # the load point's requests only: each prompt once per runner
    assert all(r["concurrency"] == 1 for r in requests) and len(requests) == 2 * len({r["prompt_id"] for r in requests})
    status = {o["rule_id"]: o["status"] for o in report["outcomes"]}
    assert status == {"sustains": "pass", "beyond": "fail", "as-fallback": "pass"}, report["outcomes"]
    md = (tmp_path / "out.md").read_text()
    assert "### Envelope search" in md and "concurrency [4, 5)" in md
    html = (tmp_path / "out.html").read_text()
    assert '<section id="envelope-search">' in html and 'data-plot="throughput-vs-interactivity"' in html
    # every probe is a point of throughput against per-user speed (the stub's TPOT is 5 ms: ~200 tokens/s per user)
    pts = report["interactivity"]
    assert len([p for p in pts if p["where"].startswith("search")]) == sum(len(e["probes"]) for e in found.values())
    assert all(150 < p["per_user_tokens_s"] < 210 for p in pts) and any(p["pareto"] for p in pts)
    (eq,) = report["equal_interactivity"]  # 50 tokens/s per user lies outside what was measured: never extrapolated
    assert eq["gain"] is None and "not compared" in eq["message"]


def test_an_envelope_rule_needs_a_search(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    text = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:9", rules=RULES)
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, text))])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "rules[0].kind" in result.output and "needs load.search" in result.output
    bad = stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:9",
                      load="{concurrency: [1], search: {start: 8, max: 4}}", rules=RULES)
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, bad, "bad.yaml"))])
    assert result.exit_code == 2 and "load.search" in result.output and "above max" in result.output


# -- throughput at equal interactivity (gate.analysis.interactivity) -------------------------------


def test_an_envelope_rules_threshold_is_a_load_or_a_ratio_and_it_takes_no_aggregate(
        tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    load = "{concurrency: [1], search: {start: 1, max: 16}}"
    cases = [("threshold: 50%", "rules[0].threshold", "a bare number of requests in flight"),
             ("threshold: 4 tokens/s", "rules[0].threshold", "a bare number of requests in flight"),
             ("threshold: 100", "rules[0].threshold", "above load.search.max (16)"),
             ("threshold: 2 requests/s, relative_to: fallback", "rules[0].threshold", "a ratio of SLO loads"),
             ("threshold: 4, aggregation: p99", "rules[0].aggregation", "takes no aggregation"),
             ("threshold: 4, confidence: 0.99", "rules[0].confidence", "takes no confidence"),
             ("threshold: 4, scope: {concurrency: [1]}", "rules[0].scope", "scope it by drafts and laws")]
    for i, (fields, where, message) in enumerate(cases):
        rules = f"  - {{id: r, kind: envelope, comparison: '>=', {fields}}}\n"
        path = write_policy(tmp_path, stub_policy(tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:9",
                                                  load=load, rules=rules), f"p{i}.yaml")
        result = CliRunner().invoke(cli, ["validate", str(path)])
        assert result.exit_code == 2 and where in result.output and message in result.output, (fields, result.output)
    rate = "{request_rate: [1], search: {over: request_rate, start: 0.5, max: .inf}}"
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, stub_policy(
        tiny_model_dir, prompts_file, "http://127.0.0.1:9", "http://127.0.0.1:9", load=rate, rules=RULES), "inf.yaml"))])
    assert result.exit_code == 2 and "load.search.max" in result.output and "finite" in result.output


def test_a_rate_search_finds_the_knee_near_a_servers_known_capacity(tmp_path: Path, tiny_model_dir: Path,
                                                                    prompts_file: Path) -> None:
    """4 slots of 20 ms + 11 x 5 ms = 75 ms each: about 53 requests/s. Below it the sojourn of
    a probe's requests stays level; above it each waits longer than the one before."""
    load = ("{request_rate: [2], goodput: {ttft: 10 s}, search: {over: request_rate, start: 16, max: 128, "
            "requests_per_load: 1, tolerance: 0.3}}")
    with Stub(ttft_s=0.02, itl_s=0.005, slots=4) as fallback, Stub(ttft_s=0.02, itl_s=0.005, slots=4) as draft:
        text = stub_policy(tiny_model_dir, prompts_file, fallback.url, draft.url, load=load,
                           rules="  - {id: sustains, kind: envelope, comparison: '>=', threshold: 20}\n")
        out = tmp_path / "out.json"
        result = CliRunner().invoke(cli, ["check", str(write_policy(tmp_path, text)), "--json", str(out), "--no-progress"])
    assert out.exists(), result.output
    for e in json.loads(out.read_text())["measurements"]["envelopes"]:
        probes = [(p["load"], p["verdict"], p["why"]) for p in e["probes"]]
        # the knee within the search's resolution (tolerance 0.3) of the capacity: a rate a few % above it
        # queues too slowly to show within a probe of about one second
        assert e["stop"] == "saturation" and 32 <= e["lower"] < e["upper"] <= 64 and e["upper"] / e["lower"] <= 1.3, probes
        assert e["lower"] / 1.3 <= 53.3 <= e["upper"] * 1.3, probes
