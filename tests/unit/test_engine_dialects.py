"""Engines as their own axis (gate.runners.engines) and the streaming client's pieces
(gate.runners.client): the registry's names and order, each engine's refusal wording, a toy
engine added from this file alone (wire fields, request fields, counters, detection), and
the SSE reader on chunks split anywhere."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from gate.core.law import Law
from gate.core.requests import PlannedPrompt, Request
from gate.records import SpecDecodeCounters
from gate.runners.client.protocol import PROTOCOLS, protocol
from gate.runners.client.sse import SSEReader
from gate.runners.engines.interface import Engine, ServerSnapshot
from gate.runners.engines.registry import detect_engine, engine, engine_names, register, unregister
from gate.runners.openai import Endpoint, OpenAIRunner
from gate.runners.server_metrics import counter_delta, parse_metrics


def test_engine_names_are_the_policys_in_its_order():
    from gate.runners.openai import EndpointSpec

    assert engine_names() == ["generic", "vllm", "llama_cpp", "sglang", "trtllm"]
    assert list(get_args(EndpointSpec.model_fields["engine"].annotation)) == engine_names()
    assert list(get_args(EndpointSpec.model_fields["api"].annotation)) == list(PROTOCOLS)


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(KeyError, match="unknown engine 'vlm'; known: generic, vllm.*did you mean 'vllm'"):
        engine("vlm")
    with pytest.raises(ValueError, match="unknown api 'chat'; known: completions, llama_cpp"):
        protocol("chat")
    with pytest.raises(ValueError, match="unknown engine 'tgi'; known: generic, vllm, llama_cpp, sglang, trtllm"):
        Endpoint("http://127.0.0.1:1", engine="tgi")


def test_an_unverified_engine_names_itself_and_the_verified_ones():
    ((field, why),) = engine("sglang").law_refusals(Law("m", 0.7, min_p=0.1))
    assert field == "min_p"
    assert why == ("engine 'sglang': gate has not verified how it applies this (engines verified: vllm, llama_cpp); "
                   "name the endpoint's engine, or drop the field")


def test_the_native_llama_cpp_api_follows_llama_cpps_dialect_whatever_the_engine():
    ep = Endpoint("http://127.0.0.1:1", api="llama_cpp")
    assert ep.engine == "generic" and ep.dialect is engine("llama_cpp")
    assert Endpoint("http://127.0.0.1:1", engine="sglang").dialect is engine("sglang")


class _Toy(Engine):
    """A toy engine: one counter of steps, its own temperature field, a marker field in every request."""

    name = "toy"
    marker = "toy_steps_total"

    def spec_counters(self, before: ServerSnapshot, after: ServerSnapshot) -> SpecDecodeCounters | None:
        steps = after.increase(before, "toy_steps_total")
        return None if steps is None else SpecDecodeCounters(num_drafts=steps, num_draft_tokens=0, num_accepted_tokens=0)

    def sampling_fields(self, law: Any, penalty_window: int | None = None) -> dict[str, Any]:
        return {"toy_temperature": float(law.temperature)}

    def law_refusals(self, law: Any, fmt: Any = None) -> list[tuple[str, str]]:
        return [("top_k", "toys do not truncate")] if law.top_k is not None else []

    def request_fields(self) -> dict[str, Any]:
        return {"toy": True}


@pytest.fixture
def toy():
    register(_Toy)
    try:
        yield engine("toy")
    finally:
        unregister("toy")


def test_a_new_engine_is_one_class_and_its_registration(toy):
    assert engine_names()[-1] == "toy"
    ep = Endpoint("http://127.0.0.1:1", engine="toy")
    runner = OpenAIRunner({"fallback": ep}, {0})
    law = Law("t", 0.5)
    body = runner.body(ep, Request("fallback", law, PlannedPrompt("p", "c", (1, 2)), 4, 0, 3))
    assert body["toy_temperature"] == 0.5 and body["toy"] is True and body["prompt"] == [1, 2]
    assert "top_k" not in body and "cache_prompt" not in body
    assert runner.law_refusals("fallback", Law("k", 0.5, top_k=3)) == [("top_k", "toys do not truncate")]
    before = parse_metrics("toy_steps_total 3\n", "generic")
    after = parse_metrics("toy_steps_total 10\n", "generic")
    assert detect_engine(after) == "toy"
    assert counter_delta(before, after).num_drafts == 7
    assert counter_delta(parse_metrics("toy_steps_total 3\n", "toy"), parse_metrics("toy_steps_total 4\n", "toy")).num_drafts == 1


def test_llama_cpp_requests_carry_cache_prompt_false_on_either_api():
    law = Law("g", 0.0)
    req = Request("fallback", law, PlannedPrompt("p", "c", (1, 2)), 4, 0, 2**40)
    for api in ("completions", "llama_cpp"):
        ep = Endpoint("http://127.0.0.1:1", api=api, engine="llama_cpp")
        body = OpenAIRunner({"fallback": ep}, {0}).body(ep, req)
        assert body["cache_prompt"] is False and body["repeat_last_n"] == 1 << 17
    body = OpenAIRunner({}, {0}).body(Endpoint("http://127.0.0.1:1", engine="vllm"), req)
    assert "cache_prompt" not in body and body["seed"] == 2**40


@pytest.mark.parametrize("cut", [1, 3, 7, 11, 1000])
def test_sse_payloads_do_not_depend_on_where_chunks_are_cut(cut):
    text = b': ping\r\ndata: {"a": 1}\r\n\r\nevent: x\ndata: line1\ndata:line2\n\nid: 3\ndata: [DONE]\n\ndata: tail\n'
    reader = SSEReader()
    got = [p for i in range(0, len(text), cut) for p in reader.feed(text[i:i + cut])]
    assert got == ['{"a": 1}', "line1\nline2", "[DONE]"] and reader.end() == "tail"


def test_sse_malformed_lines_are_named():
    with pytest.raises(ValueError, match="malformed SSE line: 'garbage'"):
        list(SSEReader().feed(b"data: ok\n\ngarbage\n"))
    reader = SSEReader()
    list(reader.feed(b"data: partial"))
    list(reader.feed(b"\ndata: x\n"))
    assert reader.end() == "partial\nx"
    reader = SSEReader()
    list(reader.feed(b"data: x\n\nda"))
    with pytest.raises(ValueError, match="stream ended inside a line: 'da'"):
        reader.end()
