"""The tests of tests/unit/test_law_policy.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tokenizers import decoders

from conftest import tiny_config, tiny_llama, tiny_policy, tiny_tokenizer, write_policy
from gate.cli import cli
from gate.constraints.interface import ResponseFormat
from gate.plan.matrix import laws_of, plan_workload
from gate.policy.reader import load_policy
from gate.plan.validate import validate
from unit.test_law_policy import ROWS, SCHEMA


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny Llama with a tokenizer the grammar engine can read (a byte-level decoder:
    llguidance needs to know how tokens decode to bytes)."""
    path = tmp_path_factory.mktemp("tiny-grammar")
    tiny_llama(0).save_pretrained(path)
    tokenizer = tiny_tokenizer()
    tokenizer.backend_tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save_pretrained(path)
    return path


def _prompts(folder: Path, rows: list[dict], name: str = "prompts.jsonl") -> Path:
    path = folder / name
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _policy(model_dir: Path, prompts: Path, laws: str = "  - temperature: 0\n", workload: str = "", rules: str = "") -> str:
    text = tiny_policy(model_dir, prompts, rules, laws=laws)
    return text.replace("  chat_template: true\n", "  chat_template: true\n" + workload)


def _validate(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


# --- law fields --------------------------------------------------------------------------


def test_law_fields_reach_the_plan_with_compact_labels(tmp_path, model_dir):
    laws = ("  - temperature: 0\n"
            "  - {temperature: 0, repetition_penalty: 1.3}\n"
            "  - {temperature: 0.7, min_p: 0.05, repetition_penalty: 1.2}\n"
            "  - {temperature: 0.7, top_k: 40, presence_penalty: 0.5, frequency_penalty: -0.25, logit_bias: {'12': 5, 7: -100}}\n"
            "  - {temperature: 0.7, min_p: 0.1, top_p: 0.9, convention: transformers}\n")
    policy = write_policy(tmp_path, _policy(model_dir, _prompts(tmp_path, ROWS), laws=laws))
    loaded = load_policy(policy)
    assert [law.label for law in loaded.policy.laws] == [
        "greedy", "greedy-rp1.3", "t0.7-mp0.05-rp1.2", "t0.7-k40-pp0.5-fp-0.25-lb2", "t0.7-p0.9-mp0.1-tf"]
    laws = laws_of(loaded.policy)
    assert laws[2].min_p == 0.05 and laws[2].repetition_penalty == 1.2 and laws[2].convention == "vllm"
    assert laws[3].logit_bias == ((7, -100.0), (12, 5.0))  # digit-string and integer keys, sorted by token id
    assert laws[3].presence_penalty == 0.5 and laws[3].frequency_penalty == -0.25
    assert laws[4].convention == "transformers" and laws[4].min_p == 0.1
    assert [law.name for law in laws] == [law.label for law in loaded.policy.laws]
    assert _validate(policy)[0] == 0


@pytest.mark.parametrize("law, where, words", [
    ("{temperature: 0.7, min_p: -0.1}", "law[0].min_p", "greater than or equal to 0"),
    ("{temperature: 0.7, min_p: 1.5}", "law[0].min_p", "less than or equal to 1"),
    ("{temperature: 0.7, repetition_penalty: 0}", "law[0].repetition_penalty", "greater than 0"),
    ("{temperature: 0.7, repetition_penalty: 11}", "law[0].repetition_penalty", "less than or equal to 10"),
    ("{temperature: 0.7, presence_penalty: 2.5}", "law[0].presence_penalty", "less than or equal to 2"),
    ("{temperature: 0.7, frequency_penalty: -3}", "law[0].frequency_penalty", "greater than or equal to -2"),
    ("{temperature: 0.7, convention: hf}", "law[0].convention", "'vllm' or 'transformers'"),
    ("{temperature: 0.7, convention: transformers, presence_penalty: 0.5}", "law[0].presence_penalty",
     "presence_penalty is not part of convention 'transformers'"),
    ("{temperature: 0.7, convention: transformers, frequency_penalty: 0.5}", "law[0].frequency_penalty",
     "frequency_penalty is not part of convention 'transformers'"),
    ("{temperature: 0.7, logit_bias: {w12: 1}}", "law[0].logit_bias.w12", "token ids"),
    ("{temperature: 0.7, logit_bias: {-3: 1}}", "law[0].logit_bias.-3", "token id -3 is negative"),
    ("{temperature: 0.7, logit_bias: {12: 101}}", "law[0].logit_bias.12", "-100 to 100"),
    ("{temperature: 0.7, logit_bias: {'12': high}}", "law[0].logit_bias.12", "must be a number"),
    ("{temperature: 0.7, logit_bias: [12, 1]}", "law[0].logit_bias", "expected a mapping"),
])
def test_bad_law_fields_name_the_field(tmp_path, model_dir, law, where, words):
    text = _policy(model_dir, _prompts(tmp_path, ROWS), laws=f"  - {law}\n")
    code, out = _validate(write_policy(tmp_path, text))
    assert code == 2 and f": {where}: " in out and words in out, out
    assert "Traceback" not in out and out.count("policy.yaml:") == 1, out


def test_a_biased_token_outside_the_vocabulary_is_refused_at_validate(tmp_path, model_dir):
    text = _policy(model_dir, _prompts(tmp_path, ROWS), laws="  - temperature: 0\n  - {temperature: 0.7, logit_bias: {5: 1, 500: -2}}\n")
    code, out = _validate(write_policy(tmp_path, text))
    assert code == 2 and "law[1].logit_bias.500" in out and "outside the target's vocabulary (ids 0 to 95" in out, out
    line = next(n for n, x in enumerate(text.splitlines(), start=1) if "logit_bias" in x)
    assert f"policy.yaml:{line}:" in out, out


def test_off_values_are_off_and_name_no_part_of_the_label(tmp_path, model_dir):
    # min-p 0, repetition 1, presence and frequency 0 are off (vLLM's defaults), under either convention
    laws = "  - {temperature: 0.7, min_p: 0, presence_penalty: 0, frequency_penalty: 0, convention: transformers}\n"
    loaded = load_policy(write_policy(tmp_path, _policy(model_dir, _prompts(tmp_path, ROWS), laws=laws)))
    assert [law.label for law in loaded.policy.laws] == ["t0.7-tf"]
    from gate.policy.model import LawSpec

    assert LawSpec(temperature=0.7, top_k=1_000_000).label == "t0.7-k1000000"  # a usable name, not k1e+06
    # an off repetition penalty is the plain greedy law: listing both is a duplicate
    laws = "  - temperature: 0\n  - {temperature: 0, repetition_penalty: 1.0}\n"
    code, out = _validate(write_policy(tmp_path, _policy(model_dir, _prompts(tmp_path, ROWS), laws=laws)))
    assert code == 2 and "'greedy' is used twice" in out, out


def test_a_prompt_entry_without_any_prompt_format_is_refused(tmp_path, model_dir):
    rows = [{k: v for k, v in row.items() if k != "response_format"} for row in ROWS]
    text = _policy(model_dir, _prompts(tmp_path, rows), workload="  constraints: [none, prompt]\n")
    code, out = _validate(write_policy(tmp_path, text))
    assert code == 2 and "workload.constraints[1]" in out and "no selected prompt has one" in out, out
    assert "Traceback" not in out


def test_two_laws_that_differ_only_in_their_biases_must_be_named(tmp_path, model_dir):
    laws = "  - {temperature: 0.7, logit_bias: {5: 1}}\n  - {temperature: 0.7, logit_bias: {6: 1}}\n"
    code, out = _validate(write_policy(tmp_path, _policy(model_dir, _prompts(tmp_path, ROWS), laws=laws)))
    assert code == 2 and "law[1]" in out and "'t0.7-lb1' is used twice" in out, out


# --- constraints: policy entries, plan expansion ------------------------------------------


def test_every_prompt_runs_under_every_constraint_as_its_own_request(tmp_path, model_dir):
    schema_file = tmp_path / "bill.json"
    schema_file.write_text(json.dumps(SCHEMA))
    workload = ("  constraints:\n    - none\n    - prompt\n"
                "    - {name: bill, type: json_schema, schema_file: bill.json}\n"
                "    - {name: yesno, type: choice, choices: [w1, w2]}\n"
                "    - name: words\n      type: regex\n      pattern: 'w[0-9]+'\n"
                "    - name: inline\n      type: json_schema\n      schema: {type: object, properties: {n: {type: integer}}, required: [n]}\n")
    prompts = _prompts(tmp_path, ROWS)
    plan = validate(write_policy(tmp_path, _policy(model_dir, prompts, laws="  - temperature: 0\n  - temperature: 0.7\n",
                                                   workload=workload)))
    labels = ["none", "prompt", "bill", "yesno", "words", "inline"]
    assert plan.workload.info.constraints == labels
    got = plan.workload.prompts
    assert len(got) == 5 * len(labels)
    first = [p for p in got if p.id.split("#")[0] == got[0].id.split("#")[0]]
    assert [p.constraint for p in first] == labels  # the variants of one prompt are next to each other
    assert all(p.id == f"{p.id.split('#')[0]}#{p.constraint}" for p in got)
    by_id = {p.id: p for p in got}
    assert by_id["a#none"].response_format is None
    assert by_id["a#prompt"].response_format == ResponseFormat.of_schema(SCHEMA)
    assert by_id["b#prompt"].response_format == ResponseFormat.of_schema(SCHEMA)  # OpenAI's json_schema wrapper
    assert by_id["c#prompt"].response_format == ResponseFormat("regex", "w[0-9]+( w[0-9]+)*")
    assert by_id["d#prompt"].response_format == ResponseFormat.of_choices(["w1", "w2"])
    assert by_id["e#prompt"].response_format is None  # no response_format of its own: unconstrained
    assert {by_id[f"{q}#bill"].response_format for q in "abcde"} == {ResponseFormat.of_schema(SCHEMA)}
    assert by_id["e#yesno"].response_format.choices == ["w1", "w2"]
    assert by_id["e#inline"].response_format.schema["required"] == ["n"]
    assert len({p.token_ids for p in got if p.id.startswith("a#")}) == 1  # same prompt tokens, distinct requests
    requests = plan.requests(["lookup"], 1)
    assert len(requests) == 2 * len(got) * 2  # laws x prompts x (fallback, lookup)
    cells = {(r.law.name, r.prompt.id): r.seed for r in requests}
    assert len(set(cells.values())) == len(cells)  # each constraint variant is its own seeded cell
    assert {(r.draft, r.seed) for r in requests if r.prompt.id == "a#none" and r.law.name == "greedy"} == {
        ("fallback", cells[("greedy", "a#none")]), ("lookup", cells[("greedy", "a#none")])}


def test_without_constraints_each_prompt_runs_once_under_its_own_format(tmp_path, model_dir):
    plan = validate(write_policy(tmp_path, _policy(model_dir, _prompts(tmp_path, ROWS))))
    by_id = {p.id: p for p in plan.workload.prompts}
    assert sorted(by_id) == ["a", "b", "c", "d", "e"] and plan.workload.info.constraints == []
    assert all(p.constraint is None for p in by_id.values())
    assert by_id["a"].response_format == ResponseFormat.of_schema(SCHEMA) and by_id["e"].response_format is None


def test_constraint_variants_of_a_context_sweep_keep_both_parts_of_the_id(tmp_path, tiny_model_dir):
    rows = [{"id": f"q{i}", "category": "x", "prompt": " ".join(f"w{(i * 11 + j) % 90}" for j in range(10)),
             "response_format": {"type": "regex", "pattern": "w1"}} for i in range(30)]
    text = _policy(tiny_model_dir, _prompts(tmp_path, rows),
                   workload="  num_prompts: 3\n  context_lengths: [64]\n  constraints: [none, prompt]\n")
    # planned directly: the context builder cuts decoded text, which the byte-level test tokenizer does not round-trip
    prompts, info = plan_workload(load_policy(write_policy(tmp_path, text)), tiny_tokenizer(), tiny_config())
    assert info.constraints == ["none", "prompt"]
    ids = [p.id for p in prompts]
    assert len(ids) == 6 and all(i.split("#")[0].endswith("@64") for i in ids), ids
    assert [p.constraint for p in prompts] == ["none", "prompt"] * 3
    assert all(p.context_length == 64 for p in prompts)
    assert all((p.response_format is not None) == (p.constraint == "prompt") for p in prompts)


@pytest.mark.parametrize("entries, where, words", [
    ("[none, nonee]", "workload.constraints[1]", "did you mean 'none'"),
    ("none", "workload.constraints", "expected a list"),
    ("[]", "workload.constraints", "at least 1"),
    ("[none, none]", "workload.constraints[1]", "'none' is listed twice"),
    ("[prompt, {name: j, type: regex, pattern: a}, {name: j, type: choice, choices: [a]}]", "workload.constraints[2]",
     "'j' is listed twice"),
    ("[{name: prompt, type: regex, pattern: a}]", "workload.constraints[0].name", "reserved"),
    ("[{name: j, type: json_schema}]", "workload.constraints[0].type", "exactly one of schema or schema_file"),
    ("[{name: j, type: json_schema, schema: {type: object}, schema_file: s.json}]", "workload.constraints[0].type",
     "given: schema, schema_file"),
    ("[{name: j, type: regex, pattern: a, choices: [a]}]", "workload.constraints[0].choices", "does not apply to type 'regex'"),
    ("[{name: j, type: regex}]", "workload.constraints[0].type", "needs pattern"),
    ("[{name: j, type: choice, choices: []}]", "workload.constraints[0].choices", "at least 1"),
    ("[{name: j, type: grammar, pattern: a}]", "workload.constraints[0].type", "'json_schema', 'regex' or 'choice'"),
    ("[{name: j, type: json_schema, shema: {}}]", "workload.constraints[0].shema", "did you mean 'schema'"),
    ("[none, 3]", "workload.constraints[1]", "expected a mapping"),
    ("[{name: j, type: json_schema, schema_file: missing.json}]", "workload.constraints[0].schema_file", "schema file not found"),
])
def test_bad_constraint_entries_name_the_entry(tmp_path, model_dir, entries, where, words):
    text = _policy(model_dir, _prompts(tmp_path, ROWS), workload=f"  constraints: {entries}\n")
    code, out = _validate(write_policy(tmp_path, text))
    assert code == 2 and f": {where}: " in out and words in out, out
    assert "Traceback" not in out and out.count("policy.yaml:") == 1, out


@pytest.mark.parametrize("entry, index, words", [
    ("{name: broken, type: regex, pattern: '('}", 1, "unclosed group"),
    ("{name: broken, type: json_schema, schema: {type: objekt}}", 1, "objekt"),
    ("{name: broken, type: json_schema, schema_file: bad.json}", 1, "objekt"),
])
def test_a_constraint_the_grammar_engine_cannot_compile_is_refused_at_validate(tmp_path, model_dir, entry, index, words):
    (tmp_path / "bad.json").write_text(json.dumps({"type": "objekt"}))
    text = _policy(model_dir, _prompts(tmp_path, ROWS), workload=f"  constraints: [none, {entry}]\n")
    code, out = _validate(write_policy(tmp_path, text))
    assert code == 2 and f"workload.constraints[{index}]: " in out and "cannot compile" in out and words in out, out
    assert "Traceback" not in out, out


def test_a_schema_file_that_is_not_a_schema_object_is_refused(tmp_path, model_dir):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text('{"type": \n')
    for name, words in (("list.json", "not a JSON schema object"), ("broken.json", "not valid JSON")):
        text = _policy(model_dir, _prompts(tmp_path, ROWS), workload=f"  constraints: [{{name: j, type: json_schema, schema_file: {name}}}]\n")
        code, out = _validate(write_policy(tmp_path, text))
        assert code == 2 and "workload.constraints[0].schema_file" in out and words in out, out


# --- a JSONL line's response_format ------------------------------------------------------


@pytest.mark.parametrize("fmt, words", [
    ({"type": "json_schema"}, "exactly one of 'schema'"),
    ({"type": "json_schema", "schema": {}, "json_schema": {"schema": {}}}, "exactly one of 'schema'"),
    ({"type": "json_schema", "schema": [1]}, "'schema' must be a JSON object"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "OpenAI's form"),
    ({"type": "regex"}, "needs 'pattern'"),
    ({"type": "regex", "pattern": ""}, "needs 'pattern'"),
    ({"type": "choice", "choices": []}, "non-empty list"),
    ({"type": "choice", "choices": ["a", 3]}, "non-empty list"),
    ({"type": "regexp", "pattern": "a"}, "did you mean 'regex'"),
    ({"pattern": "a"}, "'type'"),
    ({"type": "regex", "pattern": "a", "choices": ["a"]}, "unknown key 'choices' for type 'regex'"),
    ("json", "an object with a 'type'"),
])
def test_a_malformed_response_format_names_the_file_and_line(tmp_path, model_dir, fmt, words):
    rows = [dict(ROWS[4]), {"id": "bad", "prompt": "w1", "response_format": fmt}]
    prompts = _prompts(tmp_path, rows)
    code, out = _validate(write_policy(tmp_path, _policy(model_dir, prompts)))
    assert code == 2 and f"{prompts}:2: response_format: " in out and words in out, out
    assert "workload.path" in out and "Traceback" not in out, out


def test_a_response_format_the_engine_cannot_compile_names_the_file_and_line(tmp_path, model_dir):
    rows = [dict(ROWS[4]), dict(ROWS[0]), {"id": "bad", "prompt": "w1", "response_format": {"type": "regex", "pattern": "w1("}}]
    prompts = _prompts(tmp_path, rows)
    code, out = _validate(write_policy(tmp_path, _policy(model_dir, prompts, workload="  constraints: [none, prompt]\n")))
    assert code == 2 and f"{prompts}:3: response_format: " in out and "cannot compile this regex" in out, out
    # under constraints: [none] only, the prompts' own formats are never run: nothing to refuse
    assert _validate(write_policy(tmp_path, _policy(model_dir, prompts, workload="  constraints: [none]\n")))[0] == 0


# --- rules scoped by constraint -----------------------------------------------------------


def test_rules_scope_and_break_down_by_constraint(tmp_path, model_dir):
    rules = ("  - id: acc\n    metric: acceptance_rate\n    aggregation: pooled\n    comparison: '>='\n    threshold: 0.1\n"
             "    scope: {constraints: [prompt]}\n"
             "  - id: ov\n    metric: overlap\n    aggregation: mean\n    comparison: '>='\n    threshold: 0.1\n    per: constraint\n")
    prompts = _prompts(tmp_path, ROWS)
    ok = _policy(model_dir, prompts, workload="  constraints: [none, prompt]\n", rules=rules)
    assert _validate(write_policy(tmp_path, ok))[0] == 0
    code, out = _validate(write_policy(tmp_path, ok.replace("constraints: [prompt]", "constraints: [promt]")))
    assert code == 2 and "rules[2].scope.constraints[0]" in out and "did you mean 'prompt'" in out, out
    code, out = _validate(write_policy(tmp_path, _policy(model_dir, prompts, rules=rules)))
    assert code == 2 and "workload.constraints declares none" in out, out
    exact = "  - id: ex\n    kind: exactness\n    scope: {constraints: [none]}\n"
    code, out = _validate(write_policy(tmp_path, _policy(model_dir, prompts, workload="  constraints: [none]\n", rules=exact)))
    assert code == 2 and "rules[2].scope" in out and "drafts and laws only" in out, out


