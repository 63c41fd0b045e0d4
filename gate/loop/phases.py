"""One guard for the measuring phases of a run (the requests, the overlap and exactness
passes, the bill, the bookkeeping): a phase that fails loses nothing else, and a signal or
measurement.max_wall_s running out stops the phase in progress with what it measured, every
later phase saying what it did not measure (gate.loop.run assembles the phases)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.core.errors import describe_error
from gate.loop import interrupt
from gate.records import Failure, FailureStage, Measurements


@dataclass
class Phase:
    """One measuring phase of a run (gate.loop.run.measure).

    `name`: as notes name it ("the requests", "the overlap pass"); `stage`: the failure
    stage of what it measures; `run`: the phase itself. `unmeasured(why, when)` gives the
    failures for what it did not measure when a signal or the budget stopped it (`why`:
    "interrupted by SIGTERM" or "measurement.max_wall_s (20 min) ran out"; `when`: "during
    the overlap pass", or "during the requests, before the overlap pass" for a phase that
    did not start); default: one failure at `stage` for
    every draft and law. `after_stop`: it still runs once the run was stopped (what is
    cheap and needs no further request: the bill from configs); `bookkeeping`: it is never
    cut short (a signal inside it is only recorded) and never a failure when skipped."""

    name: str
    stage: FailureStage
    run: Callable[[], Any]
    unmeasured: Callable[[str, str], list[Failure]] | None = None
    after_stop: bool = False
    bookkeeping: bool = False
    detail: Callable[[], str | None] | None = (
        None  # what the phase measured, for the note ("3 of 40 requests measured")
    )

    def missing(self, why: str, when: str) -> list[Failure]:
        if self.bookkeeping:
            return []
        if self.unmeasured is not None:
            return self.unmeasured(why, when)
        return [Failure(self.stage, "*", "*", self.name.removeprefix("the "), not_measured(why, when))]


def not_measured(why: str, when: str) -> str:
    """A failure's message for what a stopped run did not measure: "interrupted by SIGTERM
    <when>: not measured", or "not measured: measurement.max_wall_s (20 min) ran out <when>"."""
    return f"{why} {when}: not measured" if why.startswith("interrupted") else f"not measured: {why} {when}"


def stop_reason() -> str:
    """Why the run stopped: "interrupted by SIGTERM" or "measurement.max_wall_s (20 min) ran out"."""
    return (
        f"{interrupt.budget()} ran out"
        if interrupt.ran_out() and interrupt.received() is None
        else f"interrupted by {interrupt.name()}"
    )


def run_phases(m: Measurements, phases: list[Phase]) -> str | None:
    """Run the measuring phases in order, under one guard. An Exception escaping a phase is a
    failure at its stage and the next phase runs. The first SIGINT or SIGTERM (a
    KeyboardInterrupt) or the budget running out (interrupt.OutOfTime, raised between
    requests and when a phase is entered) stops the phase in progress: what was measured is
    kept, that phase and every later one add failures for what they did not measure
    (Phase.missing), so no rule passes on missing data, and only the phases marked
    after_stop still run (a signal inside them is only recorded). Returns the name of the
    phase that was stopped (None: every phase ran); interrupt.stopped_in() says so too."""
    stop: str | None = None
    why = ""
    for ph in phases:
        if stop is not None:
            if ph.after_stop:
                with interrupt.deferred():
                    _safely(m, ph)
            else:
                m.failures += ph.missing(why, f"during {stop}, before {ph.name}")
            continue
        try:
            if ph.bookkeeping:
                with interrupt.deferred():
                    _safely(m, ph)
                if interrupt.received() is not None:  # a signal it only recorded: the run stops here, nothing lost
                    interrupt.caught()
                    stop, why = ph.name, stop_reason()
                    interrupt.stopped(ph.name)
            else:
                interrupt.entering(
                    ph.name, budget=not ph.after_stop
                )  # an after_stop phase runs after the budget anyway
                _safely(m, ph)
        except (KeyboardInterrupt, interrupt.OutOfTime) as e:
            if isinstance(e, KeyboardInterrupt):
                interrupt.caught()
            interrupt.stop_raising()  # what is left is bookkeeping: a signal now is only recorded
            stop, why = ph.name, stop_reason()
            interrupt.stopped(ph.name, ph.detail() if ph.detail is not None else None)  # before its failures are added
            m.failures += ph.missing(why, f"during {ph.name}")
    return stop


def _safely(m: Measurements, ph: Phase) -> None:
    try:
        ph.run()
    except Exception as e:  # noqa: BLE001 - a phase that failed loses nothing else
        m.failures.append(Failure(ph.stage, "*", "*", ph.stage.value, describe_error(e)))
