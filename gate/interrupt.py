"""Interrupts: Ctrl-C (SIGINT) and CI's cancel (SIGTERM).

The first signal stops the measurement where it is (a KeyboardInterrupt raised in the main
thread, which gate.run records as a failure, keeping every record made so far). From then
on, and whenever the measurement is already over, a signal is only recorded, so the
reports are written whole; a third signal abandons them (os._exit). The process exits
128 + the signal (130 for SIGINT, 143 for SIGTERM), never 0, 1, 2 or 3: an interrupted run
is not a verdict (README, exit codes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """Raised by the handler on the first SIGINT or SIGTERM while a run may be stopped."""


@dataclass
class _State:
    signum: int | None = None  # the first signal received
    count: int = 0
    raising: bool = True  # False once only the reports are left to write


_state = _State()


def install() -> None:
    """Handle SIGINT and SIGTERM in this process (the main thread only; else nothing). A
    signal the parent ignores stays ignored (as Python leaves an ignored SIGINT: a job a
    shell script started in the background)."""
    try:
        for s in SIGNALS:
            if signal.getsignal(s) != signal.SIG_IGN:
                signal.signal(s, _handler)
    except ValueError:  # not the main thread
        pass


def reset() -> None:
    """Forget any signal (tests)."""
    _state.signum, _state.count, _state.raising = None, 0, True


def _handler(signum: int, frame: object) -> None:
    _state.count += 1
    if _state.signum is None:
        _state.signum = signum
    if _state.count == 1 and _state.raising:
        _say(f"gate: interrupted by {name(signum)}: stopping (gate check still writes its reports with what was measured)")
        raise Interrupted(name(signum))
    if _state.count >= 3:
        _say(f"gate: {name(signum)} again: abandoning the reports")
        os._exit(exit_code())
    _say(f"gate: {name(signum)} received: writing the reports first (send it once more to abandon them)")


def _say(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not hide the interrupt
        pass


def arm() -> None:
    """A run starts: the first signal will stop it (unless one was already received)."""
    if _state.signum is None:
        _state.raising = True


def stop_raising() -> None:
    """From now on a signal is only recorded: what is left is writing the reports."""
    _state.raising = False


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A block that must not be cut short (bookkeeping on what was measured): a signal inside
    it is only recorded; afterwards the run is re-armed unless a signal came meanwhile."""
    stop_raising()
    try:
        yield
    finally:
        arm()


def received() -> int | None:
    """The first signal received (None: none)."""
    return _state.signum


def name(signum: int | None = None) -> str:
    s = _state.signum if signum is None else signum
    try:
        return signal.Signals(s).name if s is not None else "an interrupt"
    except ValueError:
        return f"signal {s}"


def exit_code() -> int:
    """128 + the first signal (130 SIGINT, 143 SIGTERM); 130 for a KeyboardInterrupt with no signal seen."""
    return 128 + (_state.signum if _state.signum is not None else int(signal.SIGINT))


def note(stage: str) -> str:
    """The report's note for a run interrupted during `stage`."""
    return (f"interrupted by {name()} {stage}: this report holds only what was measured until then; rules without "
            f"their measurements are errors, never passes; exit code {exit_code()} means interrupted, not a verdict")


def caught() -> None:
    """A KeyboardInterrupt reached gate without the handler (not installed, or Python's own):
    count it as SIGINT."""
    if _state.signum is None:
        _state.signum = int(signal.SIGINT)
    _state.count = max(_state.count, 1)


def mark_late(result: Any) -> None:
    """A SIGINT or SIGTERM that came once every measurement was made (the verdicts or the
    reports were being made): the reports are written whole, and say so when they still can;
    the exit code is 128 + the signal all the same (interrupted, not a verdict).

    `result`: a gate.check.CheckResult (anything with `exit_code` and a `report` with `notes`
    and `exit_code`); changed in place: a note appended, both exit codes set. Does nothing
    when no signal came or the result already carries the interrupted exit code."""
    if received() is None or result.exit_code == exit_code():
        return
    result.report.notes.append(f"interrupted by {name()} after every measurement was made, while the reports were "
                               f"written: verdicts are complete, but exit code {exit_code()} means interrupted")
    result.exit_code = result.report.exit_code = exit_code()
