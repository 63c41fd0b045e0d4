"""The tests of tests/unit/test_target_identity.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch
from click.testing import CliRunner

from conftest import tiny_llama, tiny_policy, tiny_tokenizer, write_policy
from gate.cli import cli
from gate.core.errors import InputError
from gate.loop import identity
from gate.policy.reader import load_policy
from gate.records import TargetIdentity
from gate.plan.validate import validate
from unit.test_target_identity import DRIFT_RULES, LAWS, LOOKUP


# --- the pure functions -------------------------------------------------------------------------------------------


def _identity(model) -> tuple[TargetIdentity, list[list[int]], list[torch.Tensor]]:
    fields = identity.config_fields(model.config)
    from gate.models.loading import fingerprint

    ident = TargetIdentity(fingerprint(model), "float32", fields, identity.config_digest(fields), identity.PROBE_TOP_K)
    ids = [[1, 5, 6, 7, 8, 9], [1, 10, 11, 12]]
    return ident, ids, identity.probe_logits(model, ids, torch.device("cpu"))


def _noisy(scale: float, seed: int = 3):
    model = tiny_llama(0)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # sharp laws (random tiny models are near flat)
        if scale:
            model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(seed)) * scale)
    return model


def test_classification_identical_within_tolerance_and_updated():
    base = _noisy(0.0)
    ident, ids, logits = _identity(base)
    release = identity.Release("model x", 1e-3)
    # the same weights: identical
    same, _, same_logits = _identity(_noisy(0.0))
    c = identity.classify(same, release, identity.compare_full(logits, same_logits), ident.fingerprint, ident.config)
    assert c.classification == identity.UNCHANGED and "identical weights" in c.reason and c.probe_max_abs_logit_diff == 0
    # tiny noise: other weights, logits within 1e-3
    tiny, _, tiny_logits = _identity(_noisy(1e-6))
    diff = identity.compare_full(logits, tiny_logits)
    assert tiny.fingerprint != ident.fingerprint and 0 < diff.max_abs_logit_diff <= 1e-3
    c = identity.classify(tiny, release, diff, ident.fingerprint, ident.config)
    assert c.classification == identity.UNCHANGED and "within numerical tolerance" in c.reason
    assert any("weights fingerprint" in d for d in c.differences)
    # a real perturbation: updated, with the figures
    big, _, big_logits = _identity(_noisy(0.3))
    diff = identity.compare_full(logits, big_logits)
    c = identity.classify(big, release, diff, ident.fingerprint, ident.config)
    assert c.classification == identity.UPDATED and c.updated and "beyond the tolerance" in c.reason
    assert c.probe_max_abs_logit_diff > 1e-3 and 0 < c.probe_tv_max <= 1 and c.probe_tv_error == 0
    # the same release given as a saved probe (top-k only): the same verdict, TV with its stated error
    stored = [identity.compact("p", i, lg) for i, lg in zip(ids, logits)]
    sparse = identity.compare_sparse(stored, ids, big_logits)
    assert sparse.positions == diff.positions and sparse.max_abs_logit_diff <= diff.max_abs_logit_diff + 1e-9
    assert sparse.tv_max <= diff.tv_max + 1e-9 <= sparse.tv_max + sparse.tv_error + 2e-9  # a lower bound, and how loose
    report_release = identity.Release("report r.json", 1e-3, ident.fingerprint, ident.config, ident.config_digest, stored)
    assert identity.classify(big, report_release, sparse, ident.fingerprint, ident.config).classification == identity.UPDATED


def test_fingerprint_only_config_change_and_tokenizer_change_are_updated():
    base = _noisy(0.0)
    ident, ids, logits = _identity(base)
    c = identity.classify(ident, identity.Release("fingerprint", 1e-3, fingerprint="0" * 16), None, "0" * 16, None)
    assert c.classification == identity.UPDATED and "no probe" in c.reason
    other = dict(ident.config, num_hidden_layers=3)
    c = identity.classify(ident, identity.Release("model x", 1e-3), None, ident.fingerprint, other)
    assert c.classification == identity.UPDATED and any("num_hidden_layers" in d for d in c.differences)
    stored = [identity.compact("p", [9, 9], logits[0][:2])]
    diff = identity.compare_sparse(stored, ids[:1], logits[:1])
    assert diff.mismatches and diff.positions == 0
    c = identity.classify(ident, identity.Release("report r", 1e-3), diff, ident.fingerprint, ident.config)
    assert c.classification == identity.UPDATED and "tokenizer" in c.reason
    # a draft kind that ships a changed target is said
    c = identity.classify(ident, identity.Release("model x", 1e-3), identity.compare_full(logits, logits), ident.fingerprint,
                          ident.config, ["joint"])
    assert c.modifying_drafts == ["joint"] and "joint ship a changed target" in c.reason


# --- end to end through gate check ----------------------------------------------------------------------------------

def _save(model, path):
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def release_pair(tmp_path_factory):
    """(release dir, updated dir): a sharp tiny target and a perturbed copy of it."""
    root = tmp_path_factory.mktemp("release")
    return _save(_noisy(0.0), root / "release"), _save(_noisy(0.3), root / "updated")


def _check(tmp_path, target, release_yaml, prompts, rules="", name="policy.yaml"):
    text = tiny_policy(target, prompts, rules, drafts=LOOKUP, laws=LAWS, max_new_tokens=8)
    text = text.replace("  device: cpu\n", f"  device: cpu\n  release:\n{release_yaml}")
    policy = write_policy(tmp_path, text, name)
    out = tmp_path / name.replace(".yaml", "")
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(out) + ".json", "--junit", str(out) + ".xml",
                                      "--markdown", str(out) + ".md", "--html", str(out) + ".html", "--no-warmup"])
    return result, json.loads((out.with_suffix(".json")).read_text()), ET.parse(str(out) + ".xml").getroot()


def _suite(junit):
    suite = junit.find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    return props, cases


def test_gate_check_unchanged_then_updated_with_drift(tmp_path, release_pair, prompts_file):
    release, updated = release_pair
    # the released target against itself: unchanged (identical), no drift
    result, report, junit = _check(tmp_path, release, f"    model: {release}\n", prompts_file, DRIFT_RULES, "same.yaml")
    ident = report["measurements"]["target_identity"]
    assert ident["release"]["classification"] == "unchanged target", ident["release"]
    assert ident["probe"] and len(ident["probe"][0]["top_ids"][0]) == min(identity.PROBE_TOP_K, 96)
    drift = report["measurements"]["drift"]
    assert drift and all(v == 0 for d in drift for v in d["tv"]) and all(all(d["top1"]) for d in drift)
    props, cases = _suite(junit)
    assert props["target.identity"] == "unchanged target" and "target-identity" in cases
    outcomes = {o["scope"]: o for o in report["outcomes"] if o["rule_id"] == "drift-tv"}
    assert outcomes["lookup/greedy"]["status"] == "pass" and outcomes["lookup/greedy"]["measured"] == 0
    assert result.exit_code == 0, result.output
    # a perturbed copy: updated target, drift figures, the rule on them fails
    result, report, junit = _check(tmp_path, updated, f"    model: {release}\n", prompts_file, DRIFT_RULES, "updated.yaml")
    comparison = report["measurements"]["target_identity"]["release"]
    assert comparison["classification"] == "updated target" and comparison["probe_max_abs_logit_diff"] > 1e-3
    tv = [v for d in report["measurements"]["drift"] for v in d["tv"]]
    assert tv and all(0 <= v <= 1 for v in tv) and max(tv) > 0
    kl = [v for d in report["measurements"]["drift"] if d["law"] == "t1-k8" for v in d["kl"]]
    assert all(v is None or v >= 0 for v in kl)
    props, cases = _suite(junit)
    assert props["target.identity"] == "updated target"
    assert "UPDATED TARGET" in cases["target-identity"].find("system-out").text
    assert "target drift against the release" in cases["target-identity"].find("system-out").text
    md = (tmp_path / "updated.md").read_text()
    assert "UPDATED TARGET" in md and "target drift against the release" in md
    html = (tmp_path / "updated.html").read_text()
    assert 'id="target-identity"' in html and "UPDATED TARGET" in html
    assert "Target identity" in result.output and "UPDATED TARGET" in result.output  # the console report
    assert {o["metric"] for o in report["outcomes"]} >= {"target_drift_tv", "target_drift_top1", "target_drift_kl"}
    # greedy laws: every moved argmax is an infinite KL, so a ceiling on it fails (never passes, never errors)
    kl_greedy = next(o for o in report["outcomes"] if o["rule_id"] == "drift-kl" and o["scope"] == "lookup/greedy")
    assert kl_greedy["status"] == "fail", kl_greedy["message"]
    assert result.exit_code in (0, 1), result.output  # decided, not a missing measurement


def test_release_from_a_saved_report_round_trip(tmp_path, release_pair, prompts_file):
    release, updated = release_pair
    _, first, _ = _check(tmp_path, release, f"    fingerprint: '{'0' * 16}'\n", prompts_file, name="first.yaml")
    assert first["measurements"]["target_identity"]["release"]["classification"] == "updated target"  # wrong fingerprint
    saved = tmp_path / "first.json"
    _, same, _ = _check(tmp_path, release, f"    report: {saved}\n", prompts_file, name="again.yaml")
    c = same["measurements"]["target_identity"]["release"]
    assert c["classification"] == "unchanged target" and c["release"] == f"report {saved}"
    _, moved, _ = _check(tmp_path, updated, f"    report: {saved}\n", prompts_file, name="moved.yaml")
    c = moved["measurements"]["target_identity"]["release"]
    assert c["classification"] == "updated target" and c["probe_max_abs_logit_diff"] > 1e-3 and c["probe_tv_max"] > 0
    assert not moved["measurements"]["drift"]  # a report has no law to compare along the workload


def test_a_kind_that_modifies_the_target_needs_a_release_and_is_said(tmp_path, release_pair, prompts_file, monkeypatch):
    import dataclasses

    from gate.drafts import registry

    real = registry.get
    monkeypatch.setattr(registry, "get", lambda name: dataclasses.replace(real(name), modifies_target=True)
                        if name == "prompt_lookup" else real(name))
    release, _ = release_pair
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, tiny_policy(release, prompts_file, drafts=LOOKUP), "bare.yaml"))
    problem = info.value.problems[0]
    assert problem.path == "drafts.lookup.kind" and "target.release" in problem.message
    _, report, junit = _check(tmp_path, release, f"    model: {release}\n", prompts_file, name="joint.yaml")
    assert report["measurements"]["drafts"]["lookup"]["modifies_target"] is True
    c = report["measurements"]["target_identity"]["release"]
    assert c["modifying_drafts"] == ["lookup"] and "an updated target for them" in c["reason"]
    assert "lookup ship a changed target" in _suite(junit)[1]["target-identity"].find("system-out").text


# --- bad input ------------------------------------------------------------------------------------------------------

def _policy(tmp_path, model_dir, prompts, release_yaml, rules=""):
    text = tiny_policy(model_dir, prompts, rules, drafts=LOOKUP)
    text = text.replace("  device: cpu\n", f"  device: cpu\n  release:\n{release_yaml}" if release_yaml else "  device: cpu\n")
    return write_policy(tmp_path, text)


@pytest.mark.parametrize("release_yaml, path, words", [
    ("    fingerprint: 'abc'\n", "target.release.fingerprint", ("pattern",)),
    (f"    fingerprint: '{'a' * 16}'\n    report: r.json\n", "target.release", ("exactly one", "fingerprint, report")),
    (f"    fingerprint: '{'a' * 16}'\n    dtype: bfloat16\n", "target.release.dtype", ("applies to a release given by model",)),
    (f"    fingerprint: '{'a' * 16}'\n    tolerance_logits: 0.1\n", "target.release.tolerance_logits", ("no probe",)),
])
def test_release_spec_errors(tmp_path, tiny_model_dir, prompts_file, release_yaml, path, words):
    with pytest.raises(InputError) as info:
        load_policy(_policy(tmp_path, tiny_model_dir, prompts_file, release_yaml))
    problem = info.value.problems[0]
    assert problem.path == path, str(info.value)
    assert all(w in problem.message for w in words), problem.message


def test_drift_rule_needs_the_release_weights(tmp_path, tiny_model_dir, prompts_file):
    rule = "  - id: d\n    metric: target_drift_kl\n    aggregation: mean\n    comparison: '<='\n    threshold: 0.1\n"
    for release_yaml in ("", f"    fingerprint: '{'a' * 16}'\n"):
        with pytest.raises(InputError) as info:
            load_policy(_policy(tmp_path, tiny_model_dir, prompts_file, release_yaml, rule))
        problem = info.value.problems[0]
        assert problem.path == "rules[2].metric" and "target.release.model" in problem.message


def test_release_report_missing_or_without_identity(tmp_path, tiny_model_dir, prompts_file):
    with pytest.raises(InputError) as info:
        validate(_policy(tmp_path, tiny_model_dir, prompts_file, "    report: nowhere.json\n"))
    problem = info.value.problems[0]
    assert problem.path == "target.release.report" and "does not exist" in problem.message and problem.line
    not_a_report = tmp_path / "bad.json"
    not_a_report.write_text("{}")
    with pytest.raises(InputError) as info:
        validate(_policy(tmp_path, tiny_model_dir, prompts_file, f"    report: {not_a_report}\n"))
    assert info.value.problems[0].path == "target.release.report"
    with pytest.raises(InputError) as info:
        validate(_policy(tmp_path, tiny_model_dir, prompts_file, f"    model: {tmp_path / 'no-such-dir'}\n"))
    assert info.value.problems[0].path == "target.release.model"
