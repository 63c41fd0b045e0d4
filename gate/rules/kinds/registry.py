"""Rule kinds by name: the one list the policy's `kind:` values, its schema enum and the
evaluator's dispatch are assembled from.

A new rule kind is one module under gate/rules/kinds that declares `KIND = <a RuleKind>`
plus its line in BUILTIN below. `register`/`unregister` add or remove a kind at run time
(plugins, tests); the policy checks `kind:` against the registry when a rule is parsed, so
a kind registered later parses too.

This module imports no gate.policy: the policy imports rule kinds, never the other way.
"""

from __future__ import annotations

from typing import Any

from gate.core.registry import Registry
from gate.rules.kinds.interface import RuleKind

# The registration lines, in this order (the order of the schema's enum and of "expected one
# of" messages); the first is the default kind.
BUILTIN = (
    "gate.rules.kinds.metric",
    "gate.rules.kinds.exactness",
    "gate.rules.kinds.envelope",
    "gate.rules.kinds.best_num_draft_tokens",
)

_KINDS: Registry[RuleKind] = Registry(
    "rule kind",
    lambda: BUILTIN,
    name_of=lambda kind: kind.name,
    module_of=lambda kind: type(kind).__module__,
    attribute="KIND",
)


def register(kind: RuleKind) -> RuleKind:
    """Add `kind` (after the built-in kinds). Raises ValueError when its name is taken."""
    if kind.name in _KINDS:
        raise ValueError(f"rule kind {kind.name!r} is already registered")
    return _KINDS.add(kind)


def unregister(name: str) -> None:
    """Remove a kind registered with `register` (KeyError when none has that name)."""
    _KINDS.remove(name)


def names() -> list[str]:
    """The registered kind names (the policy's `kind:` values), built-in first."""
    return _KINDS.names()


def get(name: str) -> RuleKind:
    """The kind called `name`. Raises KeyError naming the known kinds."""
    return _KINDS.get(name)


def expected() -> str:
    """The allowed names as pydantic words a Literal's error: "'metric' or 'exactness'"."""
    quoted = [repr(n) for n in names()]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def json_schema(schema: dict[str, Any]) -> None:
    """Complete a rule's `kind` JSON Schema in place with the registered names (the enum a
    Literal gives): pydantic's json_schema_extra hook, so the schema follows the registry at
    the time it is generated."""
    schema["enum"] = names()


# What callers ask of a rule, one function per question, so that none of them branches on a kind.


def reads_metric(rule: Any) -> bool:
    """Whether `rule` (a gate.policy.model.RuleSpec) decides a gate.metrics.catalogue metric."""
    return get(rule.kind).reads_metric


def needs_exactness(rule: Any) -> bool:
    """Whether `rule` is decided on exactness raw material."""
    return get(rule.kind).needs_exactness
