"""Served runs that never hang and never lose what was measured (issue 23): every transport
failure of the streaming client named for what happened (refused at connect, reset before
the response, reset mid-stream, timed out before the first byte, timed out mid-stream) with
a non-empty detail; a runner that keeps failing stops costing a timeout per request
(runner.max_consecutive_failures); the kernel's listen-queue overflows reported as a note.

Wall times are asserted as upper bounds with wide margins (the test machine is shared)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from gate.core.law import Law
from gate.core.requests import PlannedPrompt, Request
from gate.runners.netstat import ListenCounters, listen_counters, listen_note
from gate.runners.openai import TRANSPORT_KINDS, Endpoint, OpenAIRunner, ServedError

GREEDY = Law("greedy", 0.0)
GATE = Path(sys.executable).with_name("gate")


def req(first: int = 5, n: int = 6, rep: int = 0) -> Request:
    return Request("fallback", GREEDY, PlannedPrompt(f"p{first}-{rep}", "c", (first, 1, 2, 3)), n, rep, 11)


def reqs(k: int, first: int = 5) -> list[Request]:
    return [req(first=first, rep=i) for i in range(k)]


def runner(url: str, **kw) -> OpenAIRunner:
    return OpenAIRunner({"fallback": Endpoint(url)}, set(), **kw)


def errors(out: list) -> list[ServedError]:
    assert all(isinstance(r, ServedError) for r in out), [r for r in out if not isinstance(r, ServedError)]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_max_consecutive_failures_is_checked() -> None:
    with pytest.raises(ValueError, match="max_consecutive_failures must be an integer >= 1, got 0"):
        runner("http://127.0.0.1:9", max_consecutive_failures=0)
    from pydantic import ValidationError

    from gate.runners.openai import OpenAIRunnerSpec as RunnerSpec

    assert RunnerSpec(kind="openai").max_consecutive_failures == 3
    with pytest.raises(ValidationError, match="max_consecutive_failures"):
        RunnerSpec(kind="openai", max_consecutive_failures=0)


def test_listen_counters_read_the_tcpext_lines(tmp_path: Path) -> None:
    netstat = tmp_path / "netstat"
    netstat.write_text("TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPHPHits\nTcpExt: 0 7 9 100\n"
                       "IpExt: InNoRoutes\nIpExt: 0\n")
    assert listen_counters(netstat) == ListenCounters(7, 9)
    assert listen_counters(tmp_path / "missing") is None
    netstat.write_text("IpExt: InNoRoutes\nIpExt: 0\n")
    assert listen_counters(netstat) is None
    assert listen_note(ListenCounters(7, 9), ListenCounters(7, 9), "d", "concurrency 2") is None
    assert listen_note(None, ListenCounters(8, 10), "d", "concurrency 2") is None
    drops = listen_note(ListenCounters(7, 9), ListenCounters(7, 12), "d", "request rate 8/s")
    assert drops is not None and drops.startswith("the kernel counted 3 dropped connection attempt(s) at a listening "
                                                  "socket (TcpExt ListenDrops; no ListenOverflows) while runner 'd' ran "
                                                  "at request rate 8/s")


def test_transport_kinds_are_the_five_the_issue_names_and_connect_failures() -> None:
    assert set(TRANSPORT_KINDS) == {"refused", "connect_failed", "reset_before_response", "reset_mid_stream",
                                    "timeout_before_first_byte", "timeout_mid_stream"}


