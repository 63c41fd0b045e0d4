"""The tests of tests/unit/test_bad_input.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import WORDS, tiny_llama, tiny_policy, write_policy
from gate.commands.check import check, validate
from gate.cli import cli
from gate.core.errors import InputError
from gate.policy import load_policy
from unit.test_bad_input import assert_bad_policy, assert_cli_error, line_of, one_problem  # noqa: F401 - shared with that tier
from unit.test_bad_input import MEMORY_RULE


@pytest.fixture
def base(tiny_model_dir: Path, prompts_file: Path) -> str:
    """A valid policy over the tiny model: drafts same_bf16, lookup, exit1; rules overlap-floor, itl."""
    return tiny_policy(tiny_model_dir, prompts_file)


def test_the_base_policy_is_valid(tmp_path: Path, base: str) -> None:
    policy = write_policy(tmp_path, base)
    assert set(validate(policy).policy.drafts) == {"same_bf16", "lookup", "exit1"}
    result = CliRunner().invoke(cli, ["validate", str(policy)])
    assert result.exit_code == 0, result.output
    assert "valid (version 1; 3 drafts, 1 law, 2 rules)" in result.output


# --- malformed YAML -----------------------------------------------------------------------


def test_malformed_yaml_bad_indentation_reports_the_line(tmp_path: Path, base: str) -> None:
    text = base.replace("  dtype: float32\n  device: cpu\n", "  dtype: float32\n     device: cpu\n")
    assert text != base
    policy = write_policy(tmp_path, text)
    problem = assert_bad_policy(policy, "", line_of(text, "     device: cpu"), "malformed YAML", "indentation", tmp_path=tmp_path)
    assert problem.line == 5


def test_malformed_yaml_unclosed_bracket_reports_where_it_stopped_and_where_it_opened(tmp_path: Path, base: str) -> None:
    text = base.replace("  seed: 0\n", "  seed: 0\n  categories: [repeat, chat\n")
    policy = write_policy(tmp_path, text)
    opened = line_of(text, "categories: [repeat, chat")
    problem = assert_bad_policy(policy, "", opened + 1, "malformed YAML", "expected ',' or ']'")
    assert f"starts at line {opened}" in problem.message


# --- unknown keys, types, units ------------------------------------------------------------


def test_unknown_key_under_a_law_suggests_the_key(tmp_path: Path, base: str) -> None:
    text = base.replace("  - temperature: 0\n", "  - tempurature: 0\n")
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "law[0].tempurature", line_of(text, "tempurature"),
                      "unknown key 'tempurature'", "did you mean 'temperature'?", tmp_path=tmp_path)


def test_misspelt_required_key_in_a_rule_is_one_problem_with_a_suggestion(tmp_path: Path, base: str) -> None:
    text = base.replace("    threshold: 10 s\n", "    threshhold: 10 s\n")
    policy = write_policy(tmp_path, text)
    # one problem: not also "rules[1].threshold: required key is missing"
    assert_bad_policy(policy, "rules[1].threshhold", line_of(text, "threshhold"),
                      "unknown key 'threshhold'", "did you mean 'threshold'?")


def test_wrong_type_names_the_value(tmp_path: Path, base: str) -> None:
    text = base.replace("    num_draft_tokens: 3\n", "    num_draft_tokens: many\n", 1)
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "drafts.same_bf16.num_draft_tokens", line_of(text, "num_draft_tokens: many"),
                      "expected an integer", "'many'", tmp_path=tmp_path)


def test_a_law_of_the_wrong_shape_is_one_problem(tmp_path: Path, base: str) -> None:
    # law is a mapping or a list of them: one message, not one per alternative
    text = base.replace("law:\n  - temperature: 0\n", "law: greedy\n")
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "law", line_of(text, "law: greedy"), "expected a mapping or a list, got 'greedy'")


def test_negative_budget(tmp_path: Path, base: str) -> None:
    text = base + MEMORY_RULE.format("-1 GiB")
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "rules[2].threshold", line_of(text, "threshold: -1 GiB"), "'-1 GiB' is negative")


def test_unitless_budget_for_a_metric_with_units(tmp_path: Path, base: str) -> None:
    text = base + MEMORY_RULE.format("2")
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "rules[2].threshold", line_of(text, "threshold: 2"),
                      "threshold 2 has no unit", "memory_bill_bytes is in bytes", tmp_path=tmp_path)


def test_unit_of_the_wrong_dimension(tmp_path: Path, base: str) -> None:
    text = base + MEMORY_RULE.format("120 ms")
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "rules[2].threshold", line_of(text, "threshold: 120 ms"),
                      "'120 ms' is in ms", "memory_bill_bytes is in bytes")


def test_unknown_draft_kind(tmp_path: Path, base: str) -> None:
    text = base.replace("kind: prompt_lookup", "kind: ngram")
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "drafts.lookup.kind", line_of(text, "kind: ngram"),
                      "unknown kind 'ngram'", "model, prompt_lookup, early_exit", tmp_path=tmp_path)


def test_duplicate_key_names_both_lines(tmp_path: Path, base: str) -> None:
    text = base.replace("  device: cpu\n", "  device: cpu\n  dtype: bfloat16\n", 1)
    policy = write_policy(tmp_path, text)
    first, second = line_of(text, "  dtype: float32"), line_of(text, "  dtype: bfloat16")
    assert (first, second) == (4, 6)
    assert_bad_policy(policy, "target.dtype", second, "duplicate key 'dtype'", f"first at line {first}")


def test_duplicate_rule_ids(tmp_path: Path, base: str) -> None:
    text = base.replace("  - id: itl\n", "  - id: overlap-floor\n")
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "rules[1].id", line_of(text, "id: overlap-floor", nth=2),
                      "rule id 'overlap-floor' is used twice", "rules[0]", tmp_path=tmp_path)


def test_rule_scope_naming_an_unknown_draft_suggests_one(tmp_path: Path, base: str) -> None:
    text = base + "  - id: scoped\n    metric: overlap\n    comparison: '>='\n    threshold: 0.5\n    scope:\n      drafts: [exit1, lokup]\n"
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "rules[2].scope.drafts[1]", line_of(text, "lokup"),
                      "unknown draft 'lokup'", "did you mean 'lookup'?")


# --- files the policy names ------------------------------------------------------------------


def test_missing_model_path(tmp_path: Path, base: str, tiny_model_dir: Path) -> None:
    text = base.replace(f"model: {tiny_model_dir}", "model: /nonexistent")
    policy = write_policy(tmp_path, text)
    load_policy(policy)  # the policy itself is well formed
    assert_bad_policy(policy, "target.model", line_of(text, "model: /nonexistent"), "/nonexistent",
                      loader=validate, tmp_path=tmp_path)


def test_missing_prompt_file(tmp_path: Path, base: str, prompts_file: Path) -> None:
    text = base.replace(f"path: {prompts_file}", "path: no-such-prompts.jsonl")
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "workload.path", line_of(text, "path: no-such-prompts.jsonl"), "prompt file not found",
                      str(tmp_path / "no-such-prompts.jsonl"), loader=validate, tmp_path=tmp_path)


def test_malformed_jsonl_prompt_line_names_its_line(tmp_path: Path, base: str, prompts_file: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "w1 w2 w3"}) + "\n\n" + '{"prompt": "w4 w5", oops}\n')
    text = base.replace(f"path: {prompts_file}", "path: prompts.jsonl")
    policy = write_policy(tmp_path, text)
    assert_bad_policy(policy, "workload.path", line_of(text, "path: prompts.jsonl"), f"{prompts}:3:", "not valid JSON",
                      loader=validate, tmp_path=tmp_path)


def test_incompatible_tokenizer_of_a_separate_draft_model(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Same size as the target's vocabulary, other tokens: only the vocabularies differ.
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"x{i}": i + 4 for i in range(len(WORDS))})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    other = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    draft_dir = tmp_path / "other-draft"
    tiny_llama(2).save_pretrained(draft_dir)
    other.save_pretrained(draft_dir)

    drafts = f"  other:\n    kind: model\n    model: {draft_dir}\n    num_draft_tokens: 2\n"
    text = tiny_policy(tiny_model_dir, prompts_file, drafts=drafts, max_new_tokens=4)
    policy = write_policy(tmp_path, text)
    line = line_of(text, f"model: {draft_dir}")
    # `gate validate` compares the tokenizers without loading weights; `gate check` too.
    problem = assert_bad_policy(policy, "drafts.other.model", line, "tokenizer mismatch", loader=validate, tmp_path=tmp_path)
    assert "id 4 is 'w0' in the target but 'x0' in the draft" in problem.message
    with pytest.raises(InputError) as info:
        check(policy, warmup=False)
    assert one_problem(info.value) == problem


