"""What a rule kind declares: how its rules are checked, evaluated and shown.

The evaluator (gate.rules.evaluate) asks a rule's kind for its outcomes; the policy asks it
whether a rule of that kind is well formed; planning, power and explain read its flags.
Nothing outside gate/rules/kinds/ branches on a kind's name.

This module imports no gate.policy: the policy's RuleSpec reads the registry, so a rule
spec is typed `Any` here (a gate.policy.model.RuleSpec: id, kind, metric, scope, level, ...).
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gate.measure.client_check import DEFAULT_MAX_CLIENT_LAG_MS
from gate.measure.contention import DEFAULT_MAX_CONTENDED, DEFAULT_MAX_CPU_STALL
from gate.records import Measurements
from gate.rules.outcome import Outcome


@dataclass
class Settings:
    """How verdicts are decided (policy.measurement, baseline and waivers, and CLI flags).

    `baseline`: the baseline report's measurements for relative_to: baseline rules;
    `baseline_mismatch`: why that comparison cannot be trusted (environment differs), which
    makes those rules inconclusive; `waivers`: the policy's gate.policy.model.WaiverSpec
    entries (rule, scope, owner, reason, expires)."""

    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0
    inconclusive: str = "error"
    baseline: Measurements | None = None
    baseline_drafts: dict[str, str] = field(default_factory=dict)
    baseline_mismatch: str | None = None
    waivers: list[Any] = field(default_factory=list)
    today: dt.date = field(default_factory=dt.date.today)
    max_cpu_stall: float | None = DEFAULT_MAX_CPU_STALL  # a request is contended above this stalled share (None: never)
    max_contended: float = (
        DEFAULT_MAX_CONTENDED  # largest share of a timing rule's units that may be left out as contended
    )
    max_client_lag_ms: float | None = (
        DEFAULT_MAX_CLIENT_LAG_MS  # a served request is client delayed above this (None: never)
    )
    # served runs: the declared load points ("concurrency"/"request_rate" -> values), so `per:` gives one outcome per
    # declared point (stable names; a point without measurements is an error), not per point that happened to be
    # measured
    load_points: dict[str, tuple[float, ...]] = field(default_factory=dict)


def shown_threshold(v: str | float) -> str:
    """A threshold as the user wrote it: '2 GiB' quoted, a bare number without a trailing .0."""
    return f"{v:g}" if isinstance(v, float) else repr(v)


class RuleKind(ABC):
    """One rule kind: the policy's `kind:` value `name` and everything that differs by kind.

    `keys`: the rule fields this kind reads, in the order `gate explain` shows them;
    `reads_metric`: its rules decide a gate.metrics.catalogue metric (metric, aggregation, per and
    load points apply: power and load-point warnings look at them); `needs_exactness`: its
    rules are decided on exactness raw material (teacher-forced checks, first-token samples),
    which gate check measures for every draft and law in their scope."""

    name: ClassVar[str]
    keys: ClassVar[tuple[str, ...]]
    reads_metric: ClassVar[bool] = False
    needs_exactness: ClassVar[bool] = False

    @abstractmethod
    def spec_problem(self, rule: Any) -> tuple[str, str] | None:
        """(field, message) for the first way `rule` is not a well-formed rule of this kind
        (the policy reports it at rules[i].<field>), or None."""

    def policy_problem(self, rule: Any, policy: Any) -> tuple[str, str] | None:
        """(field, message) for the first way `rule` does not fit the rest of `policy` (a
        gate.policy.model.Policy: a section the rule needs is absent), or None (the default)."""
        return None

    @abstractmethod
    def evaluate(
        self, rule: Any, m: Measurements, drafts: list[str], laws: list[str], settings: Settings
    ) -> list[Outcome]:
        """The outcomes of `rule` for the `drafts` and `laws` in its scope (waivers and what an
        inconclusive status counts as are applied by the caller)."""
