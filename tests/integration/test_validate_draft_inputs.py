"""Bad input around issue 12's features, refused by `gate validate` with the YAML path
(found by a new user trying to break them): mapping metrics on drafts that translate
nothing, fingerprints YAML reads as numbers, heads checkpoints whose tensors are missing or
disagree with heads.json, a release whose tokenizer is not the target's."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conftest import tiny_llama, tiny_policy, tiny_tokenizer, write_policy
from gate.cli import cli
from gate.drafts.heads import MedusaHeads, base_identity, save_checkpoint


def _validate(path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_a_mapping_metric_on_a_draft_that_translates_nothing_is_refused(tmp_path, tiny_model_dir, prompts_file):
    rule = "  - id: mapping\n    metric: mapping_ms\n    aggregation: mean\n    comparison: '<='\n    threshold: 5 ms\n"
    code, out = _validate(write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, rule)))
    assert code == 2 and "rules[2].metric" in out and "translate nothing" in out, out
    scoped = rule + "    scope: {drafts: [lookup]}\n"
    code, out = _validate(write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, scoped)))
    assert code == 2 and "rules[2].scope.drafts" in out and "lookup translates nothing" in out, out


@pytest.mark.parametrize("value,says", [("0000000000000000", "quote it"), ("1234567890123456", "quote it"),
                                        ("'3C5FDEE91060C09A'", "lower-case")])
def test_a_release_fingerprint_yaml_misreads_says_how_to_write_it(tmp_path, tiny_model_dir, prompts_file, value, says):
    text = tiny_policy(tiny_model_dir, prompts_file).replace("  device: cpu\n", f"  device: cpu\n  release:\n    fingerprint: {value}\n")
    code, out = _validate(write_policy(tmp_path, text))
    assert code == 2 and "target.release.fingerprint" in out and says in out, out


def test_heads_tensors_missing_or_disagreeing_with_the_header_are_refused_at_validate(tmp_path, tiny_model_dir, prompts_file):
    model = tiny_llama()
    folder = save_checkpoint(tmp_path / "ck", MedusaHeads(2, model.config.hidden_size), base_identity(model, "tiny"))
    drafts = f"  heads:\n    kind: heads\n    checkpoint: {folder}\n    num_draft_tokens: 2\n"
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, drafts=drafts))
    assert _validate(policy)[0] == 0
    other = save_checkpoint(tmp_path / "other", MedusaHeads(1, model.config.hidden_size), base_identity(model, "tiny"))
    (folder / "heads.safetensors").write_bytes((other / "heads.safetensors").read_bytes())  # 1 head where the header says 2
    code, out = _validate(policy)
    assert code == 2 and "drafts.heads.checkpoint" in out and "'weight' has shape" in out, out
    (folder / "heads.safetensors").unlink()
    code, out = _validate(policy)
    assert code == 2 and "drafts.heads.checkpoint" in out and "cannot read" in out, out
    drafts = f"  heads:\n    kind: heads\n    checkpoint: {other}\n"  # num_draft_tokens left at its default, 4
    code, out = _validate(write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, drafts=drafts)))
    assert code == 2 and "num_draft_tokens 4 (the default) is more" in out, out


def test_a_release_with_another_tokenizer_is_refused(tmp_path, tiny_model_dir, prompts_file):
    release = tmp_path / "release"
    tiny_llama(1).save_pretrained(release)
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["w999"])  # one token more: ids no longer mean the same
    tokenizer.save_pretrained(release)
    text = tiny_policy(tiny_model_dir, prompts_file).replace("  device: cpu\n", f"  device: cpu\n  release:\n    model: {release}\n")
    code, out = _validate(write_policy(tmp_path, text))
    assert code == 2 and "target.release.model" in out and "tokens, release" in out and "share the target's tokenizer" in out, out
