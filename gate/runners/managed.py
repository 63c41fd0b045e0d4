"""Server processes gate starts and stops itself (runner kinds llama_server, vllm): one
process (tree) per runner name, one up at a time, measured through the OpenAI-compatible
runner.

run() for a runner whose server is not up stops the one that is (its peak RSS read first)
and starts the runner's own, on 127.0.0.1 at a free port. It is ready when its health path
answers 200 while the process lives and the server names the model gate started
(`_is_ours`: a stranger on a reused port is never measured).

The process itself is a component the runner holds (gate.runners.process.ServerProcess:
spawn, health, peak RSS, stop), in its own session; close() stops it, and so does an
interpreter exit. Its output goes to a log file (log_dir, or a temporary folder removed at
close); failures quote its last lines (gate.runners.process.LOG_TAIL_LINES).

A kind subclasses ManagedServerRunner and says: its program's name, the command line of a
runner, its environment, the Endpoint of a started server, how it knows the server is its
own, and how its log says a port was taken.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from gate.core.requests import Request
from gate.load.interface import LoadStrategy
from gate.measure.device_memory import no_accelerator, nvml_process_bytes
from gate.runners.client.transport import ServedError
from gate.runners.interface import Done, Ended, RequestResult
from gate.runners.openai import Endpoint, OpenAIRunner
from gate.runners.process import HOST, Exited, NotOurs, ServerProcess, free_port, process_tree
from gate.runners.server_metrics import ServerSnapshot


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
    binary_env = ""  # the environment variable that names the binary (find_binary reads it first)

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
        self._server: ServerProcess | None = None  # the server up now
        self._up: str | None = None  # the runner it serves
        self._commands: dict[str, list[str]] = {}
        self._peak_rss: dict[str, int] = {}
        self._device_bytes: dict[str, int] = {}  # runner -> its server tree's highest device memory (NVML)
        self._device_note: dict[str, str] = {}  # runner -> why its device memory is not measured
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
            given = os.environ.get(cls.binary_env, "") if cls.binary_env else ""
            if not spec.binary and given and given == found:  # the bad path is the environment's, not the policy's
                raise PolicyValueError(
                    "runner",
                    f"no executable {cls.program} found (${cls.binary_env} names {given}, which is not an "
                    f"executable file); fix or unset ${cls.binary_env}, build one with `{build}`, or name it in "
                    "runner.binary",
                )
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
        if self._server is not None and self._up == runner:
            self._sample_rss(runner, self._server)
        return self._peak_rss.get(runner)

    def device_memory_bytes(self, runner: str) -> tuple[int | None, str | None]:
        """The device memory NVML says `runner`'s server process tree used, highest over the
        samples so far (at ready, after each run, before each stop: gate.measure.device_memory),
        and None; or None and why it is not measured ("no accelerator (...)": the machine has
        no NVIDIA GPU, or NVML's error)."""
        if self._server is not None and self._up == runner:
            self._sample_device(runner, self._server)
        return self._device_bytes.get(runner), (None if runner in self._device_bytes else self._device_note.get(runner))

    def startup_s(self, runner: str) -> float | None:
        """Seconds from spawn to /health 200 at `runner`'s last start; None before one."""
        return self._startup_s.get(runner)

    def log_path(self, runner: str) -> Path | None:
        """The log file of `runner`'s current server (None when it is not up)."""
        return self._server.log_path if self._server is not None and self._up == runner else None

    def pid(self, runner: str) -> int | None:
        """The process id of `runner`'s server when it is up, else None."""
        return self._server.pid if self._server is not None and self._up == runner else None

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
        if current is not None and self._up == runner and current.exit_code() is None:
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
                self._wait_ready(runner, server)
            except _PortInUse:
                self._reap(runner, server)
                if attempt == 2:
                    raise ServedError(
                        runner,
                        f"http://{HOST}",
                        f"port in use: {self.program} could not bind the free port picked for it, twice "
                        "(taken by another process before it bound)",
                    ) from None
                continue
            except BaseException:
                self._reap(runner, server)
                raise
            self._server, self._up = server, runner
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
        code = server.exit_code()
        if code is None and any(isinstance(r, Exception) for r in results):
            code = server.exit_code(wait_s=1.0)  # a killed server closes its sockets a moment before it can be reaped
        if code is None:
            self._sample_rss(runner, server)
            return results
        died = self._died(runner, server, code)
        self._reap(runner, server)
        self._server, self._up = None, None
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

    def _spawn(self, runner: str) -> ServerProcess:
        port = free_port()
        cmd = self.command_line(runner, port=port)
        server = ServerProcess(cmd, self.server_env(), self._log_file(runner), port)
        self._commands[runner] = cmd
        return server

    def _wait_ready(self, runner: str, server: ServerProcess) -> None:
        """Wait until `runner`'s server is ready and its own (ServerProcess.wait_ready, is_ours),
        then read what it says of itself (on_ready). Raises _PortInUse, or ServedError (exited,
        timeout)."""
        try:
            server.wait_ready(
                self.health_path, self.startup_timeout_s, lambda client: self._ours(runner, server, client)
            )
        except Exited as e:
            if self.bind_failed(server.tail(200)):
                raise _PortInUse() from None
            raise ServedError(
                runner,
                server.base_url,
                f"server exited: {self.program} exited before it was ready, with "
                f"{self.describe_exit(e.code, True)} "
                f"(command: {' '.join(server.command)}); last lines of {server.log_path}:\n"
                f"{server.tail()}",
            ) from None
        except TimeoutError:
            raise ServedError(
                runner,
                server.base_url,
                f"startup timeout: {self.program} not ready after {self.startup_timeout_s:g} s; "
                f"last lines of {server.log_path}:\n{server.tail()}",
            ) from None
        except NotOurs:
            raise _PortInUse() from None  # another process answered on the port we picked: ours could not bind it
        assert server.ready_s is not None
        self._startup_s[runner] = server.ready_s
        self._sample_rss(runner, server)

    def _ours(self, runner: str, server: ServerProcess, client: httpx.Client) -> bool:
        """is_ours, then on_ready when it is."""
        mine = self.is_ours(runner, server.base_url, client)
        if mine:
            self.on_ready(runner, server.base_url, server.log_path, client)
        return mine

    def _sample_rss(self, runner: str, server: ServerProcess) -> None:
        rss = server.sample_rss()
        if rss is not None:
            self._peak_rss[runner] = max(rss, self._peak_rss.get(runner, 0))
        self._sample_device(runner, server)

    def _sample_device(self, runner: str, server: ServerProcess) -> None:
        """Keep the highest device memory of the server's process tree (NVML); once NVML says
        the machine has no accelerator, it is not asked again."""
        if no_accelerator(self._device_note.get(runner, "")):
            return
        used, why = nvml_process_bytes(process_tree(server.pid))
        if used is not None:
            self._device_bytes[runner] = max(used, self._device_bytes.get(runner, 0))
        elif why is not None:
            self._device_note[runner] = why

    def _stop_current(self) -> None:
        server, runner = self._server, self._up
        self._server, self._up = None, None
        if server is None or runner is None:
            return
        self._sample_rss(runner, server)
        self._reap(runner, server)

    def _reap(self, runner: str, server: ServerProcess) -> None:
        """Stop the server (its whole process group) and forget its endpoint."""
        server.stop()
        self.endpoints.pop(runner, None)

    def _died(self, runner: str, server: ServerProcess, code: int) -> ServedError:
        how = self.describe_exit(code, before_ready=False)
        return ServedError(
            runner,
            server.base_url,
            f"server died: {self.program} (pid {server.pid}) died during the run ({how}); last lines of "
            f"{server.log_path}:\n{server.tail()}",
        )


class _PortInUse(Exception):
    """The server could not bind the port picked for it (taken meanwhile)."""
