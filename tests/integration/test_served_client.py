"""The OpenAI-compatible served runner (issue 15) against tests/served_stub.py on 127.0.0.1:
stream parsing for each protocol, per-token times and bursts independent of how tokens are
chunked into events, queue time, concurrency, every fault as one request's ServedError while
the others succeed (and nothing hangs), the API key, stop reasons, and server counters."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from served_stub import EOS_ID, FIRST_ID, Stub

from gate.core.law import Law
from gate.load.closed import ClosedLoop
from gate.load.open import OpenLoop
from gate.load.sequential import SEQUENTIAL
from gate.core.requests import PlannedPrompt, Request
from gate.runners.interface import StreamResult
from gate.runners.client.stream import bursts
from gate.runners.openai import UNKNOWN_ID, Endpoint, OpenAIRunner, ServedError
from gate.runners.registry import register
from gate.runners.server_metrics import counter_delta

DATA = Path(__file__).resolve().parents[1] / "data" / "served"
GREEDY = Law("greedy", 0.0)


@pytest.fixture(scope="module")
def stub():
    with Stub(ttft_s=0.02, itl_s=0.01) as s:
        yield s


@pytest.fixture(autouse=True)
def fresh(stub: Stub):
    saved = dict(stub.__dict__)
    stub.reset()
    yield
    for k in ("ttft_s", "itl_s", "tokens_per_event", "with_ids", "draft_n", "draft_n_accepted", "faults",
              "split_events", "replay", "metrics_text"):
        setattr(stub, k, saved[k])


def req(first: int = 5, n: int = 8, draft: str = "fallback", law: Law = GREEDY, seed: int = 11, rep: int = 0) -> Request:
    return Request(draft, law, PlannedPrompt(f"p{first}-{rep}", "c", (first, 1, 2, 3)), n, rep, seed)


def runner(stub: Stub, api: str = "completions", **kw) -> OpenAIRunner:
    ep_kw = {k: kw.pop(k) for k in ("metrics_url", "engine", "api_key_env", "model") if k in kw}
    return OpenAIRunner({"fallback": Endpoint(stub.url, api=api, **ep_kw), "d": Endpoint(stub.url, api=api)}, {EOS_ID}, **kw)


def ok(r) -> StreamResult:
    assert isinstance(r, StreamResult), r
    return r


@pytest.mark.parametrize("api", ["completions", "llama_cpp"])
def test_stream_gives_ids_times_and_the_request_body(stub: Stub, api: str) -> None:
    stub.draft_n, stub.draft_n_accepted = 6, 4
    before = time.time()
    r = ok(runner(stub, api, model="m").run([req(n=8, seed=2**62 + 5)], SEQUENTIAL)[0])
    assert r.output_ids == list(range(FIRST_ID, FIRST_ID + 8))
    assert len(r.token_times_ms) == 8 and r.token_times_ms == sorted(r.token_times_ms)
    # schedule: first token 20 ms after arrival, then one every 10 ms
    assert 15 < r.token_times_ms[0] < 150
    # the schedule is absolute (no drift): 7 gaps of 10 ms from the first token to the last
    assert 50 < r.token_times_ms[-1] - r.token_times_ms[0] < 150
    assert sum(r.step_committed) == 8 and len(r.step_committed) >= 5 and r.stop_reason == "length"
    assert r.e2el_ms >= r.token_times_ms[-1] and before <= r.started_s <= time.time()
    assert r.queue_ms is not None and r.queue_ms < 30
    body = stub.requests[0]["body"]
    assert body["prompt"] == [5, 1, 2, 3] and body["stream"] is True and body["temperature"] == 0.0 and body["top_k"] == 1
    assert body["ignore_eos"] is True and body["model"] == "m"
    if api == "llama_cpp":
        assert stub.requests[0]["path"] == "/completion"
        assert body["n_predict"] == 8 and body["return_tokens"] is True and body["cache_prompt"] is False
        assert 0 <= body["seed"] < 0xFFFFFFFF and body["seed"] == (2**62 + 5) % 0xFFFFFFFF
        assert (r.server_draft_tokens, r.server_accepted_tokens) == (6, 4)
    else:
        assert stub.requests[0]["path"] == "/v1/completions"
        assert body["max_tokens"] == 8 and body["seed"] == 2**62 + 5 and body["return_token_ids"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert r.server_draft_tokens is None


def test_sampling_laws_are_sent(stub: Stub) -> None:
    law = Law("t0.7", 0.7, top_k=40, top_p=0.9)
    ok(runner(stub, ignore_eos=False).run([req(law=law)], SEQUENTIAL)[0])
    body = stub.requests[0]["body"]
    assert (body["temperature"], body["top_k"], body["top_p"]) == (0.7, 40, 0.9) and "ignore_eos" not in body


@pytest.mark.parametrize("api", ["completions", "llama_cpp"])
def test_token_count_and_bursts_do_not_depend_on_chunking(stub: Stub, api: str) -> None:
    # steps 40 ms apart, bursts cut at 5 ms: robust to a busy machine delaying the client a little
    stub.tokens_per_event, stub.itl_s = 4, 0.04
    per_step = ok(runner(stub, api, burst_gap_ms=5.0).run([req(n=10)], SEQUENTIAL)[0])
    stub.split_events = True  # the same steps, one event per token sent back to back (as llama-server does)
    per_token = ok(runner(stub, api, burst_gap_ms=5.0).run([req(n=10)], SEQUENTIAL)[0])
    assert len(stub.requests) == 2
    for r in (per_step, per_token):
        assert r.output_ids == list(range(FIRST_ID, FIRST_ID + 10))
        assert r.step_committed == [4, 4, 2]
    assert bursts([0.0, 0.0, 0.5, 3.0, 3.2, 9.0], 1.0) == [3, 2, 1] and bursts([], 1.0) == []


def test_closed_loop_never_exceeds_its_concurrency(stub: Stub) -> None:
    stub.itl_s = 0.002
    out = runner(stub).run([req(rep=i, n=4) for i in range(12)], ClosedLoop(concurrency=3))
    assert all(isinstance(r, StreamResult) for r in out)
    assert stub.max_in_flight == 3 and len(stub.requests) == 12
    assert max(ok(r).queue_ms for r in out) < 30


def test_open_loop_cap_shows_up_as_queue_time(stub: Stub) -> None:
    # each request takes ~20 + 3*10 = 50 ms; six arrive within ~6 ms; two in flight at most
    load = OpenLoop(request_rate=1000.0, burstiness=1e6, concurrency=2)
    out = [ok(r) for r in runner(stub).run([req(rep=i, n=4) for i in range(6)], load)]
    assert stub.max_in_flight == 2
    q = [r.queue_ms for r in out]
    assert max(q[:2]) < 30 and 30 < min(q[2:4]) and min(q[4:]) > 70
    # TTFT is measured from the send, not from the arrival
    assert all(r.token_times_ms[0] < 150 for r in out)
    # without a cap every arrival is sent at once (the server queues, not gate)
    stub.reset()
    out = [ok(r) for r in runner(stub).run([req(rep=i, n=4) for i in range(6)], replace(load, concurrency=None))]
    assert stub.max_in_flight == 6 and max(r.queue_ms for r in out) < 30


def test_each_fault_is_one_requests_error_and_nothing_hangs(stub: Stub) -> None:
    faults = {20: "http500", 21: "http400", 22: "malformed", 23: "no_final", 24: "drop", 25: "slow", 26: "error_event"}
    stub.faults = faults
    reqs = [req(first=f, n=6) for f in (5, *faults, 6)]
    t = time.perf_counter()
    out = runner(stub, request_timeout_s=1.0).run([replace(r, draft="d") for r in reqs], ClosedLoop(concurrency=4))
    assert time.perf_counter() - t < 5
    assert ok(out[0]).output_ids == ok(out[-1]).output_ids == list(range(FIRST_ID, FIRST_ID + 6))
    expected = {"http500": "HTTP 500: .*internal error", "http400": "HTTP 400: .*prompt too long",
                "malformed": "malformed SSE event: .*this is not json", "no_final": "stream ended without the final event",
                "drop": r"connection reset mid-stream \(RemoteProtocolError: .*2 event", "slow": "timed out mid-stream after 1 s",
                "error_event": "server error mid-stream: stub: out of memory"}
    for r, fault in zip(out[1:-1], faults.values()):
        assert isinstance(r, ServedError), (fault, r)
        assert r.runner == "d" and r.url == f"{stub.url}/v1/completions"
        assert str(r).startswith(f"runner 'd' at {stub.url}/v1/completions: ")
        assert re.search(expected[fault], r.what), (fault, r.what)


def test_sse_framing_other_fields_comments_and_garbage(stub: Stub) -> None:
    event = 'data: {"choices": [{"index": 0, "text": "a", "token_ids": [7], "finish_reason": "length"}]}'
    stub.replay = {42: f"event: message\nid: 1\n: ping\n{event}\r\n\r\ndata: [DONE]\n\n",
                   43: f"{event}\n\nthis is not an SSE line\n\n",
                   44: 'data: {"choices": [{"index": 0, "text": "a", "token_ids": "7"}]}\n\n'}
    good, garbage, bad_ids = runner(stub).run([req(first=42), req(first=43), req(first=44)], ClosedLoop(concurrency=3))
    assert ok(good).output_ids == [7] and good.stop_reason == "length"
    assert isinstance(garbage, ServedError) and "malformed SSE line: 'this is not an SSE line'" in garbage.what
    assert isinstance(bad_ids, ServedError) and "token ids are not a list of ints" in bad_ids.what


def test_a_server_that_is_down_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    r = OpenAIRunner({"fallback": Endpoint(f"http://127.0.0.1:{port}")}, set(), request_timeout_s=2.0)
    out = r.run([req(), req(rep=1)], ClosedLoop(concurrency=2))
    assert all(isinstance(e, ServedError) and "connection refused" in e.what and f":{port}" in str(e) for e in out)


def test_api_key_goes_in_the_header_and_nowhere_else(stub: Stub, monkeypatch) -> None:
    secret = "sk-test-5ecret-value"
    monkeypatch.setenv("GATE_TEST_KEY", secret)
    stub.faults = {21: "http400"}
    r = runner(stub, api_key_env="GATE_TEST_KEY")
    good, bad = r.run([req(), req(first=21)], ClosedLoop(concurrency=2))
    assert [q["headers"].get("authorization") for q in stub.requests] == [f"Bearer {secret}"] * 2
    for thing in (good, bad, r, r.endpoints):
        assert secret not in repr(thing) and secret not in str(thing)
    monkeypatch.delenv("GATE_TEST_KEY")
    with pytest.raises(ServedError, match="GATE_TEST_KEY is not set"):
        runner(stub, api_key_env="GATE_TEST_KEY").run([req()], SEQUENTIAL)


@pytest.mark.parametrize("api", ["completions", "llama_cpp"])
def test_stop_reasons(stub: Stub, api: str) -> None:
    stub.faults = {30: "eos", 31: "word"}
    eos, word, length = runner(stub, api).run([req(first=30, n=5), req(first=31, n=5), req(n=5)], ClosedLoop(concurrency=3))
    assert ok(eos).stop_reason == "eos" and eos.output_ids[-1] == EOS_ID
    assert (ok(word).stop_reason, word.stop_string) == ("stop", "</end>")
    assert ok(length).stop_reason == "length"


def test_without_token_ids_counts_come_from_usage(stub: Stub) -> None:
    stub.with_ids, stub.tokens_per_event, stub.itl_s = False, 2, 0.04
    r = ok(runner(stub, burst_gap_ms=5.0).run([req(n=6)], SEQUENTIAL)[0])
    assert r.output_ids == [UNKNOWN_ID] * 6 and len(r.token_times_ms) == 6 and r.step_committed == [2, 2, 2]
    # count_tokens weights the events by their text (weights 4, 1, 1); the total still comes from usage
    r2 = ok(runner(stub, burst_gap_ms=5.0, count_tokens=lambda text: 4 if "t10" in text else 1).run([req(n=6)], SEQUENTIAL)[0])
    assert len(r2.output_ids) == 6 and r2.step_committed == [4, 1, 1]
    stub.replay = {41: 'data: {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'}
    err = runner(stub).run([req(first=41)], SEQUENTIAL)[0]
    assert isinstance(err, ServedError) and "no token ids and no usage" in err.what


@pytest.mark.parametrize("engine,api,n,ids,reason,server", [
    ("vllm", "completions", 6, [791, 6864, 315, 9822, 374, 12366], "length", (None, None)),
    ("llama_cpp", "llama_cpp", 6, [791, 6864, 315, 9822, 374, 12366], "length", (8, 3)),
    ("sglang", "completions", 6, [UNKNOWN_ID] * 6, "eos", (None, None)),
    ("trtllm", "completions", 6, [UNKNOWN_ID] * 6, "length", (None, None)),
])
def test_each_engines_documented_stream(stub: Stub, engine: str, api: str, n: int, ids: list[int], reason: str,
                                        server: tuple) -> None:
    stub.replay = {40: (DATA / f"{engine}_stream.txt").read_text()}
    stub.itl_s = 0.03
    r = ok(runner(stub, api, burst_gap_ms=5.0).run([req(first=40, n=n)], SEQUENTIAL)[0])
    assert r.output_ids == ids and r.stop_reason == reason
    assert (r.server_draft_tokens, r.server_accepted_tokens) == server
    if engine == "vllm":
        assert r.step_committed == [1, 1, 2, 2]  # the 2-token chunks are 2-token bursts


def test_the_chat_api_is_unknown_and_one_run_serves_one_runner(stub: Stub) -> None:
    with pytest.raises(ValueError, match="unknown api 'chat'; known: completions, llama_cpp"):
        runner(stub, "chat")
    with pytest.raises(ValueError, match="one runner name; got d, fallback"):
        runner(stub).run([req(), req(draft="d")], SEQUENTIAL)
    with pytest.raises(ValueError, match="no endpoint for runner 'x'"):
        runner(stub).run([req(draft="x")], SEQUENTIAL)
    with pytest.raises(ValueError, match="at most 4096"):
        runner(stub).run([req()], ClosedLoop(concurrency=5000))
    assert runner(stub).run([], SEQUENTIAL) == []


def test_counters_and_server_info(stub: Stub) -> None:
    r = runner(stub, "llama_cpp", metrics_url=f"{stub.url}/metrics", engine="llama_cpp")
    stub.metrics_text = (DATA / "llama_cpp_metrics_before.txt").read_text()
    before = r.counters("fallback")
    stub.metrics_text = (DATA / "llama_cpp_metrics_after.txt").read_text()
    after = r.counters("fallback")
    d = counter_delta(before, after)
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens) == (100, 400, 250)
    assert r.counters("d") is None  # no metrics_url
    assert r.server_info("fallback") == "llama.cpp b0000-stub"
    assert runner(stub).server_info("fallback") == "generic 0.0.0-stub, model stub-model"
    stub.metrics_text = "<html>oops</html>"
    with pytest.raises(ServedError, match="not Prometheus"):
        r.counters("fallback")
    down = OpenAIRunner({"fallback": Endpoint("http://127.0.0.1:9", metrics_url="http://127.0.0.1:9/metrics")}, set())
    with pytest.raises(ServedError, match="metrics scrape failed"):
        down.counters("fallback")


def test_ctrl_c_propagates_and_done_keeps_what_ended(stub: Stub) -> None:
    runner(stub).run([req(n=1, rep=k) for k in range(3)], ClosedLoop(concurrency=3))  # its workers started (~0.5 s)
    stub.faults = {50: "slow"}
    ended: list[int] = []
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        runner(stub, request_timeout_s=30).run([req(n=3), req(first=50), req(first=50)], ClosedLoop(concurrency=3),
                                               lambda i, r: ended.append(i))
    timer.join()
    assert ended == [0] and time.perf_counter() - t < 3


def test_responses_are_read_once_the_requests_have_ended(stub: Stub) -> None:
    """Parsing takes gate's CPU (~0.5 ms per 32-event stream): the client reads the streams
    after the load point's requests have ended, not while others are in flight. `ended`
    comes as each ends; what it raises stops the sending, and what ended is still read."""
    seen: list[tuple[str, int, float]] = []
    reqs = [req(first=5 + k, n=4) for k in range(6)]
    results = runner(stub).run(reqs, ClosedLoop(concurrency=2), lambda i, r: seen.append(("done", i, time.perf_counter())),
                               lambda i: seen.append(("ended", i, time.perf_counter())))
    ends = [t for what, _, t in seen if what == "ended"]
    dones = [(i, t) for what, i, t in seen if what == "done"]
    assert len(ends) == 6 and len(dones) == 6 and all(isinstance(r, StreamResult) for r in results)
    assert min(t for _, t in dones) > max(ends)  # every response read after the last request ended
    assert [i for i, _ in dones] == [i for what, i, _ in seen if what == "ended"]  # in the order they ended

    class OutOfTime(BaseException):
        pass

    def stop_after_two(i: int) -> None:
        stop_after_two.n += 1
        if stop_after_two.n == 2:
            raise OutOfTime

    stop_after_two.n = 0
    read: list[int] = []
    with pytest.raises(OutOfTime):
        runner(stub).run(reqs, ClosedLoop(concurrency=1), lambda i, r: read.append(i), stop_after_two)
    # two read; the worker's slot had begun the third as the second ended, the rest were never sent
    assert read == [0, 1] and len(stub.requests) <= 6 + 3


def test_the_runner_is_registered() -> None:
    from gate.runners.registry import runner_class

    assert runner_class("openai") is OpenAIRunner
    caps = OpenAIRunner.capabilities
    assert caps.server_counters and caps.seeding and not caps.step_counters and caps.max_concurrency == 4096
    with pytest.raises(ValueError, match="already registered"):
        register("openai")(type("Other", (OpenAIRunner,), {}))
