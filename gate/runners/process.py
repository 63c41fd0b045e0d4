"""A server process gate started, as a component a managed runner holds (gate.runners.managed):
spawned in its own session with its output in a log file, ready once its health path answers
200 while it lives, its peak resident set read over its process tree, stopped with SIGTERM to
its process group and SIGKILL after STOP_GRACE_S. It knows nothing of runners, requests or
engines: the runner says what to start and how to tell the server is its own.

The process is in its own session (start_new_session): a Ctrl-C to gate does not reach it.
An interpreter exit stops every live one (atexit). A gate killed by a signal runs no atexit
handler, but on Linux the kernel sends the server SIGTERM when the thread that started it (the
main thread) ends (PR_SET_PDEATHSIG).
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
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import httpx

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


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of the log at `path` ("(no log)" where it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class Exited(Exception):
    """The server process ended before it was ready: `code` is its exit status (negative: the signal)."""

    def __init__(self, code: int):
        super().__init__(f"exited with {code}")
        self.code = code


class NotOurs(Exception):
    """Another process answered on the server's port (it could not bind the port it was given)."""


class ServerProcess:
    """One server process (tree): `command` run with `env`, its output in `log_path`, serving
    at `host`:`port`. Started on construction (spawn). `started_s`: time.perf_counter() at
    spawn; `ready_s`: seconds from spawn to ready (None before); `peak_rss_bytes`: the
    largest tree_peak_rss_bytes read so far (None before a read)."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path, port: int, host: str = HOST):
        self.command, self.log_path, self.port, self.host = list(command), log_path, port, host
        with open(log_path, "wb") as log:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                preexec_fn=_die_with_parent(),
            )
        with _LIVE_LOCK:
            _LIVE.add(self.proc)
        self.started_s = time.perf_counter()
        self.ready_s: float | None = None
        self.peak_rss_bytes: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_code(self, wait_s: float = 0.0) -> int | None:
        """The exit status once the process ended (waiting up to `wait_s`), None while it lives."""
        if wait_s <= 0:
            return self.proc.poll()
        try:
            return self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None

    def wait_ready(
        self, health_path: str, timeout_s: float, ours: Callable[[httpx.Client], bool] = lambda client: True
    ) -> None:
        """Poll `health_path` until 200 with the process alive, then ask `ours` (with a client)
        whether the server that answered is this one; reads the peak RSS once ready. Raises
        Exited when the process ended first, TimeoutError after `timeout_s` from spawn,
        NotOurs when another process answered (or this one ended meanwhile)."""
        deadline = self.started_s + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise Exited(code)
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"not ready after {timeout_s:g} s")
                try:
                    if client.get(self.base_url + health_path).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(HEALTH_POLL_S)
            ready = time.perf_counter()
            mine = ours(client)
        if self.proc.poll() is not None or not mine:
            raise NotOurs()
        self.ready_s = ready - self.started_s
        self.sample_rss()

    def sample_rss(self) -> int | None:
        """Read the process tree's peak resident set now; returns the largest read so far."""
        rss = tree_peak_rss_bytes(self.proc.pid)
        if rss is not None:
            self.peak_rss_bytes = max(rss, self.peak_rss_bytes or 0)
        return self.peak_rss_bytes

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of its log."""
        return log_tail(self.log_path, lines)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after STOP_GRACE_S, wait for all of it. The group,
        even when its first process has exited: its children (vLLM's engine core) may live on."""
        _signal_group(self.proc, signal.SIGTERM)
        _wait_group(self.proc, time.monotonic() + STOP_GRACE_S)
        with _LIVE_LOCK:
            _LIVE.discard(self.proc)


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
