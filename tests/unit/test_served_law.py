"""The whole declared law on the wire (issue 13): served requests carry every law field and
the prompt's constraint in each engine's own names (vLLM's OpenAI-compatible API, llama.cpp's
native /completion), with llama.cpp's sampler order set to the law's convention; what a
server cannot apply as gate does is refused by `gate validate` at its YAML path and by the
runner before anything is sent; served greedy exactness takes its gaps under the law
(penalties with each position's history, the grammar mask); and, when a llama-server binary
is available, a JSON-schema-constrained greedy request comes back as JSON matching it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from served_stub import EOS_ID

from gate.constraints.interface import Matcher, ResponseFormat
from gate.core.errors import PolicyValueError
from gate.core.law import Law
from gate.load.sequential import SEQUENTIAL
from gate.core.requests import PlannedPrompt, Request
from gate.runners.llama_server import LlamaServerRunner, ServerConfig
from gate.runners.engines.llama_cpp import gbnf_choice
from gate.runners.engines.registry import engine
from gate.runners.openai import Endpoint, OpenAIRunner, ServedError
from gate.core.law import law_logits
from gate.runners.refusals import check_law_refusals as check_served_law

FULL = Law("full", 0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.2, presence_penalty=0.5,
           frequency_penalty=0.25, logit_bias=((7, 2.5), (9, -100.0)))
GREEDY = Law("greedy", 0.0)
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green"]}}, "required": ["color"],
          "additionalProperties": False}
FORMATS = {"json_schema": ResponseFormat.of_schema(SCHEMA), "regex": ResponseFormat("regex", "[a-z]+"),
           "choice": ResponseFormat.of_choices(["yes", 'a "quoted"\nline'])}


def req(law: Law = GREEDY, fmt: ResponseFormat | None = None, first: int = 5, draft: str = "fallback") -> Request:
    return Request(draft, law, PlannedPrompt("p", "c", (first, 1, 2, 3), response_format=fmt), 8, 0, 11)


def vllm(url: str = "http://127.0.0.1:1", api: str = "completions") -> tuple[OpenAIRunner, Endpoint]:
    ep = Endpoint(url, api=api, engine="vllm")
    return OpenAIRunner({"fallback": ep}, {EOS_ID}), ep


def llama(ctx_size: int = 512) -> tuple[LlamaServerRunner, Endpoint]:
    runner = LlamaServerRunner({"fallback": ServerConfig("target.gguf")}, "/nonexistent/llama-server", {EOS_ID},
                               ctx_size=ctx_size)
    return runner, Endpoint("http://127.0.0.1:1", api="llama_cpp", engine="llama_cpp")


# ---- request bodies ------------------------------------------------------------------------


def test_vllm_body_carries_every_law_field_in_vllms_names():
    runner, ep = vllm()
    body = runner.body(ep, req(FULL))
    assert (body["temperature"], body["top_k"], body["top_p"], body["min_p"]) == (0.7, 40, 0.9, 0.05)
    assert (body["repetition_penalty"], body["presence_penalty"], body["frequency_penalty"]) == (1.2, 0.5, 0.25)
    assert body["logit_bias"] == {"7": 2.5, "9": -100.0}
    assert body["ignore_eos"] is True and "samplers" not in body and "response_format" not in body


def test_vllm_body_sends_off_values_so_no_server_default_applies():
    runner, ep = vllm()
    body = runner.body(ep, req(Law("t", 0.8)))
    assert (body["top_k"], body["top_p"], body["min_p"]) == (0, 1.0, 0.0)
    assert (body["repetition_penalty"], body["presence_penalty"], body["frequency_penalty"]) == (1.0, 0.0, 0.0)
    assert "logit_bias" not in body
    greedy = runner.body(ep, req(GREEDY))
    assert (greedy["temperature"], greedy["top_k"]) == (0.0, 1)


@pytest.mark.parametrize("kind, expected", [
    ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "gate_constraint", "schema": SCHEMA}}}),
    ("regex", {"structured_outputs": {"regex": "[a-z]+"}}),
    ("choice", {"structured_outputs": {"choice": ["yes", 'a "quoted"\nline']}}),
])
def test_vllm_body_carries_the_constraint_and_no_ignore_eos(kind, expected):
    runner, ep = vllm()
    body = runner.body(ep, req(FULL, FORMATS[kind]))
    for key, value in expected.items():
        assert body[key] == value
    assert "ignore_eos" not in body  # the grammar ends the output


def test_llama_body_carries_every_law_field_with_the_sampler_order_of_its_convention():
    runner, ep = llama(ctx_size=512)
    body = runner.body(ep, req(FULL))
    assert (body["temperature"], body["top_k"], body["top_p"], body["min_p"]) == (0.7, 40, 0.9, 0.05)
    assert (body["repeat_penalty"], body["presence_penalty"], body["frequency_penalty"]) == (1.2, 0.5, 0.25)
    assert body["repeat_last_n"] == 512  # the slot context: the whole prompt and output
    assert body["logit_bias"] == [[7, 2.5], [9, -100.0]]
    assert body["samplers"] == ["penalties", "temperature", "min_p", "top_k", "top_p"]
    assert body["mirostat"] == 0 and body["dynatemp_range"] == 0.0
    tf = Law("tf", 0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.2, convention="transformers")
    assert runner.body(ep, req(tf))["samplers"] == ["penalties", "temperature", "top_k", "top_p", "min_p"]
    greedy = runner.body(ep, req(GREEDY))
    assert greedy["samplers"] == ["penalties", "top_k"] and greedy["top_k"] == 1 and greedy["logit_bias"] == []
    off = runner.body(ep, req(Law("t", 0.8)))
    assert (off["top_k"], off["top_p"], off["min_p"], off["repeat_penalty"]) == (0, 1.0, 0.0, 1.0)


def test_llama_body_carries_a_json_schema_or_a_gbnf_choice():
    runner, ep = llama()
    body = runner.body(ep, req(GREEDY, FORMATS["json_schema"]))
    assert body["json_schema"] == SCHEMA and "ignore_eos" not in body
    body = runner.body(ep, req(GREEDY, FORMATS["choice"]))
    assert body["grammar"] == 'root ::= "yes" | "a \\"quoted\\"\\nline"'
    assert gbnf_choice(["\\", "é\x01\t"]) == 'root ::= "\\\\" | "é\\x01\\t"'


# ---- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize("semantics, law, kind, fields", [
    ("llama_cpp", FULL, None, ["presence_penalty", "frequency_penalty"]),
    ("llama_cpp", Law("r", 0.7, repetition_penalty=1.3, logit_bias=((1, 1.0),)), None, []),
    ("llama_cpp", GREEDY, "regex", ["constraint"]),
    ("llama_cpp", GREEDY, "json_schema", []),
    ("llama_cpp", Law("t", 0.7, repetition_penalty=1.2), "choice", []),  # no truncation: rejection = masking
    ("llama_cpp", Law("t", 0.7, top_k=5, top_p=0.9, min_p=0.1), "choice", ["top_k", "top_p", "min_p"]),
    ("llama_cpp", Law("t", 0.7, top_p=1.0), "choice", []),
    ("llama_cpp", Law("tf", 0.7, top_k=5, min_p=0.1, convention="transformers"), None, []),
    ("vllm", FULL, "regex", []),
    ("vllm", Law("tf", 0.7, top_p=0.9, min_p=0.1, convention="transformers"), None, ["convention"]),
    ("vllm", Law("tf", 0.7, min_p=0.1, convention="transformers"), None, []),
    ("vllm", Law("b", 0.7, logit_bias=((1, -1000.0),)), None, ["logit_bias"]),
    ("sglang", FULL, "choice", ["min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
                                "constraint"]),
    ("generic", Law("t", 0.7, top_k=5, top_p=0.9), None, []),
])
def test_law_refusals_name_what_the_server_cannot_apply(semantics, law, kind, fields):
    assert [f for f, _ in engine(semantics).law_refusals(law, FORMATS.get(kind))] == fields


def test_llama_server_refuses_before_starting_a_server():
    runner, _ = llama()
    with pytest.raises(ServedError, match="presence_penalty"):
        runner.run([req(Law("pp", 0.7, presence_penalty=0.5))], SEQUENTIAL)  # the binary does not exist: not reached


def test_check_served_law_names_the_law_field_and_the_constraint_path():
    runner, _ = llama()
    prompt = PlannedPrompt("a#rx", "c", (1, 2), response_format=FORMATS["regex"], constraint="rx")
    policy = SimpleNamespace(law=[object(), object()], drafts={},
                             workload=SimpleNamespace(constraints=["none", SimpleNamespace(name="rx")]))
    plan = SimpleNamespace(policy=policy, laws=[GREEDY, Law("f", 0.7, frequency_penalty=0.1)],
                           workload=SimpleNamespace(prompts=[PlannedPrompt("a", "c", (1, 2))]))
    with pytest.raises(PolicyValueError) as e:
        check_served_law(plan, runner)  # type: ignore[arg-type]
    assert e.value.path == "law[1].frequency_penalty"
    plan.laws = [GREEDY]
    plan.workload.prompts.append(prompt)
    with pytest.raises(PolicyValueError) as e:
        check_served_law(plan, runner)  # type: ignore[arg-type]
    assert e.value.path == "workload.constraints[1]" and "regex" in str(e.value)


SERVED = """\
version: 1
target: {{model: {model}, device: cpu}}
drafts:
  lookup: {{kind: prompt_lookup, num_draft_tokens: 3}}
law: {law}
runner:
  kind: openai
  endpoints:
    fallback: {{base_url: 'http://127.0.0.1:1', {endpoint}}}
    lookup: {{base_url: 'http://127.0.0.1:1', {endpoint}}}
workload:
  source: jsonl
  path: {prompts}
  max_new_tokens: 8
  seed: 0
  chat_template: false
{constraints}
rules:
  - {{id: s, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 1.0x}}
"""
CHOICE = "  constraints: [none, {name: yn, type: choice, choices: ['yes', 'no']}]"
REGEX = "  constraints: [{name: rx, type: regex, pattern: '[a-z]+'}]"


# ---- exactness under the law ---------------------------------------------------------------


class _OnlyAfter(Matcher):
    """Allows only token `token` at every position (a toy grammar)."""

    def __init__(self, vocab: int, token: int):
        self.vocab, self.token = vocab, token

    def allowed(self, output_ids):
        if any(t != self.token for t in output_ids):
            return None
        mask = torch.zeros(self.vocab, dtype=torch.bool)
        mask[self.token] = True
        return mask


def test_law_logits_apply_bias_penalty_with_each_rows_history_and_the_grammar():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [2.0, 1.0, 0.5, -1.0]])
    law = Law("g", 0.0, repetition_penalty=2.0, logit_bias=((2, 1.0),))
    ids = [3, 0, 1]  # prompt [3]; rows: the token after [3], then after [3, 0]
    out = law_logits(logits, law.bind(1), ids, 1)
    # row 0: seen {3}: 2, 1, 1.5, -2 ; row 1: seen {3, 0}: 1, 1, 1.5, -2
    expected = torch.tensor([[2.0, 1.0, 1.5, -2.0], [1.0, 1.0, 1.5, -2.0]])
    diff = out - out[:, :1]
    assert torch.allclose(diff, expected - expected[:, :1], atol=1e-5)
    masked = law_logits(logits, law.bind(1, _OnlyAfter(4, 0)), ids, 1)
    assert torch.isfinite(masked[0, 0]) and torch.isneginf(masked[0, 1:]).all()
    # row 1 follows output [0], which the toy grammar allows: still only token 0
    assert torch.isneginf(masked[1, 1:]).all()


def test_gaps_under_a_grammar_leave_the_fallbacks_forbidden_tokens_out_of_the_control():
    from gate.exactness.fallback import _gaps

    logits = torch.tensor([[1.0, 3.0, 0.0, 0.0], [0.5, 2.0, 0.0, 0.0]])
    # the oracle binds the law as TargetOracle.bind does: the toy grammar for a constrained prompt
    oracle = SimpleNamespace(target_logits=lambda ids, start: logits[:len(ids) - start],
                             bind=lambda law, n, fmt: law.bind(n, _OnlyAfter(4, 0) if fmt is not None else None))
    prompts = {"p": PlannedPrompt("p", "c", (3,), response_format=FORMATS["choice"])}
    fallback = {("p",): SimpleNamespace(prompt_id="p", output_ids=[0, 1])}  # token 1 is outside the toy grammar
    rec = object()
    found = {("p",): [(rec, 0, 2)]}  # a draft runner diverged to token 2, which the grammar forbids
    control, outside = _gaps(oracle, prompts, fallback, found, GREEDY)
    # row 0: only token 0 allowed, the fallback's 0 is the masked argmax (gap 0); row 1: its 1 is forbidden
    assert control == 0.0 and outside == 1
    assert found[("p",)] == [(rec, 0, 2, float("inf"))]
    # without a constraint the raw logits decide: the fallback's 0 lies 2.0 below the top at row 0
    prompts["p"] = PlannedPrompt("p", "c", (3,))
    found = {("p",): [(rec, 0, 2)]}
    control, outside = _gaps(oracle, prompts, fallback, found, GREEDY)
    assert control == 2.0 and outside == 0 and found[("p",)] == [(rec, 0, 2, 3.0)]


# ---- a real llama-server -------------------------------------------------------------------


