"""The outcome of one rule for one scope: what evaluation decides and every report shows.

Below evaluation (gate.rules.evaluate) and the exactness rules (gate.exactness.verdict), which
both build outcomes; reports read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gate.rules.confidence import Exceedance, Interval
from gate.rules.status import Status

# The metric of an exactness outcome (gate.exactness.verdict): the declared law itself, which no
# catalogue metric names.
EXACTNESS = "exactness"


@dataclass
class Outcome:
    """The verdict of one rule for one scope (draft / law [/ categories])."""

    rule_id: str
    scope: str  # "draft/law" or "draft/law/cat1,cat2"
    draft: str
    law: str
    metric: str
    aggregation: str
    comparison: str
    threshold: float  # base units (bytes, ms, tokens/s, tokens, 1)
    relative_to: str | None
    level: str
    status: Status
    measured: float | None
    samples: int  # raw samples behind the value (requests for pooled values); interval.units counts resampling units
    fallback_value: float | None
    message: str
    details: list[dict[str, Any]] = field(default_factory=list)  # e.g. exactness tests, divergences
    interval: Interval | None = None  # the value's confidence interval (performance rules)
    exceedance: Exceedance | None = None  # percentile rules: samples beyond the threshold and their bound
    inconclusive_as: str = "warn"  # what an inconclusive status does: error (exit 3), fail (exit 1) or warn
    waived_status: Status | None = None  # the status a waiver replaced
    waiver: str | None = None  # "waived by OWNER until DATE: REASON", or an expired waiver's note

    @property
    def tests_law(self) -> bool:
        """An exactness outcome: whether speculative output follows the declared law (no metric)."""
        return self.metric == EXACTNESS

    @property
    def name(self) -> str:
        """How messages and `gate explain` name the outcome: rule_id[scope]."""
        return f"{self.rule_id}[{self.scope}]"
