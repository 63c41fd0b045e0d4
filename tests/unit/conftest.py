"""The unit tier is pure: a test here that starts a process or opens a network connection fails
at once, naming what it tried (such a test belongs in tests/integration)."""

from __future__ import annotations

import socket
import subprocess

import pytest


@pytest.fixture(autouse=True)
def no_process_no_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(what: str):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise AssertionError(f"a unit test may not {what} (args {args[:2]!r}): move it to tests/integration")

        return call

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("start a process"))
    monkeypatch.setattr(socket.socket, "connect", refuse("open a connection"))
