"""Issue 23: a SIGTERM at any phase of a run keeps what was measured and writes every report.

`gate check` runs as a subprocess; the test reads its progress lines on stderr (plain lines
off a terminal: `gate: <phase> 0/N, 0s` when a phase starts) and sends a real SIGTERM when
the phase of interest has started. Each phase is made long enough to be hit (a wider random
model, longer prompts, more of them), never by sleeping in gate. The bill phases are too
short to hit from outside: there the signal is sent by gate's own process as the bill
starts (os.kill from a wrapper), still a real signal through gate's handler.

Also: the served exactness pass batches its teacher-forced forwards (the same logits as one
at a time) and does not run at all where there is nothing to compare.
"""

from __future__ import annotations

import signal
import sys

import pytest


GATE = [sys.executable, "-m", "gate"]
WIDE = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4)


# --- served runs ------------------------------------------------------------------------


# --- in-process runs --------------------------------------------------------------------


# --- the bill: the signal from gate's own process as the bill starts --------------------


# --- the served exactness pass: batched, and skipped when there is nothing to compare ---


def test_a_signal_swallowed_where_it_was_raised_still_stops_the_run():
    """The handler's Interrupted can land in a finalizer (`Exception ignored in ... __del__`),
    which swallows it: the next check between requests raises it again, and so does a second
    signal, instead of the run going on until a third signal abandons the reports."""
    from gate.loop import interrupt

    interrupt.reset()
    try:
        interrupt.arm()
        try:
            interrupt._handler(signal.SIGTERM, None)
        except interrupt.Interrupted:
            pass  # swallowed, as a finalizer does
        with pytest.raises(interrupt.Interrupted):
            interrupt.check_budget()
        with pytest.raises(interrupt.Interrupted):
            interrupt._handler(signal.SIGTERM, None)  # the second signal stops it too
        interrupt.caught()  # a catcher took it: nothing is raised again between requests
        interrupt.check_budget()
        assert interrupt.received() == signal.SIGTERM and interrupt.exit_code() == 143
    finally:
        interrupt.reset()
    try:  # once the reports are being written, a second signal is only recorded (a third abandons them)
        interrupt.arm()
        with pytest.raises(interrupt.Interrupted):
            interrupt._handler(signal.SIGINT, None)
        interrupt.caught()
        interrupt.stop_raising()
        interrupt._handler(signal.SIGINT, None)
        interrupt.check_budget()
        assert interrupt.exit_code() == 130
    finally:
        interrupt.reset()
