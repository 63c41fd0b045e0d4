"""Server processes gate starts and stops itself (runner kinds llama_server, vllm): one
process (tree) per runner name, one up at a time, measured through the OpenAI-compatible
runner.

run() for a runner whose server is not up stops the one that is (its peak RSS read first)
and starts the runner's own, on 127.0.0.1 at a free port. It is ready when its health path
answers 200 while the process lives and the server names the model gate started
(`_is_ours`: a stranger on a reused port is never measured).

The process is in its own session (start_new_session): a Ctrl-C to gate does not reach it;
close() stops it (SIGTERM to its process group, SIGKILL after STOP_GRACE_S), and so does an
interpreter exit (atexit). A gate killed by a signal runs no atexit handler, but on Linux the
kernel sends the server SIGTERM when the thread that started it (the main thread) ends
(PR_SET_PDEATHSIG). Its output goes to a log file (log_dir, or a temporary folder removed at
close); failures quote its last LOG_TAIL_LINES lines.

A kind subclasses ManagedServerRunner and says: its program's name, the command line of a
runner, its environment, the Endpoint of a started server, how it knows the server is its
own, and how its log says a port was taken.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from gate.core.requests import Request
from gate.load.interface import LoadStrategy
from gate.runners.client.transport import ServedError
from gate.runners.interface import Done, Ended, RequestResult
from gate.runners.openai import Endpoint, OpenAIRunner
from gate.runners.server_metrics import ServerSnapshot

STOP_GRACE_S = 10.0  # SIGTERM -> SIGKILL
LOG_TAIL_LINES = 20
HEALTH_POLL_S = 0.05
HOST = "127.0.0.1"

_LIVE: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + 5.0
    for proc in procs:
        _wait_group(proc, deadline)


def _group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is left (a zombie counts until reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_group(proc: subprocess.Popen[bytes], deadline: float) -> None:
    """Wait for `proc` and every other process of its group (its own: start_new_session) until
    `deadline` (time.monotonic()), then SIGKILL the group and reap `proc`. A server that runs
    children (vLLM's engine core) is gone only when the whole group is."""
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is None or _group_alive(proc.pid):
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


atexit.register(_stop_all_at_exit)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send `sig` to the process group of `proc` (its own: start_new_session)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on at `host` now (the kernel's pick; another process may
    still take it before the server binds: the runner retries once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def vm_hwm_bytes(pid: int) -> int | None:
    """Peak resident set size of process `pid` so far (VmHWM in /proc/<pid>/status), bytes;
    None where /proc is missing (not Linux) or the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmHWM:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def process_tree(pid: int) -> list[int]:
    """`pid` and every descendant of it alive now (Linux /proc/<pid>/task/*/children), parents
    first; [pid] where /proc is missing."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except (OSError, ValueError):
                pass
    return out


def tree_peak_rss_bytes(pid: int) -> int | None:
    """The sum over `pid` and its live descendants of each process's peak resident set
    (VmHWM), bytes: an upper bound on the tree's resident peak (each process peaks at its own
    moment; pages shared between them count once per process). None when `pid` is gone."""
    own = vm_hwm_bytes(pid)
    if own is None:
        return None
    return own + sum(v for p in process_tree(pid)[1:] if (v := vm_hwm_bytes(p)) is not None)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class _Server:
    """A started server: its runner name, process, port, command and log."""

    runner: str
    proc: subprocess.Popen[bytes]
    port: int
    command: list[str]
    log_path: Path
    started_s: float  # time.perf_counter() at spawn
    ready_s: float | None = None  # seconds from spawn to /health 200

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"


class ManagedServerRunner(OpenAIRunner):
    """Servers started and stopped by gate, one runner name at a time (see the module
    docstring). servers: runner name ("fallback" or a draft name) -> the kind's own server
    configuration; binary: the executable; parallel: the most requests in flight;
    startup_timeout_s: spawn -> health 200, seconds; log_dir: where server logs go (None: a
    temporary folder removed at close). The other arguments are OpenAIRunner's.

    Raises ValueError for parallel < 1 or an empty `servers`. Server failures raise
    ServedError naming the runner: binary missing, not executable, port in use twice, the
    server exited before it was ready (its log tail quoted), startup timeout; a server that
    died during run() turns the failed requests' results into a ServedError saying so."""

    program = "server"  # its name in messages
    health_path = "/health"
    build_hint = ""  # how to get the binary, for the "binary missing" message

    def __init__(
        self,
        servers: dict[str, Any],
        binary: str,
        eos_token_ids: set[int],
        parallel: int = 1,
        startup_timeout_s: float = 120.0,
        request_timeout_s: float = 120.0,
        ignore_eos: bool = True,
        burst_gap_ms: float = 1.0,
        log_dir: str | None = None,
        max_consecutive_failures: int = 3,
    ):
        if not servers:
            raise ValueError(f"{self.program} runner needs at least one server")
        if parallel < 1:
            raise ValueError(f"{self.program} parallel must be >= 1, got {parallel}")
        super().__init__(
            endpoints={},
            eos_token_ids=eos_token_ids,
            request_timeout_s=request_timeout_s,
            ignore_eos=ignore_eos,
            burst_gap_ms=burst_gap_ms,
            max_consecutive_failures=max_consecutive_failures,
        )
        self.servers = dict(servers)
        self.binary = binary
        self.parallel = parallel
        self.startup_timeout_s = startup_timeout_s
        self.log_dir = log_dir
        self.capabilities = replace(type(self).capabilities, max_concurrency=parallel)
        self._server: _Server | None = None
        self._commands: dict[str, list[str]] = {}
        self._peak_rss: dict[str, int] = {}
        self._startup_s: dict[str, float] = {}
        self._start_failed: dict[str, ServedError] = {}
        self._tmp_logs: tempfile.TemporaryDirectory[str] | None = None
        self._spawns = 0

    @classmethod
    def binary_of(cls, plan: Any, found: str | None, where: str, build: str) -> str:
        """The executable a plan names (runner.binary, relative to the policy's folder) or else
        `found`. Raises PolicyValueError at runner.binary when it is not an executable file,
        saying where gate looked (`where`) and how to build one (`build`)."""
        from gate.core.errors import PolicyValueError

        spec = plan.policy.runner
        binary = str(plan.resolve(spec.binary)) if spec.binary else found
        if not binary or not Path(binary).is_file() or not os.access(binary, os.X_OK):
            said = f"{binary} is not an executable file" if binary else f"none in {where}"
            raise PolicyValueError(
                "runner.binary",
                f"no executable {cls.program} found ({said}); build it with `{build}` or name it in runner.binary",
            )
        return binary

    def server_slots(self, runner: str) -> int | None:
        """Requests the server gate started admits at once: its `parallel` (-np / --max-num-seqs)."""
        return self.parallel

    @staticmethod
    def parallel_of(policy: Any) -> int:
        """Requests in flight the server must take: the highest load point's concurrency, or
        load.max_concurrency for an open loop, or the envelope search's highest concurrency
        (load.search.max; 1 without a load section)."""
        from gate.load.points import load_points

        load = policy.load
        search = (
            [int(load.search.max)]
            if load is not None and load.search is not None and load.search.over == "concurrency"
            else []
        )
        return max(
            [p.concurrency or 1 for p in load_points(policy)] + [load.max_concurrency or 1 if load else 1] + search
        )

    # ---- what a kind says -------------------------------------------------------------------

    def command_line(self, runner: str, port: int | None = None) -> list[str]:
        """The command of `runner`: the one last started for it, else the one it would start
        with (port `port`, or 0). Raises KeyError for a runner not in `servers`."""
        raise NotImplementedError

    def server_env(self) -> dict[str, str]:
        """The server's environment (default: this process's)."""
        return dict(os.environ)

    def endpoint_of(self, runner: str, base_url: str) -> Endpoint:
        """The Endpoint requests to `runner`'s server at `base_url` go to."""
        raise NotImplementedError

    def is_ours(self, runner: str, base_url: str, client: httpx.Client) -> bool:
        """After health answered 200: whether the server at `base_url` serves the model gate
        started for `runner` (False: another process answered on the port)."""
        return True

    def on_ready(self, runner: str, base_url: str, log_path: Path, client: httpx.Client) -> None:
        """Called once `runner`'s server is ready and its own: read what it says of itself."""

    def bind_failed(self, log_text: str) -> bool:
        """Whether a server that exited before it was ready says it could not bind its port."""
        return False

    def describe_exit(self, code: int, before_ready: bool) -> str:
        """An exit status as people read it ("status 1", "signal SIGKILL")."""
        if code >= 0:
            return f"status {code}"
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"

    # ---- what gate records ---------------------------------------------------------------------

    def peak_rss_bytes(self, runner: str) -> int | None:
        """Peak resident set size of `runner`'s server, bytes: the largest tree_peak_rss_bytes
        (VmHWM summed over its process tree) over all its lifetimes so far (read at ready,
        after each run and before each stop). None before it ran or where /proc is missing."""
        if self._server is not None and self._server.runner == runner:
            self._sample_rss(self._server)
        return self._peak_rss.get(runner)

    def startup_s(self, runner: str) -> float | None:
        """Seconds from spawn to /health 200 at `runner`'s last start; None before one."""
        return self._startup_s.get(runner)

    def log_path(self, runner: str) -> Path | None:
        """The log file of `runner`'s current server (None when it is not up)."""
        return self._server.log_path if self._server is not None and self._server.runner == runner else None

    def pid(self, runner: str) -> int | None:
        """The process id of `runner`'s server when it is up, else None."""
        return self._server.proc.pid if self._server is not None and self._server.runner == runner else None

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self, runner: str) -> None:
        """Make `runner`'s server the one up: nothing when it already is and alive, else stop
        the current one and start this one, waiting for the health path. Raises KeyError for
        an unknown runner, ServedError when it cannot start (see the class docstring). A
        runner whose server exited before it was ready is not started again by this runner
        object: the same error comes back at once, saying so (a configuration the server
        rejects is rejected every time, and each try costs a start); a startup timeout or a
        taken port is tried again at the next start."""
        if runner not in self.servers:
            raise KeyError(f"{self.program} has no server named {runner!r} (known: {', '.join(sorted(self.servers))})")
        current = self._server
        if current is not None and current.runner == runner and current.proc.poll() is None:
            return
        failed = self._start_failed.get(runner)
        if failed is not None:
            raise ServedError(
                runner, failed.url, f"not started again (its first start failed in this run): {failed.what}"
            )
        self._stop_current()
        self._check_binary(runner)
        try:
            self._start(runner)
        except ServedError as e:
            if e.what.startswith("server exited"):  # deterministic; a timeout or a taken port may pass
                self._start_failed[runner] = e
            raise

    def _start(self, runner: str) -> None:
        for attempt in (1, 2):
            server = self._spawn(runner)
            try:
                self._wait_ready(server)
            except _PortInUse:
                self._reap(server)
                if attempt == 2:
                    raise ServedError(
                        runner,
                        f"http://{HOST}",
                        f"port in use: {self.program} could not bind the free port picked for it, twice "
                        "(taken by another process before it bound)",
                    ) from None
                continue
            except BaseException:
                self._reap(server)
                raise
            self._server = server
            self.endpoints[runner] = self.endpoint_of(runner, server.base_url)
            return

    def stop(self) -> None:
        """Stop the server that is up, if any (its peak RSS read first)."""
        self._stop_current()

    def close(self) -> None:
        """Stop any server and remove the temporary log folder. Idempotent."""
        self._stop_current()
        super().close()
        if self._tmp_logs is not None:
            self._tmp_logs.cleanup()
            self._tmp_logs = None

    # ---- requests -----------------------------------------------------------------------------

    def run(
        self, requests: Sequence[Request], load: LoadStrategy, done: Done | None = None, ended: Ended | None = None
    ) -> list[RequestResult]:
        """Start the server of the requests' runner (their common `draft`) and send them
        under `load` (OpenAIRunner.run). Raises ValueError for mixed drafts or a load above
        `parallel`, ServedError when the server cannot start or cannot apply a request's law
        or constraint as gate does (before starting it). When the server dies during
        the run, each request that failed gets a ServedError "server died" with the exit
        status and the log tail; the next run starts a new server."""
        if not requests:
            return []
        names = {r.draft for r in requests}
        if len(names) > 1:
            raise ValueError(f"one {self.program} run serves one runner; requests name {sorted(names)}")
        self.check_load(load)
        runner = names.pop()
        self._refuse(runner, f"http://{HOST}", requests)  # before a server starts for nothing
        self.start(runner)
        server = self._server
        assert server is not None
        results = super().run(requests, load, done, ended)
        code = server.proc.poll()
        if code is None and any(isinstance(r, Exception) for r in results):
            # a killed server closes its sockets a moment before it can be reaped
            try:
                code = server.proc.wait(1.0)
            except subprocess.TimeoutExpired:
                code = None
        if code is None:
            self._sample_rss(server)
            return results
        died = self._died(server, code)
        self._reap(server)
        self._server = None
        return [died if isinstance(r, Exception) else r for r in results]

    def counters(self, runner: str) -> ServerSnapshot | None:
        """Scrape `runner`'s server counters now (OpenAIRunner.counters), starting its server
        when it is not up (a fresh server counts from 0). Raises ServedError as start() and
        when /metrics is unreachable."""
        self.start(runner)
        return super().counters(runner)

    # ---- private --------------------------------------------------------------------------------

    def _check_binary(self, runner: str) -> None:
        path = Path(self.binary)
        if not path.is_file():
            raise ServedError(
                runner, self.binary, f"binary missing: {self.program} not found at {self.binary} ({self.build_hint})"
            )
        if not os.access(path, os.X_OK):
            raise ServedError(
                runner,
                self.binary,
                f"binary not executable: {self.program} at {self.binary} is not executable "
                f"(chmod +x it; {self.build_hint})",
            )

    def _log_file(self, runner: str) -> Path:
        self._spawns += 1
        if self.log_dir is not None:
            folder = Path(self.log_dir)
            folder.mkdir(parents=True, exist_ok=True)
        else:
            if self._tmp_logs is None:
                self._tmp_logs = tempfile.TemporaryDirectory(prefix=f"gate-{self.program}-")
            folder = Path(self._tmp_logs.name)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", runner)
        return folder / f"{self.program}-{safe}-{self._spawns}.log"

    def _spawn(self, runner: str) -> _Server:
        port = free_port()
        cmd = self.command_line(runner, port=port)
        log_path = self._log_file(runner)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.server_env(),
                preexec_fn=_die_with_parent(),
            )
        with _LIVE_LOCK:
            _LIVE.add(proc)
        self._commands[runner] = cmd
        return _Server(runner, proc, port, cmd, log_path, time.perf_counter())

    def _wait_ready(self, server: _Server) -> None:
        """Poll health_path until 200 with the process alive, then ask is_ours. Raises
        _PortInUse, or ServedError (exited, timeout)."""
        deadline = server.started_s + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = server.proc.poll()
                if code is not None:
                    if self.bind_failed(_tail(server.log_path, 200)):
                        raise _PortInUse()
                    raise ServedError(
                        server.runner,
                        server.base_url,
                        f"server exited: {self.program} exited before it was ready, with "
                        f"{self.describe_exit(code, True)} "
                        f"(command: {' '.join(server.command)}); last lines of {server.log_path}:\n"
                        f"{_tail(server.log_path)}",
                    )
                if time.perf_counter() > deadline:
                    raise ServedError(
                        server.runner,
                        server.base_url,
                        f"startup timeout: {self.program} not ready after {self.startup_timeout_s:g} s; "
                        f"last lines of {server.log_path}:\n{_tail(server.log_path)}",
                    )
                try:
                    if client.get(server.base_url + self.health_path).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(HEALTH_POLL_S)
            ready = time.perf_counter()
            ours = self.is_ours(server.runner, server.base_url, client)
            if ours:
                self.on_ready(server.runner, server.base_url, server.log_path, client)
        if server.proc.poll() is not None or not ours:
            # another process answered on the port we picked: ours could not bind it
            raise _PortInUse()
        server.ready_s = ready - server.started_s
        self._startup_s[server.runner] = server.ready_s
        self._sample_rss(server)

    def _sample_rss(self, server: _Server) -> None:
        rss = tree_peak_rss_bytes(server.proc.pid)
        if rss is not None:
            self._peak_rss[server.runner] = max(rss, self._peak_rss.get(server.runner, 0))

    def _stop_current(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._sample_rss(server)
        self._reap(server)

    def _reap(self, server: _Server) -> None:
        """SIGTERM the server's process group, SIGKILL after STOP_GRACE_S, wait for all of it."""
        proc = server.proc
        # the group, even when its first process has exited: its children (vLLM's engine core) may live on
        _signal_group(proc, signal.SIGTERM)
        _wait_group(proc, time.monotonic() + STOP_GRACE_S)
        with _LIVE_LOCK:
            _LIVE.discard(proc)
        self.endpoints.pop(server.runner, None)

    def _died(self, server: _Server, code: int) -> ServedError:
        how = self.describe_exit(code, before_ready=False)
        return ServedError(
            server.runner,
            server.base_url,
            f"server died: {self.program} (pid {server.proc.pid}) died during the run ({how}); last lines of "
            f"{server.log_path}:\n{_tail(server.log_path)}",
        )


class _PortInUse(Exception):
    """The server could not bind the port picked for it (taken meanwhile)."""


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, from the main thread: a preexec_fn asking the kernel to SIGTERM the server
    when gate ends without running atexit (killed by SIGTERM or SIGKILL). The kernel ties
    it to the thread that forks, so only the main thread (it lives as long as gate) asks.
    None elsewhere."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1  # <linux/prctl.h>

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)

    return preexec
