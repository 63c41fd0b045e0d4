"""The whole declared law on the wire (issue 13): served requests carry every law field and
the prompt's constraint in each engine's own names (vLLM's OpenAI-compatible API, llama.cpp's
native /completion), with llama.cpp's sampler order set to the law's convention; what a
server cannot apply as gate does is refused by `gate validate` at its YAML path and by the
runner before anything is sent; served greedy exactness takes its gaps under the law
(penalties with each position's history, the grammar mask); and, when a llama-server binary
is available, a JSON-schema-constrained greedy request comes back as JSON matching it."""

from __future__ import annotations


import pytest
from served_stub import EOS_ID, Stub

from gate.constraints.interface import ResponseFormat
from gate.core.law import Law
from gate.load.sequential import SEQUENTIAL
from gate.runners.interface import StreamResult
from gate.runners.openai import Endpoint, OpenAIRunner, ServedError
from unit.test_served_law import req  # noqa: F401 - shared with that tier

FULL = Law("full", 0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.2, presence_penalty=0.5,
           frequency_penalty=0.25, logit_bias=((7, 2.5), (9, -100.0)))
GREEDY = Law("greedy", 0.0)
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green"]}}, "required": ["color"],
          "additionalProperties": False}
FORMATS = {"json_schema": ResponseFormat.of_schema(SCHEMA), "regex": ResponseFormat("regex", "[a-z]+"),
           "choice": ResponseFormat.of_choices(["yes", 'a "quoted"\nline'])}


# ---- request bodies ------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["completions", "llama_cpp"])
def test_the_server_receives_the_law_and_the_constraint(api):
    with Stub(ttft_s=0.0, itl_s=0.001) as stub:
        ep = Endpoint(stub.url, api=api, engine="vllm" if api == "completions" else "llama_cpp")
        runner = OpenAIRunner({"fallback": ep}, {EOS_ID})
        # llama.cpp: no truncation under a constraint (law_refusals)
        min_p, top_k = (None, None) if api == "llama_cpp" else (0.05, 40)
        law = Law("t", 0.7, top_k=top_k, min_p=min_p, repetition_penalty=1.2, logit_bias=((7, 2.5),))
        fmt = FORMATS["json_schema"] if api == "llama_cpp" else FORMATS["regex"]
        (result,) = runner.run([req(law, fmt)], SEQUENTIAL)
        assert isinstance(result, StreamResult), result
        body = stub.requests[0]["body"]
    assert body["min_p"] == (min_p or 0.0) and body["top_k"] == (top_k or 0) and "ignore_eos" not in body
    if api == "llama_cpp":
        assert body["repeat_penalty"] == 1.2 and body["logit_bias"] == [[7, 2.5]] and body["json_schema"] == SCHEMA
        assert body["samplers"][0] == "penalties"
    else:
        assert body["repetition_penalty"] == 1.2 and body["logit_bias"] == {"7": 2.5}
        assert body["structured_outputs"] == {"regex": "[a-z]+"}


# ---- refusals ------------------------------------------------------------------------------


def test_a_refused_request_is_not_sent():
    with Stub(ttft_s=0.0, itl_s=0.001) as stub:
        runner = OpenAIRunner({"fallback": Endpoint(stub.url, api="llama_cpp")}, {EOS_ID})
        with pytest.raises(ServedError, match="constraint: llama.cpp takes a JSON schema or a GBNF grammar, not a regex"):
            runner.run([req(GREEDY, FORMATS["regex"])], SEQUENTIAL)
        assert stub.requests == []


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


# ---- a real llama-server -------------------------------------------------------------------


