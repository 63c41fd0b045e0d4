"""Statuses and verdicts, defined once: a rule outcome's status, an exactness test's verdict
and role. str-valued enums: they compare equal to, hash like, format and serialise (json,
pydantic) as their plain string values, so reports keep the strings they always had."""

from __future__ import annotations

from enum import Enum


class _StrEnum(str, Enum):
    """A str enum whose str() and f-string form is its value ("pass", not "Status.PASS")."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class Status(_StrEnum):
    """The status of one rule outcome (gate.rules.outcome.Outcome.status).

    pass / fail: the whole interval satisfies / violates the rule; warn: a failure at level
    warn; inconclusive: the interval straddles the threshold (or too few units); error: the
    measurement is missing or failed; skipped: level off; waived: a live waiver covers it."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"
    SKIPPED = "skipped"
    WAIVED = "waived"


class TestVerdict(_StrEnum):
    """The verdict of one exactness test (gate.exactness.stats.ExactnessTest.verdict).

    pass / fail / inconclusive as for an outcome; not rejected: an evidence test that found
    nothing (it claims no power, so it is no pass)."""

    __test__ = False  # not a pytest test class

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    NOT_REJECTED = "not rejected"


class Change(_StrEnum):
    """The verdict of one figure in `gate compare` (candidate over baseline, gate.commands.compare).

    regressed / improved: the whole interval is worse / better than the tolerance; unchanged:
    the whole interval is within it; inconclusive: neither (or not comparable); missing:
    measured on one side only."""

    REGRESSED = "regressed"
    IMPROVED = "improved"
    UNCHANGED = "unchanged"
    INCONCLUSIVE = "inconclusive"
    MISSING = "missing"


class Role(_StrEnum):
    """What an exactness test's result supports: a claim (its stated power against the rule's
    TV is what a pass rests on) or evidence (it can fail a sampler, its power is not claimed)."""

    CLAIM = "claim"
    EVIDENCE = "evidence"


__all__ = ["Change", "Role", "Status", "TestVerdict"]
