"""The tests of tests/unit/test_served_law.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations


import pytest
from served_stub import EOS_ID, Stub

from gate.core.law import Law
from gate.load.sequential import SEQUENTIAL
from gate.runners.interface import StreamResult
from gate.runners.openai import Endpoint, OpenAIRunner, ServedError
from unit.test_served_law import req  # noqa: F401 - shared with that tier
from unit.test_served_law import FORMATS, GREEDY, SCHEMA


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


# ---- exactness under the law ---------------------------------------------------------------


# ---- a real llama-server -------------------------------------------------------------------


