"""The tests of tests/unit/test_exactness_claims.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from conftest import sharp_llama, tiny_policy, write_policy
from gate.cli import cli
from gate.core.law import Law, law_probs
from reference import Fault, model_logits, speculative_sample
from unit.test_exactness_claims import FAULTS, LAW, PROMPTS

ALPHA, POWER, TV = 0.01, 0.9, 0.1


# --- the definition: what backs a pass ------------------------------------------------


# --- the issue's scenario, end to end through `gate exactness` -------------------------


@pytest.fixture(scope="module")
def pair():
    return sharp_llama(0.0), sharp_llama(0.15)


def recorded(pair, fault: Fault, per_prompt: int, length: int, seed: int, prompts=PROMPTS) -> list[dict]:
    target, draft = pair
    lines = []
    for i, prompt in enumerate(prompts):
        out = speculative_sample(model_logits(target, prompt), model_logits(draft, prompt), Law("t0.8", 0.8), 3,
                                 per_prompt, length, torch.Generator().manual_seed(seed + i), fault)
        lines += [{"prompt_ids": prompt, "output_ids": row, "law": LAW, "source": fault.value} for row in out.tolist()]
    return lines


def first_position_tv(pair, fault: Fault, draws: int = 10_000) -> float:
    """The largest first-position TV over the prompts (estimated from `draws` first tokens: biased up by about 0.03)."""
    target, draft = pair
    worst = 0.0
    for i, prompt in enumerate(PROMPTS):
        t, d = model_logits(target, prompt), model_logits(draft, prompt)
        first = speculative_sample(t, d, Law("t0.8", 0.8), 3, draws, 1, torch.Generator().manual_seed(99 + i), fault)[:, 0]
        p = law_probs(t(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long))[0, 0], Law("t", 0.8))
        freq = torch.bincount(first, minlength=p.shape[0]).double() / draws
        worst = max(worst, 0.5 * float((freq - p.double()).abs().sum()))
    return worst


def run_exactness(tmp_path, tiny_model_dir, prompts_file, lines):
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file,
                                                "  - id: exact\n    kind: exactness\n    detect_tv: 0.1\n"))
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = CliRunner().invoke(cli, ["exactness", str(policy), str(samples), "--json", str(tmp_path / "r.json"),
                                      "--junit", str(tmp_path / "j.xml")])
    report = json.loads((tmp_path / "r.json").read_text())
    return result, {o["scope"]: o for o in report["outcomes"]}


@pytest.fixture(scope="module")
def sharp_dir(tmp_path_factory):
    from conftest import tiny_tokenizer

    path = tmp_path_factory.mktemp("sharp-target-claims")
    sharp_llama(0.0).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def test_the_issue_scenario_passes_no_fault(tmp_path, pair, sharp_dir, prompts_file):
    """150 samples x 16 tokens over 8 prompts (18-19 a prompt), T 0.8: the faults the old
    pooled-PIT verdict passed are now inconclusive (or fail), and so is the correct sampler;
    the message says how many samples of one prompt a pass needs."""
    tvs = {f: first_position_tv(pair, f) for f in FAULTS}
    assert all(tv >= 0.1 for tv in tvs.values()), tvs  # real faults at the first position
    lines = []
    for f in [Fault.NONE, *FAULTS]:
        lines += recorded(pair, f, 19, 16, seed=1)[:150]
    result, out = run_exactness(tmp_path, sharp_dir, prompts_file, lines)
    for f in [Fault.NONE, *FAULTS]:
        o = out[f"{f.value}/t0.8"]
        assert o["status"] in ("inconclusive", "fail"), (f, o["message"])
        if o["status"] == "inconclusive":
            assert "needs" in o["message"] or "no prompt was sampled often enough" in o["message"]
    assert out["none/t0.8"]["status"] == "inconclusive"
    assert result.exit_code in (1, 3)


def test_enough_samples_per_prompt_fail_the_faults_and_pass_the_correct_sampler(tmp_path, pair, sharp_dir, prompts_file):
    """One prompt sampled 3,000 times by the correct sampler (2,703 detect TV 0.1 at the default
    significance 0.001), 1,000 times by each faulty one
    (6 tokens each): the first-position claim is powered; the correct sampler passes, each
    fault fails."""
    lines = recorded(pair, Fault.NONE, 3000, 6, seed=5, prompts=PROMPTS[:1])
    for f in FAULTS:
        lines += recorded(pair, f, 1000, 6, seed=5, prompts=PROMPTS[:1])
    result, out = run_exactness(tmp_path, sharp_dir, prompts_file, lines)
    assert out["none/t0.8"]["status"] == "pass", out["none/t0.8"]["message"]
    claims = [d for d in out["none/t0.8"]["details"] if d["role"] == "claim"]
    assert len(claims) == 1 and all(d["n"] == 3000 and d["detectable"] <= 0.1 for d in claims)
    for f in FAULTS:
        assert out[f"{f.value}/t0.8"]["status"] == "fail", (f, out[f"{f.value}/t0.8"]["message"])
    assert result.exit_code == 1


# --- item 2: NaN-safe corrections ------------------------------------------------------


# --- item 6: gate exactness needs only a target and exactness rules ----------------------


def test_gate_exactness_needs_no_draft_workload_or_tokenizer(tmp_path, pair):
    """A policy of a target (a model directory without any tokenizer file) and one exactness
    rule is enough for recorded samples; gate check still asks for a draft, at its line."""
    model_dir = tmp_path / "weights-only"
    sharp_llama(0.0).save_pretrained(model_dir)
    policy = write_policy(tmp_path, f"version: 1\ntarget:\n  model: {model_dir}\n  device: cpu\n"
                                    "rules:\n  - id: exact\n    kind: exactness\n")
    samples = tmp_path / "samples.jsonl"
    lines = recorded(pair, Fault.NONE, 30, 4, seed=3, prompts=PROMPTS[:1])
    samples.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = CliRunner().invoke(cli, ["exactness", str(policy), str(samples), "--json", str(tmp_path / "r.json"),
                                      "--junit", str(tmp_path / "j.xml")])
    assert result.exit_code == 3, result.output  # 30 samples of one prompt: an honest inconclusive
    (outcome,) = json.loads((tmp_path / "r.json").read_text())["outcomes"]
    assert outcome["status"] == "inconclusive" and outcome["samples"] > 0
    result = CliRunner().invoke(cli, ["validate", str(policy)])
    assert result.exit_code == 2 and "drafts" in result.output and "needs at least one" in result.output
    assert "Traceback" not in result.output
