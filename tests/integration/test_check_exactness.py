"""`gate check` exactness rules end to end on tiny random models: gate's own speculative
loop passes, and the same loop with a faulty verification step is caught."""

from __future__ import annotations

import json

from click.testing import CliRunner

from conftest import tiny_policy, write_policy
from gate.cli import cli
from gate.core.speculative import Verdict, sample

RULE = ("  - id: exact\n    kind: exactness\n    next_token_samples: 1500\n    detect_tv: 0.1\n    tie_tolerance: 0.0\n")
LAWS = "  - temperature: 0\n  - {temperature: 1.0, top_k: 8}\n"
SAMPLING = "other/t1-k8"


def run(tmp_path, pair, prompts, laws=LAWS, rule=RULE, lookup=False):
    """`gate check` of the model draft `other` (and, with `lookup`, prompt lookup) on the tiny pair."""
    model_dir, draft_dir = pair
    drafts = f"  other:\n    kind: model\n    model: {draft_dir}\n    num_draft_tokens: 3\n"
    if lookup:
        drafts += "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n"
    text = tiny_policy(model_dir, prompts, rule, drafts=drafts, laws=laws, max_new_tokens=64)
    text = text.replace("  chat_template: true\n", "  chat_template: true\nmeasurement:\n  repetitions: 6\n")  # 5 prompts x 6 = 30 cells
    policy = write_policy(tmp_path, text)
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"),
                                      "--no-warmup"])
    report = json.loads((tmp_path / "r.json").read_text())
    return result, {o["scope"]: o for o in report["outcomes"] if o["rule_id"] == "exact"}


def test_gate_loop_passes_exactness(tmp_path, sharp_pair, prompts_file):
    result, out = run(tmp_path, sharp_pair, prompts_file, lookup=True)
    assert out["other/greedy"]["status"] == "pass", out["other/greedy"]["message"]
    sampling = out[SAMPLING]
    assert sampling["status"] == "pass", sampling["message"]
    kinds = {d["kind"]: d for d in sampling["details"] if d["role"] == "claim" or d["kind"] == "ks"}
    assert kinds["ks"]["n"] > 900 and kinds["g"]["n"] == 1500
    claims = [d for d in sampling["details"] if d["role"] == "claim"]
    assert len(claims) == 1 and all(d["detectable"] <= 0.1 for d in claims)
    # the first steps also test the positions after prefixes many of them share (evidence, no power claimed)
    later = [d for d in sampling["details"] if d["role"] == "evidence" and d["kind"] == "g"]
    assert later and all(d["verdict"] == "not rejected" and 50 <= d["n"] < 1500 for d in later)
    # a point-mass proposal (prompt lookup) is exact under rejection sampling too
    assert out["lookup/greedy"]["status"] == "pass"
    assert out["lookup/t1-k8"]["status"] == "pass", out["lookup/t1-k8"]["message"]


def test_a_faulty_verifier_is_caught(tmp_path, sharp_pair, prompts_file, monkeypatch):
    """Deterministic acceptance (accept iff p(x) >= q(x), resample from p otherwise)."""

    def deterministic(p, q, proposals, generator):
        n = int(proposals.shape[0])
        for i in range(n):
            x = int(proposals[i])
            if p[i, x] < q[i, x]:
                return Verdict(i, sample(p[i], generator))
        return Verdict(n, sample(p[n], generator))

    monkeypatch.setattr("gate.runners.transformers.verify", deterministic)
    result, out = run(tmp_path, sharp_pair, prompts_file, laws="  - {temperature: 1.0, top_k: 8}\n")
    assert out[SAMPLING]["status"] == "fail", out[SAMPLING]["message"]
    assert result.exit_code == 1


def test_next_token_samples_auto_lets_gate_choose_the_first_steps_in_process_as_served(tmp_path, sharp_pair, prompts_file):
    """`auto` (the default) means the same in process as served: gate sizes the next-token
    samples from the target's law for detect_tv at the rule's power (planned_samples), says so,
    and the claim test reaches that power; 0 asks for no next-token test (the PIT still runs)."""
    sampling_only = "  - {temperature: 1.0, top_k: 8}\n"
    auto = RULE.replace("next_token_samples: 1500", "next_token_samples: auto")
    (tmp_path / "auto").mkdir()
    result, out = run(tmp_path / "auto", sharp_pair, prompts_file, laws=sampling_only, rule=auto)
    report = json.loads((tmp_path / "auto" / "r.json").read_text())
    notes = [n for n in report["measurements"]["notes"] if n.startswith("in-process next-token samples of other")]
    assert notes and "chosen by gate (next_token_samples auto)" in notes[0], report["measurements"]["notes"]
    chosen = int(notes[0].split(": ")[1].split(" first steps")[0])
    claims = [d for d in out[SAMPLING]["details"] if d["role"] == "claim"]
    assert claims and claims[0]["n"] == chosen and all(d["detectable"] <= 0.1 for d in claims), claims
    assert out[SAMPLING]["status"] == "pass", out[SAMPLING]["message"]
    (tmp_path / "none").mkdir()
    none = RULE.replace("next_token_samples: 1500", "next_token_samples: 0")
    result, out = run(tmp_path / "none", sharp_pair, prompts_file, laws=sampling_only, rule=none)
    assert not [d for d in out[SAMPLING]["details"] if d["role"] == "claim"]
    assert any(d["kind"] == "ks" for d in out[SAMPLING]["details"])  # the PIT, evidence only
