"""The load points of a policy's `load` section, in run order, and how records, failures and
notes label a load point."""

from __future__ import annotations

from typing import Any

from gate.load.interface import LoadStrategy


def load_points(policy: Any) -> list[LoadStrategy]:
    """The policy's load points in run order, each registered strategy's in turn
    (gate.load.registry: closed-loop concurrencies, then open-loop rates); a policy that
    declares none runs the default strategy's one point (concurrency 1)."""
    from gate.load.registry import kinds

    points = [p for kind in kinds() for p in kind.points(policy)] if policy.load is not None else []
    if points:
        return points
    (default,) = [kind.default for kind in kinds() if kind.default is not None]
    return [default()]


def point_of(load: LoadStrategy) -> tuple[int | None, float | None]:
    """(concurrency, request_rate) labels of a load point, as requests and failures carry them."""
    if load.request_rate is not None:
        return None, load.request_rate
    return load.concurrency, None


def describe_point(load: LoadStrategy) -> str:
    """A load point as notes and failures name it: "concurrency 4" or "request rate 2/s"."""
    c, r = point_of(load)
    return f"concurrency {c}" if r is None else f"request rate {r:g}/s"


def search_plan(policy: Any) -> Any:
    """load.search as the loop runs it (gate.load.search.SearchPlan), with the goodput SLOs,
    the open loop's burstiness, seed and cap, and measurement's contention and client-delay
    bounds; None when the policy asks for no search."""
    from gate.load.search import SearchPlan
    from gate.measure.environment import cpu_count

    load = policy.load
    if load is None or load.search is None:
        return None
    s, ms = load.search, policy.measurement
    return SearchPlan(
        s.over,
        float(s.start),
        float(s.max),
        s.repetitions,
        s.tolerance,
        s.requests_per_load,
        load.goodput.ms() if load.goodput is not None else {},
        s.itl_p99_ms(),
        s.min_good_share,
        s.budget_seconds(),
        load.burstiness,
        policy.workload.seed,
        load.max_concurrency,
        ms.max_cpu_stall,
        cpu_count(),
        ms.max_client_lag_ms,
        ms.max_contended,
    )
