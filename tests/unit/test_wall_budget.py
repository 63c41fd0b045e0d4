"""Issue 23: measurement.max_wall_s, a wall-time budget for gate check. Once it has run out
gate measures nothing more (checked between requests, load points and phases), the
requests not measured are errors named as such, the rules are decided on what was
measured, every report is written, a note says so, and the exit code is 3 (measurements
missing), not an interrupt's."""

from __future__ import annotations

from typing import Any

import pytest


LOOKUP = "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n"


@pytest.mark.parametrize("value,seconds", [("20 min", 1200.0), ("1.5 h", 5400.0), ("90 s", 90.0), ("500 ms", 0.5),
                                           (45, 45.0)])
def test_max_wall_s_takes_a_time_with_units(value: Any, seconds: float) -> None:
    from gate.policy.model import MeasurementSpec

    assert MeasurementSpec(max_wall_s=value).wall_budget_s() == seconds
    assert MeasurementSpec().wall_budget_s() is None


