"""Sharded runs (gate check --shard I/N) merged by gate merge give the verdicts of one run of
the same requests, and a merge refuses reports that are not the shards of one run."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from conftest import stub_policy, write_policy
from gate.cli import cli
from served_stub import Stub

RULES = """\
  - {id: ttft-ceiling, metric: ttft_ms, aggregation: median, comparison: '<=', threshold: 500 ms, per: concurrency}
  - {id: ttft-tight, metric: ttft_ms, aggregation: median, comparison: '<=', threshold: 5 ms, per: concurrency}
  - {id: e2el-p99, metric: e2el_ms, aggregation: p99, comparison: '<=', threshold: 10 s}
"""


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [*args])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


def statuses(path: Path) -> dict[str, str]:
    return {f"{o['rule_id']}[{o['scope']}]": o["status"] for o in json.loads(path.read_text())["outcomes"]}


def test_shards_merged_decide_as_one_run(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    with Stub(ttft_s=0.02, itl_s=0.005) as fallback, Stub(ttft_s=0.02, itl_s=0.005, draft_n=8, draft_n_accepted=4) as draft:
        policy = write_policy(tmp_path, stub_policy(tiny_model_dir, prompts_file, fallback.url, draft.url,
                                                    load="{concurrency: [1, 2, 4]}", rules=RULES,
                                                    measurement="repetitions: 2, warmup_requests: 0, max_cpu_stall: null, max_client_lag_ms: null, "
                                                                "sequential: false"))  # shards measure the fixed plan
        full, one, two = tmp_path / "full.json", tmp_path / "s1.json", tmp_path / "s2.json"
        code_full, _ = run("check", str(policy), "--json", str(full), "--junit", str(tmp_path / "full.xml"), "--no-progress")
        for i, out in ((1, one), (2, two)):
            code, output = run("check", str(policy), "--shard", f"{i}/2", "--json", str(out), "--junit",
                               str(tmp_path / f"s{i}.xml"), "--markdown", str(tmp_path / f"s{i}.md"), "--no-progress")
            assert code == 0, output  # a shard decides no rule: its exit code says its measurements were made
            heading = (tmp_path / f"s{i}.md").read_text().splitlines()[0]
            assert heading == f"## gate: shard {i}/2, measurements only, no verdict"  # never "passed"
        code, output = run("check", str(policy), "--shard", "4/4", "--json", str(tmp_path / "s4.json"), "--junit",
                           str(tmp_path / "s4.xml"), "--no-progress")
        assert code == 0 and "holds no (law, load point) cell" in output  # 3 cells, dealt to shards 1-3
    shard1, shard2 = json.loads(one.read_text()), json.loads(two.read_text())
    assert shard1["shard"] == "1/2" and shard2["shard"] == "2/2"
    assert shard1["outcomes"] == [] and any("no rule is decided in a shard" in n for n in shard1["notes"])
    # the (law, load point) cells dealt in turn: c=1 and c=4 in shard 1, c=2 in shard 2, every runner of a cell together
    assert {(r["draft"], r["concurrency"]) for r in shard1["measurements"]["requests"]} == {
        (d, c) for d in ("fallback", "fast") for c in (1, 4)}
    assert {(r["draft"], r["concurrency"]) for r in shard2["measurements"]["requests"]} == {("fallback", 2), ("fast", 2)}
    assert shard1["measurements"]["bills"] and not shard2["measurements"]["bills"]  # what is not split: shard 1
    merged = tmp_path / "merged.json"
    code, output = run("merge", str(policy), str(two), str(one), "--json", str(merged), "--junit", str(tmp_path / "merged.xml"))
    assert code == code_full == 1, output  # ttft-tight fails in both
    assert statuses(merged) == statuses(full)
    doc, whole = json.loads(merged.read_text()), json.loads(full.read_text())
    assert len(doc["measurements"]["requests"]) == len(whole["measurements"]["requests"]) == 2 * 3 * 2 * 5
    assert len(doc["measurements"]["runs"]) == len(whole["measurements"]["runs"])
    assert doc["merged_from"] == [str(two), str(one)] and doc["shard"] is None
    assert any(n.startswith("merged from 2 shards: 1/2") for n in doc["notes"])
    junit = (tmp_path / "merged.xml").read_text()
    assert junit.count("<testcase") == len(doc["outcomes"])


def test_a_merge_refuses_what_is_not_every_shard_of_one_run(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    with Stub(ttft_s=0.01, itl_s=0.002) as fallback, Stub(ttft_s=0.01, itl_s=0.002) as draft:
        policy = write_policy(tmp_path, stub_policy(tiny_model_dir, prompts_file, fallback.url, draft.url,
                                                    load="{concurrency: [1, 2]}", rules=RULES, max_new_tokens=4))
        one, full = tmp_path / "s1.json", tmp_path / "full.json"
        run("check", str(policy), "--shard", "1/2", "--json", str(one), "--junit", str(tmp_path / "s1.xml"), "--no-progress")
        run("check", str(policy), "--json", str(full), "--junit", str(tmp_path / "f.xml"), "--no-progress")
    code, output = run("merge", str(policy), str(one))
    assert code == 2 and "shard reports missing: 2/2" in output
    code, output = run("merge", str(policy), str(one), str(one))
    assert code == 2 and "shard 1/2 is given twice" in output
    code, output = run("merge", str(policy), str(full))
    assert code == 2 and "not a shard report" in output
    other = write_policy(tmp_path, policy.read_text().replace("max_new_tokens: 4", "max_new_tokens: 5"), "other.yaml")
    code, output = run("merge", str(other), str(one))
    assert code == 2 and "measured under another policy" in output and "workload" in output
    code, output = run("check", str(policy), "--shard", "3/2")
    assert code == 2 and "I must be between 1 and N" in output


def test_every_shard_checks_its_own_outputs_so_a_later_shards_divergence_is_in_the_merged_verdict(
    tmp_path: Path, tiny_model_dir: Path, prompts_file: Path
) -> None:
    """Greedy exactness is per request: each shard compares its own draft outputs with its own fallback
    outputs, and the merge joins the counts. A draft server that changes its output between shard 1
    (c=1) and shard 2 (c=2) fails the merged verdict; it once passed on shard 1's requests alone."""
    with Stub() as fallback, Stub(draft_n=8, draft_n_accepted=4) as draft:
        policy = write_policy(tmp_path, stub_policy(
            tiny_model_dir, prompts_file, fallback.url, draft.url, rules="  - {id: exact, kind: exactness}\n",
            measurement="repetitions: 1, warmup_requests: 0, max_cpu_stall: null, max_client_lag_ms: null, "
                        "sequential: false"))
        shards = []
        for i in (1, 2):
            if i == 2:
                draft.cycle = 3  # the draft's server answers other tokens from now on: shard 2's outputs diverge
            out = tmp_path / f"s{i}.json"
            code, output = run("check", str(policy), "--shard", f"{i}/2", "--json", str(out), "--no-progress")
            assert code == 0, output
            shards.append(out)
    merged = tmp_path / "merged.json"
    code, output = run("merge", str(policy), *map(str, shards), "--json", str(merged))
    doc = json.loads(merged.read_text())
    (record,) = [r for r in doc["measurements"]["exactness"] if r["draft"] == "fast"]
    assert record["compared"] == 2 * 5 and record["divergences"], record  # both shards' requests, one record
    (exact,) = [o for o in doc["outcomes"] if o["rule_id"] == "exact"]
    assert exact["status"] in ("fail", "inconclusive") and code in (1, 3), exact["message"]


def test_in_process_shards_each_compute_the_overlap_and_exactness_of_their_laws(
    tmp_path: Path, tiny_model_dir: Path, prompts_file: Path
) -> None:
    """In gate's own loop a shard is a law: the shard that measures a law computes its overlap along its
    own fallback outputs and checks its own outputs, so the merge decides every law's rules."""
    from conftest import tiny_policy

    text = tiny_policy(tiny_model_dir, prompts_file, "  - {id: exact, kind: exactness, next_token_samples: 0}\n",
                       drafts="  exit1: {kind: early_exit, num_layers: 1, num_draft_tokens: 2}\n",
                       laws="  - temperature: 0\n  - temperature: 0.7\n")
    policy = write_policy(tmp_path, text.replace("chat_template: true\n", "chat_template: true\n"
                                                 "measurement: {sequential: false, warmup_requests: 0}\n"))
    shards = []
    for i in (1, 2):
        out = tmp_path / f"s{i}.json"
        code, output = run("check", str(policy), "--shard", f"{i}/2", "--json", str(out), "--no-progress")
        assert code == 0, output
        shards.append(out)
    assert {o["law"] for o in json.loads(shards[1].read_text())["measurements"]["overlaps"]} == {"t0.7"}
    merged = tmp_path / "merged.json"
    run("merge", str(policy), *map(str, shards), "--json", str(merged))
    doc = json.loads(merged.read_text())
    overlap = {o["law"]: o["status"] for o in doc["outcomes"] if o["rule_id"] == "overlap-floor"}
    assert overlap == {"greedy": "pass", "t0.7": "pass"}, doc["outcomes"]
    records = {(r["draft"], r["law"]): r for r in doc["measurements"]["exactness"]}
    assert records[("exit1", "greedy")]["compared"] == 5 and len(records[("exit1", "t0.7")]["pit"]) > 0
