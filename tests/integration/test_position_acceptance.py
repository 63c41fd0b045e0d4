"""Per-position acceptance rules (position_acceptance_rate, conditional_acceptance_rate with
rules[].position): a draft built here proposes the target's own greedy token at position 1
and a wrong one after it, so its acceptance collapses at positions 2-3 while its greedy output
is exact (the verifier keeps the law whatever the draft proposes). A correctness-only gate
passes it; the per-position guard fails it, decided on an interval over request units. The
draft kind is registered in a fresh interpreter (before gate.policy is imported), as a
team's own kind would be; a served runner's window counters are tested on records in
tests/unit/test_position_acceptance.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r'''
import json, sys
from typing import Literal
import torch
from gate.drafts import registry as drafts
from gate.drafts.interface import BuiltDraft, Draft, DraftKind, DraftSpecBase, Proposal


class CollapseSpec(DraftSpecBase):
    kind: Literal["collapse"]
    num_draft_tokens: int = 3


class Collapse(Draft):
    """The target's greedy token at position 1, then (argmax + 1) mod V: wrong from position 2."""

    kind, probability_info = "collapse", "point_mass"

    def __init__(self, name, target, k, vocab):
        self.name, self.target, self.num_draft_tokens, self.vocab = name, target, k, vocab

    @torch.inference_mode()
    def propose(self, context, n, law, generator):
        ids, out = list(context), []
        for i in range(n):
            t = int(self.target(torch.tensor([ids])).logits[0, -1, : self.vocab].argmax())
            t = t if i == 0 else (t + 1) % self.vocab
            out.append(t)
            ids.append(t)
        tokens = torch.tensor(out, dtype=torch.long)
        return Proposal(tokens, torch.nn.functional.one_hot(tokens, self.vocab).float())

    @torch.inference_mode()
    def teacher_forced(self, ids, start, law, vocab_size):
        logits = self.target(torch.tensor([ids])).logits[0, start - 1 : len(ids) - 1, :vocab_size]
        return torch.nn.functional.one_hot(logits.argmax(-1), vocab_size).float()


drafts.register(DraftKind("collapse", CollapseSpec, "point_mass",
                          build=lambda name, spec, ctx: BuiltDraft(Collapse(name, ctx.target, spec.num_draft_tokens,
                                                                            ctx.vocab_size))))
from gate.cli import cli
from click.testing import CliRunner
result = CliRunner().invoke(cli, ["check", sys.argv[1], "--json", sys.argv[2], "--no-progress"])
import traceback
why = "".join(traceback.format_exception(result.exception)) if result.exception and not isinstance(result.exception, SystemExit) else ""
print(json.dumps([result.exit_code, result.output[-3000:] + why[-3000:]]))
'''


def test_a_draft_whose_acceptance_collapses_after_position_1_fails_the_guard_and_passes_exactness(
    tmp_path: Path, tiny_model_dir: Path, prompts_file: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"""\
version: 1
target: {{model: {tiny_model_dir}, device: cpu}}
drafts:
  collapse: {{kind: collapse, num_draft_tokens: 3}}
  bf16: {{kind: model, model: target, dtype: bfloat16, num_draft_tokens: 3}}
law: {{temperature: 0}}
workload: {{source: jsonl, path: {prompts_file}, max_new_tokens: 16, seed: 0}}
measurement: {{repetitions: 1, warmup_requests: 0, max_cpu_stall: null}}
rules:
  - {{id: pos1, metric: position_acceptance_rate, position: 1, aggregation: pooled, comparison: '>=', threshold: 0.3}}
  - {{id: pos2, metric: position_acceptance_rate, position: 2, aggregation: pooled, comparison: '>=', threshold: 0.7}}
  - {{id: pos2-given-1, metric: conditional_acceptance_rate, position: 2, aggregation: pooled, comparison: '>=',
      threshold: 0.7}}
  - {{id: exact, kind: exactness}}
""")
    report = tmp_path / "report.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(policy), str(report)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    code, shown = json.loads(run.stdout.strip().splitlines()[-1])
    assert report.exists(), (code, shown)
    outcomes = {(o["rule_id"], o["draft"]): o for o in json.loads(report.read_text())["outcomes"]}
    # correctness alone passes the collapsed draft: greedy output is the target's, token for token
    assert outcomes[("exact", "collapse")]["status"] == "pass", outcomes[("exact", "collapse")]["message"]
    # position 1 holds; from position 2 on, acceptance is gone: the guard fails it on an interval over requests.
    # Every unit at 1 (or 0) gives the bootstrap no spread: the bound is Clopper-Pearson's with each of the 5
    # requests one trial, 0.36 at the first look's 98.75% (so the thresholds here are 0.3 and 0.7)
    pos1 = outcomes[("pos1", "collapse")]
    assert pos1["status"] == "pass" and 0.3 < pos1["interval"]["low"] < 0.4, pos1["message"]
    for rule in ("pos2", "pos2-given-1"):
        o = outcomes[(rule, "collapse")]
        assert o["status"] == "fail" and o["measured"] < 0.2, o["message"]
        assert o["interval"] is not None and o["interval"]["units"] == 5 and "at position 2" in o["message"], o
    # the target's own weights in bfloat16 keep their acceptance at position 2
    assert outcomes[("pos2", "bf16")]["measured"] > 0.5, outcomes[("pos2", "bf16")]["message"]
    assert code == 1, shown


def served_check(folder: Path, model: Path, prompts: Path, stub: dict, repetitions: int, rules: str) -> tuple[int, dict]:
    """`gate check` of a vLLM-speaking stub draft (`stub`: Stub's settings; its counters scraped)
    beside a plain stub fallback at concurrency 2, greedy; returns (exit code, JSON report)."""
    from click.testing import CliRunner
    from served_stub import Stub

    from gate.cli import cli

    folder.mkdir(exist_ok=True)
    with Stub() as fallback, Stub(**stub) as draft:
        policy = folder / "policy.yaml"
        policy.write_text(f"""\
version: 1
target: {{model: {model}, device: cpu}}
drafts:
  fast: {{kind: early_exit, num_layers: 1, num_draft_tokens: 3}}
law: {{temperature: 0}}
runner:
  kind: openai
  endpoints:
    fallback: {{base_url: '{fallback.url}', api: completions, engine: vllm}}
    fast: {{base_url: '{draft.url}', api: completions, engine: vllm, metrics_url: '{draft.url}/metrics'}}
load: {{concurrency: [2]}}
workload: {{source: jsonl, path: {prompts}, max_new_tokens: 8, seed: 0}}
measurement: {{repetitions: {repetitions}, warmup_requests: 0, max_cpu_stall: null, max_client_lag_ms: null}}
rules:
{rules}""")
        result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(folder / "r.json"), "--no-progress"])
    return result.exit_code, json.loads((folder / "r.json").read_text())


def test_at_a_load_point_the_servers_per_position_counters_decide_over_its_windows(
    tmp_path: Path, tiny_model_dir: Path, prompts_file: Path
) -> None:
    """A stub whose vLLM counters say every step commits its first proposal and one in four its
    second (none its third): at concurrency 2 the guard reads the windows' counter deltas,
    one unit per window (5 repetitions), and fails position 2 while position 1 passes."""
    rules = ("  - {id: pos1, metric: position_acceptance_rate, position: 1, aggregation: pooled, comparison: '>=', "
             "threshold: 0.3}\n"
             "  - {id: pos2, metric: position_acceptance_rate, position: 2, aggregation: pooled, comparison: '>=', "
             "threshold: 0.7}\n")
    code, report = served_check(tmp_path, tiny_model_dir, prompts_file, {"vllm_counters": (4, [4, 1, 0])}, 5, rules)
    outcomes = {o["rule_id"]: o for o in report["outcomes"]}
    assert outcomes["pos1"]["status"] == "pass" and outcomes["pos1"]["measured"] == 1.0, outcomes["pos1"]["message"]
    pos2 = outcomes["pos2"]
    assert pos2["status"] == "fail" and pos2["measured"] == 0.25, pos2["message"]
    assert pos2["interval"]["units"] == 5, pos2  # one unit per window
    # vLLM's counters, as scraped: no per-step K, so the denominator is every step (num_drafts)
    drafted = [w["counters"] for w in report["measurements"]["runs"] if w["runner"] == "fast"]
    assert all(c["num_accepted_tokens_per_pos"] == [20, 5, 0] and c["num_drafts"] == 20 for c in drafted)
    assert code == 1


def test_vllms_per_request_metrics_make_each_request_a_unit_and_reconcile_with_its_counters(
    tmp_path: Path, tiny_model_dir: Path, prompts_file: Path
) -> None:
    """A stub that sends vLLM's per-request spec-decode metrics (--per-request-spec-decode-metrics
    detailed: each verification step's proposals and accepted proposals, in the final usage
    chunk) and counters that move by the same steps: the acceptance verdicts at the load point
    rest on request units (one window would give one unit), and the window's counters
    reconcile with its requests' (no note). Counters that moved by more give the note."""
    steps = ([3, 3, 3, 3], [3, 1, 0, 2])  # per request: 4 steps, positions committed 4, 2, 1 times of 4
    rules = ("  - {id: acceptance, metric: acceptance_rate, aggregation: pooled, comparison: '>=', threshold: 0.3}\n"
             "  - {id: pos3, metric: position_acceptance_rate, position: 3, aggregation: pooled, comparison: '>=', "
             "threshold: 0.5}\n")

    def run(folder: str, counters: tuple[int, list[int]]) -> dict:
        stub = {"vllm_steps": steps, "vllm_counters": counters}
        return served_check(tmp_path / folder, tiny_model_dir, prompts_file, stub, 1, rules)[1]

    report = run("same", (4, [3, 2, 1]))
    outcomes = {o["rule_id"]: o for o in report["outcomes"]}
    acceptance = outcomes["acceptance"]
    assert acceptance["measured"] == 0.5 and acceptance["interval"]["units"] == 5, acceptance  # 6 of 12, 5 requests
    assert outcomes["pos3"]["measured"] == 0.25 and outcomes["pos3"]["status"] == "fail", outcomes["pos3"]
    requests = [r for r in report["measurements"]["requests"] if r["draft"] == "fast"]
    assert all(r["server_step_proposed"] == steps[0] and r["server_step_accepted"] == steps[1] for r in requests)
    assert not any("do not reconcile" in n for n in report["measurements"]["notes"])
    # counters that moved by twice the requests' steps (another client on the server): said, not hidden
    other = run("other", (8, [6, 4, 2]))
    (note,) = [n for n in other["measurements"]["notes"] if "do not reconcile" in n]
    assert "20 steps, 60 proposed, 30 accepted over its 5 requests; the counters moved by 40, 120, 60" in note, note
