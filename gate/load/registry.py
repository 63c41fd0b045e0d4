"""Load strategies by the policy `load` key that declares their points: the one list
gate.load.points reads the policy's load points from.

A new strategy is one module under gate/load that declares its LoadStrategy and
`KIND = LoadKind(...)` (the `load` key its points are declared under, how the policy's load
section gives them), plus its line in BUILTIN below. The in-process loop's own strategy
(gate.load.sequential) is not declared by a policy and has no entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.core.registry import Registry
from gate.load.interface import LoadStrategy

# The registration lines: module paths whose `KIND` is registered, in this order (the run
# order of the load points: closed loops first, then open loops).
BUILTIN = (
    "gate.load.closed",
    "gate.load.open",
)


@dataclass(frozen=True)
class LoadKind:
    """One strategy a policy declares load points of. `key`: its key in the policy's `load`
    section and its strategy's `kind` ("concurrency", "request_rate"); `points(policy)`: its
    load points in run order (a gate.policy.model.Policy whose `load` is set; [] when the
    key is not given); `default`: the one load point of a policy that declares none (only
    one kind has it)."""

    key: str
    points: Callable[[Any], list[LoadStrategy]]
    default: Callable[[], LoadStrategy] | None = None


REGISTRY: Registry[LoadKind] = Registry(
    "load strategy", BUILTIN, lambda k: k.key, lambda k: k.points.__module__, attribute="KIND"
)


def kinds() -> list[LoadKind]:
    """The registered strategies, in run order."""
    return list(REGISTRY)
