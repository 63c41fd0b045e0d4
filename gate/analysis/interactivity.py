"""Throughput at equal interactivity: each runner's output throughput (tokens/s, all users)
against its per-user speed (tokens/s one user sees while decoding: 1000 / mean TPOT ms),
over the load points and the envelope search's probes, its Pareto front, and the drafts
against the fallback at the per-user speed the policy names (`load.per_user_tokens_s`).

Comparing at equal load hides what a draft is for: it makes each user faster, so at the same
load the speculative server is more interactive, and at the same interactivity it can carry
more load. The speculators project compares drafts this way (throughput at the same tokens/s
per user); here a runner's throughput at per-user speed u is read off its Pareto front (the
points no other point of the same runner beats on both axes), linearly interpolated between
the two front points around u, and None outside the front's range (never extrapolated).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gate.analysis.load_points import LoadPoint
from gate.records import FALLBACK, Measurements


@dataclass
class InteractivityPoint:
    """One window or probe: `runner`, `law`, where it was measured (`where`: "c=4", "search
    c=6"), its per-user speed (tokens/s per request: 1000 / mean TPOT ms), its output
    throughput (tokens/s) and whether it lies on its runner's Pareto front."""

    runner: str
    law: str
    where: str
    per_user_tokens_s: float
    output_throughput: float
    pareto: bool = False


@dataclass
class EqualInteractivity:
    """A draft against the fallback at `per_user_tokens_s`: each one's throughput there read
    off its Pareto front (None: the speed lies outside the front's range), and `gain`, the
    draft's over the fallback's (x)."""

    runner: str
    law: str
    per_user_tokens_s: float
    throughput: float | None
    fallback_throughput: float | None
    gain: float | None
    message: str


def points(m: Measurements, load: Iterable[LoadPoint]) -> list[InteractivityPoint]:
    """Every load point (LoadPoint: its output throughput and mean TPOT) and every envelope
    probe (the median over its repetitions of each), with the Pareto front marked per runner
    and law. Points without a TPOT or a throughput are left out, as are probes with failed
    requests and probes that decided nothing (contended, interrupted)."""
    out = [
        InteractivityPoint(p.runner, p.law, p.label, 1000.0 / p.tpot_mean_ms, p.output_throughput)
        for p in load
        if p.tpot_mean_ms and p.output_throughput
    ]
    for e in m.envelopes:
        unit = "/s" if e.over == "request_rate" else ""
        prefix = "search c=" if e.over == "concurrency" else "search rate "
        for probe in e.probes:
            if probe.failed or probe.verdict in ("failed", "inconclusive", "interrupted", "budget"):
                continue  # a probe whose requests failed, or that decided nothing, is no point of the curve
            tpots = sorted(t for t in probe.tpot_mean_ms if t)
            thr = sorted(t for t in probe.throughputs if t)
            if tpots and thr:
                out.append(
                    InteractivityPoint(
                        e.runner,
                        e.law,
                        f"{prefix}{probe.load:g}{unit}",
                        1000.0 / tpots[len(tpots) // 2],
                        thr[len(thr) // 2],
                    )
                )
    for key in dict.fromkeys((p.runner, p.law) for p in out):
        mine = [p for p in out if (p.runner, p.law) == key]
        for p in mine:
            p.pareto = not any(
                q is not p
                and q.per_user_tokens_s >= p.per_user_tokens_s
                and q.output_throughput >= p.output_throughput
                and (q.per_user_tokens_s, q.output_throughput) != (p.per_user_tokens_s, p.output_throughput)
                for q in mine
            )
    return out


def throughput_at(front: list[InteractivityPoint], per_user: float) -> float | None:
    """The output throughput (tokens/s) at per-user speed `per_user` (tokens/s) on a Pareto
    front: linear between the two front points around it; None outside the front's range."""
    pts = sorted((p.per_user_tokens_s, p.output_throughput) for p in front if p.pareto)
    for (u0, t0), (u1, t1) in zip(pts, pts[1:], strict=False):
        if u0 <= per_user <= u1:
            return t0 if u1 == u0 else t0 + (t1 - t0) * (per_user - u0) / (u1 - u0)
    if pts and any(u == per_user for u, _ in pts):
        return max(t for u, t in pts if u == per_user)
    return None


def compare(pts: list[InteractivityPoint], per_user: float | None) -> list[EqualInteractivity]:
    """Each draft against the fallback at `per_user` tokens/s per user (None: no comparison),
    per law."""
    if per_user is None:
        return []
    out = []
    for runner, law in dict.fromkeys((p.runner, p.law) for p in pts if p.runner != FALLBACK):
        mine = throughput_at([p for p in pts if (p.runner, p.law) == (runner, law)], per_user)
        base = throughput_at([p for p in pts if (p.runner, p.law) == (FALLBACK, law)], per_user)
        gain = mine / base if mine is not None and base else None
        if gain is not None:
            message = (
                f"{runner} under {law} at {per_user:g} tokens/s per user: {mine:.1f} tokens/s against the "
                f"fallback's {base:.1f} ({gain:.2f}x)"
            )
        else:
            who = [n for n, v in ((runner, mine), (FALLBACK, base)) if v is None]
            message = (
                f"{runner} under {law} at {per_user:g} tokens/s per user: not compared ({' and '.join(who)} "
                "measured no per-user speeds on both sides of it: never extrapolated)"
            )
        out.append(EqualInteractivity(runner, law, per_user, mine, base, gain, message))
    return out
