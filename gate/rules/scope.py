"""Where a rule is decided: scope keys of outcomes ("draft/law/category=x") and the load
points of a served run a rule's scope and `per:` take. Shared by every rule kind, the
validator's warnings and the reports."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from gate.rules.selection import Selection

if TYPE_CHECKING:
    from gate.policy.model import Policy


LOAD_AXES = ("concurrency", "request_rate")
_POINT_KIND = {
    "concurrency": ("a closed-loop load point keeps a fixed number of requests in flight and offers no request rate"),
    "request_rate": "an open-loop load point offers a request rate and has no fixed concurrency",
}


def other_axis(axis: str) -> str:
    """The other load axis: "request_rate" for "concurrency" and the reverse."""
    return "request_rate" if axis == "concurrency" else "concurrency"


def point_name(axis: str, value: float) -> str:
    """A load point for sentences: 'concurrency 4' or 'request rate 2/s'."""
    return f"concurrency {value:g}" if axis == "concurrency" else f"request rate {value:g}/s"


def scoped_points(
    concurrency: Iterable[float] | None,
    request_rate: Iterable[float] | None,
    declared: dict[str, tuple[float, ...]],
    axis: str,
) -> list[float]:
    """The declared load points of `axis` ("concurrency" or "request_rate") that a rule scope
    takes: every declared point when the scope names no load point (`concurrency` and
    `request_rate` both None), else those it lists on that axis (none when it lists only the
    other axis)."""
    if concurrency is None and request_rate is None:
        return list(declared.get(axis, ()))
    listed = set((concurrency if axis == "concurrency" else request_rate) or ())
    return [v for v in declared.get(axis, ()) if v in listed]


def inapplicable_points(
    per: str | None,
    concurrency: Iterable[float] | None,
    request_rate: Iterable[float] | None,
    declared: dict[str, tuple[float, ...]],
) -> tuple[str, list[float]] | None:
    """Where a rule's `per:` cannot decide anything: for per: concurrency the declared request
    rates its scope takes (an open loop has no fixed concurrency), for per: request_rate the
    declared concurrencies (a closed loop offers no rate). Returns (that axis, its points in
    declared order; requests/s or requests in flight), or None when every point in scope
    gets a verdict (or `per` is not a load axis)."""
    if per not in LOAD_AXES:
        return None
    other = other_axis(per)
    points = scoped_points(concurrency, request_rate, declared, other)
    return (other, points) if points else None


def declared_load_points(policy: Policy) -> dict[str, tuple[float, ...]]:
    """A served policy's declared load points ("concurrency"/"request_rate" -> values; a served
    run without load points runs at concurrency 1); {} in-process."""
    load = getattr(policy, "load", None)
    if getattr(policy, "runner", None) is None or not policy.runner.served:
        return {}
    return {
        "concurrency": tuple(load.concurrency)
        if load and load.concurrency
        else (() if load and load.request_rate else (1,)),
        "request_rate": tuple(load.request_rate) if load and load.request_rate else (),
    }


def not_applicable_reason(axis: str) -> str:
    """Why a `per:` of one load axis gives no verdict at a load point of the other, `axis`."""
    return _POINT_KIND[axis]


def scope_key(where: Selection, per: str | None = None) -> str:
    """The stable scope key of an outcome: draft/law[/categories][/per=value][/constraint=labels]."""
    key = f"{where.runner}/{where.law}"
    if per == "category" and where.categories:
        return key + f"/category={where.categories[0]}"
    if where.categories:
        key += "/" + ",".join(where.categories)
    if per in ("context_length", "max_new_tokens") and getattr(where, per) is not None:
        key += f"/{per}={getattr(where, per)}"
    if where.constraints is not None:
        key += "/constraint=" + ",".join(where.constraints)
    for name in ("concurrency", "request_rate"):
        values = getattr(where, name)
        if values is not None:
            key += f"/{name}=" + ",".join(f"{v:g}" for v in values)
    return key


def parse_scope(scope: str) -> Selection:
    """The selection a scope key names (the inverse of scope_key)."""
    draft, law, *rest = scope.split("/")
    where = Selection(draft, law, None)
    for part in rest:
        name, sep, v = part.partition("=")
        if not sep:
            where = replace(where, categories=tuple(part.split(",")))
        elif name == "category":
            where = replace(where, categories=(v,))
        elif name == "context_length":
            where = replace(where, context_length=int(v))
        elif name == "max_new_tokens":
            where = replace(where, max_new_tokens=int(v))
        elif name == "constraint":
            where = replace(where, constraints=tuple(v.split(",")))
        elif name == "concurrency":
            where = replace(where, concurrency=tuple(int(x) for x in v.split(",")))
        elif name == "request_rate":
            where = replace(where, request_rate=tuple(float(x) for x in v.split(",")))
    return where
