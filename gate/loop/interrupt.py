"""Interrupts: Ctrl-C (SIGINT) and CI's cancel (SIGTERM).

The first signal stops the measurement where it is (a KeyboardInterrupt raised in the main
thread, which gate.loop.run records as a failure, keeping every record made so far). From then
on, and whenever the measurement is already over, a signal is only recorded, so the
reports are written whole; a third signal abandons them (os._exit). The process exits
128 + the signal (130 for SIGINT, 143 for SIGTERM), never 0, 1, 2 or 3: an interrupted run
is not a verdict (docs/reference/exit-codes.md).

The same module keeps the run's wall-time budget (measurement.max_wall_s): once it has run
out, check_budget() raises OutOfTime between requests, load points and phases, and the run
stops as it does for a signal, but exits with the code of its verdicts (3: measurements
missing), not 128 + a signal. The measuring phase in progress (`entering`) is what the
report's note names ("interrupted by SIGTERM during the served exactness pass").
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """Raised by the handler on the first SIGINT or SIGTERM while a run may be stopped."""


class OutOfTime(BaseException):
    """Raised by check_budget() once measurement.max_wall_s has run out. A BaseException, as
    KeyboardInterrupt is, so the run's `except Exception` safety nets (a failed request, a
    failed phase) do not take it for a measurement that failed."""


@dataclass
class _State:
    signum: int | None = None  # the first signal received
    count: int = 0
    raising: bool = True  # False once only the reports are left to write
    phase: str | None = None  # the measuring phase in progress ("the requests", ...), for the note
    stopped_in: str | None = None  # the phase a signal or the budget stopped (None: none was)
    stop_detail: str | None = None  # what that phase had measured ("3 of 40 requests measured")
    deadline_s: float | None = None  # time.monotonic() at which measurement.max_wall_s runs out
    started_s: float | None = None  # time.monotonic() at which the budget started (gate check began)
    budget: str | None = None  # the budget as notes name it: "measurement.max_wall_s (20 min)"
    ran_out: bool = False  # the budget ran out (check_budget raised)
    pending: bool = False  # the handler raised Interrupted and no catcher has taken it yet (caught())


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
    """Forget any signal, phase and budget (tests)."""
    _state.signum, _state.count, _state.raising, _state.pending = None, 0, True, False
    clear_run()


def clear_run() -> None:
    """Forget the phase, the stop and the budget of the last run (signals are kept)."""
    _state.phase = _state.stopped_in = _state.stop_detail = None
    _state.deadline_s = _state.started_s = _state.budget = None
    _state.ran_out = False


def _handler(signum: int, frame: object) -> None:
    _state.count += 1
    if _state.signum is None:
        _state.signum = signum
    if _state.count == 1 and _state.raising:
        _say(
            f"gate: interrupted by {name(signum)}: stopping (gate check still writes its reports with what was "
            "measured)"
        )
        _state.pending = True
        raise Interrupted(name(signum))
    if _state.pending and _state.raising and _state.count < 3:
        # the first Interrupted was raised where it got swallowed (a finalizer's __del__ prints
        # "Exception ignored in ..." and goes on): raise it again rather than wait for the third signal
        _say(f"gate: {name(signum)} again: the first did not stop the run; stopping")
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
    _state.pending = False
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


def set_budget(seconds: float | None, shown: str, started_s: float | None = None) -> None:
    """Start the run's wall-time budget: `seconds` (None: no budget) from `started_s`
    (time.monotonic(); default now). `shown`: how notes name it, e.g. "measurement.max_wall_s (20 min)"."""
    _state.started_s = time.monotonic() if started_s is None else started_s
    _state.deadline_s = None if seconds is None else _state.started_s + float(seconds)
    _state.budget, _state.ran_out = shown, False


def check_budget() -> None:
    """Raise OutOfTime when the run's wall-time budget has run out (nothing when there is none),
    and Interrupted again when the handler's Interrupted was swallowed where it was raised (a
    finalizer ignores exceptions): called between requests, it makes a lost signal stop the run."""
    if _state.pending and _state.raising:
        raise Interrupted(name())
    if _state.deadline_s is not None and time.monotonic() >= _state.deadline_s:
        _state.ran_out = True
        raise OutOfTime(f"{_state.budget} ran out")


def budget() -> str | None:
    """The budget as notes name it ("measurement.max_wall_s (20 min)"; None: no budget)."""
    return _state.budget if _state.deadline_s is not None else None


def ran_out() -> bool:
    """Whether the run's wall-time budget ran out (check_budget raised)."""
    return _state.ran_out


def elapsed_s() -> float | None:
    """Seconds since the budget started (None: no budget was set)."""
    return None if _state.started_s is None else time.monotonic() - _state.started_s


def entering(phase: str, budget: bool = True) -> None:
    """A measuring phase starts ("the requests", "the overlap pass", ...): notes name it
    when the run stops in it. Raises OutOfTime when the budget has run out already
    (`budget` False: not checked)."""
    _state.phase = phase
    if budget:
        check_budget()


def phase() -> str | None:
    """The measuring phase in progress or last entered (None: none yet)."""
    return _state.phase


def stopped(phase: str, detail: str | None = None) -> None:
    """The run's guard stopped `phase` (a signal or the budget) and recorded what was not
    measured; `detail`: what it had measured, e.g. "3 of 40 requests measured"."""
    if _state.stopped_in is None:
        _state.stopped_in, _state.stop_detail = phase, detail


def stopped_in() -> str | None:
    """The phase the run's guard stopped (None: the guard stopped none)."""
    return _state.stopped_in


def stop_detail() -> str | None:
    """What the stopped phase had measured (None: not said)."""
    return _state.stop_detail


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
    return (
        f"interrupted by {name()} {stage}: this report holds only what was measured until then; rules without "
        f"their measurements are errors, never passes; exit code {exit_code()} means interrupted, not a verdict"
    )


def caught() -> None:
    """A KeyboardInterrupt reached gate without the handler (not installed, or Python's own):
    count it as SIGINT."""
    if _state.signum is None:
        _state.signum = int(signal.SIGINT)
    _state.count = max(_state.count, 1)
    _state.pending = False


def mark_late(result: Any) -> None:
    """A SIGINT or SIGTERM that came once every measurement was made (the verdicts or the
    reports were being made): the reports are written whole, and say so when they still can;
    the exit code is 128 + the signal all the same (interrupted, not a verdict).

    `result`: a gate.commands.check.CheckResult (anything with `exit_code` and a `report` with `notes`
    and `exit_code`); changed in place: a note appended, both exit codes set. Does nothing
    when no signal came or the result already carries the interrupted exit code."""
    if received() is None or result.exit_code == exit_code():
        return
    result.report.notes.append(
        f"interrupted by {name()} after every measurement was made, while the reports were "
        f"written: verdicts are complete, but exit code {exit_code()} means interrupted"
    )
    result.exit_code = result.report.exit_code = exit_code()
