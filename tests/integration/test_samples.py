"""The tests of tests/unit/test_samples.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from conftest import tiny_llama, tiny_policy, write_policy
from gate.cli import cli
from gate.drafts.model import ModelDraft
from gate.runners.transformers import TransformersRunner
from gate.core.law import Law
from unit.test_samples import CPU, RULE

# tiny random models have near-flat logits (top-2 gaps ~1e-3): no tie tolerance here


@pytest.fixture(scope="module")
def recorded():
    """Speculative samples from gate's engine on the tiny target (law t0.9, top-k 8)."""
    engine = TransformersRunner(tiny_llama(0), set(), CPU)
    draft = ModelDraft("d", "model", tiny_llama(1), 3, CPU)
    g = torch.Generator().manual_seed(0)
    lines = []
    for i in range(120):
        prompt = [1, 5 + i % 3, 9]
        out = engine._generate(prompt, draft, Law("t", 0.9, top_k=8), 12, g).output_ids
        lines.append({"prompt_ids": prompt, "output_ids": out, "law": {"temperature": 0.9, "top_k": 8}, "source": "spec"})
    greedy = engine._generate([1, 5, 9], None, Law("g", 0.0), 10, None).output_ids
    return lines, greedy


def run(tmp_path: Path, model_dir: Path, prompts: Path, lines: list[dict], *extra: str):
    policy = write_policy(tmp_path, tiny_policy(model_dir, prompts, RULE))
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = CliRunner().invoke(cli, ["exactness", str(policy), str(samples), "--json", str(tmp_path / "r.json"),
                                      "--junit", str(tmp_path / "j.xml"), *extra])
    report = json.loads((tmp_path / "r.json").read_text()) if (tmp_path / "r.json").exists() else None
    return result, report


def outcomes(report):
    return {o["scope"]: o for o in report["outcomes"]}


def test_correct_samples_are_not_failed_and_greedy_matches(tmp_path, tiny_model_dir, prompts_file, recorded):
    lines, greedy = recorded
    lines = lines + [{"prompt_ids": [1, 5, 9], "output_ids": greedy, "law": {"temperature": 0}}]
    result, report = run(tmp_path, tiny_model_dir, prompts_file, lines)
    out = outcomes(report)
    assert out["samples/greedy"]["status"] == "pass"
    # 1,440 PIT values do not reject, but the PIT is evidence only; the next-token tests (40 per prompt)
    # are under-powered: inconclusive, never pass
    spec = out["spec/t0.9-k8"]
    assert spec["status"] == "inconclusive", spec["message"]
    pit = next(d for d in spec["details"] if d["kind"] == "ks")
    assert pit["verdict"] == "not rejected" and pit["n"] == 1440 and pit["role"] == "evidence"
    claims = [d for d in spec["details"] if d["role"] == "claim"]
    assert len(claims) == 3 and all(d["verdict"] == "inconclusive" and d["n"] == 40 for d in claims)
    assert "needs" in spec["message"]
    assert result.exit_code == 3


def test_corrupted_samples_fail(tmp_path, tiny_model_dir, prompts_file, recorded):
    lines, greedy = recorded
    broken = [dict(x, output_ids=[t if k % 3 else 4 for k, t in enumerate(x["output_ids"])]) for x in lines]
    wrong_greedy = greedy[:3] + [(greedy[3] + 1) % 96] + greedy[4:]
    broken.append({"prompt_ids": [1, 5, 9], "output_ids": wrong_greedy, "law": {"temperature": 0}})
    result, report = run(tmp_path, tiny_model_dir, prompts_file, broken)
    out = outcomes(report)
    assert out["spec/t0.9-k8"]["status"] == "fail"
    assert out["samples/greedy"]["status"] == "fail"
    divergence = out["samples/greedy"]["details"][0]
    assert divergence["position"] == 3 and divergence["gap_logits"] > 0 and not divergence["near_tie"]
    assert result.exit_code == 1


def test_few_samples_are_inconclusive_never_pass(tmp_path, tiny_model_dir, prompts_file, recorded):
    lines, _ = recorded
    result, report = run(tmp_path, tiny_model_dir, prompts_file, lines[:3])
    spec = outcomes(report)["spec/t0.9-k8"]
    assert spec["status"] == "inconclusive" and "needs" in spec["message"]
    assert result.exit_code == 3


@pytest.mark.parametrize("line, where, words", [
    ({"prompt_ids": [1, 2], "output_ids": [500], "law": {"temperature": 1.0}}, "output_ids", "outside the target's vocabulary"),
    ({"prompt_ids": [1, 2], "output_ids": [5], "law": {"temperature": 1.0, "typical_p": 0.1}}, "law.typical_p", "Extra inputs"),
    ({"prompt_ids": [1, 2], "output_ids": [5], "law": {"temperature": -1}}, "law.temperature", "greater than or equal"),
    ({"prompt_ids": [], "output_ids": [5], "law": {"temperature": 1}}, "prompt_ids", "at least 1"),
    ({"prompt_ids": [1, 2], "output_ids": [5], "law": {"temperature": 0, "logit_bias": {"500": 1}}}, "law.logit_bias.500",
     "outside the target's vocabulary"),
    ({"prompt_ids": [1, 2], "output_ids": [5], "law": {"temperature": 1, "presence_penalty": 0.5, "convention": "transformers"}},
     "law.presence_penalty", "not part of convention 'transformers'"),
])
def test_bad_sample_lines_name_file_and_line(tmp_path, tiny_model_dir, prompts_file, recorded, line, where, words):
    lines, _ = recorded
    result, report = run(tmp_path, tiny_model_dir, prompts_file, lines[:2] + [line])
    assert result.exit_code == 2, result.output
    assert f"samples.jsonl:3: {where}:" in result.output and words in result.output
    assert "Traceback" not in result.output and report is None


