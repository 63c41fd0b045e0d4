"""The envelope search: its probes and each runner's SLO load."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProbeRecord:
    """One probe of an envelope search (gate.load.search): the workload at `load` (concurrency,
    or requests/s), `repetitions` windows. Per repetition: `throughputs` (committed output
    tokens/s over the window), `good_shares` (share of its requests meeting every load.goodput
    SLO), `itl_p99_ms` (p99 of its inter-token gaps; None: no gaps), `tpot_mean_ms` (mean
    TPOT of its clean requests: 1000 / it is the per-user speed). `requests` measured and
    `failed`, `excluded` (contended or client delayed: timing left them out), the search's
    `verdict` ("held", "slo", "saturation", "inconclusive", "failed") and `why`."""

    load: float
    requests: int
    failed: int
    excluded: int
    throughputs: list[float]
    good_shares: list[float]
    itl_p99_ms: list[float | None]
    verdict: str
    why: str
    saturated: bool = False
    tpot_mean_ms: list[float | None] = field(default_factory=list)  # per repetition: mean TPOT of its clean requests


@dataclass
class EnvelopeRecord:
    """The envelope search of one runner and law: every SLO held at `lower` (None: not even at
    the first probe), something failed at `upper` (None: nothing up to the maximum); the load
    searched (`over`: "concurrency" or "request_rate"), why it stopped (`stop`: "slo",
    "saturation", "max", "budget", "inconclusive", "failed", "interrupted"), the SLOs (`slo_ms`, ms; `itl_p99_ms`;
    `min_good_share`), the probes in run order and the wall time it took (s)."""

    runner: str
    law: str
    over: str
    lower: float | None
    upper: float | None
    stop: str
    probes: list[ProbeRecord]
    wall_s: float
    slo_ms: dict[str, float] = field(default_factory=dict)
    itl_p99_ms: float | None = None
    min_good_share: float = 0.9

    @property
    def integer(self) -> bool:
        """Whether the load is a whole number (concurrency)."""
        return self.over == "concurrency"

    def bounds(self) -> tuple[float, float]:
        """(least, greatest) SLO load the search allows: `lower` (0 when None) and the greatest
        load below `upper` (concurrency: upper - 1; a rate: upper itself, a supremum; inf when
        None)."""
        least = self.lower if self.lower is not None else 0.0
        if self.upper is None:
            return least, float("inf")
        return least, (self.upper - 1 if self.integer else self.upper)

    def shown(self) -> str:
        """The interval as reports show it: "concurrency [4, 5)", "request rate [2.1, 2.4)/s";
        "[16, max)" when every SLO held up to the maximum, "[2, ?)" when the search stopped
        before anything failed (budget, an inconclusive or failed probe)."""

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:g}" if self.integer else f"{v:.3g}"

        hi = ("max" if self.stop == "max" else "?") if self.upper is None else f(self.upper)
        unit = "/s" if not self.integer else ""
        return f"{self.over.replace('_', ' ')} [{f(self.lower)}, {hi}){unit}"
