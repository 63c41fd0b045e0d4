"""What a sequential run spent (gate.rules.sequential, gate.plan.rounds), against its fixed plan
and its budget: the report's cost section and the console's last line."""

from __future__ import annotations

from dataclasses import dataclass, field

from gate.records import Measurements


@dataclass
class Cost:
    """The timed requests a run kept (`requests`), what its fixed plan (measurement.repetitions)
    would have run (`fixed_plan`) and the most its budget allowed (`budget`), all counted over
    every runner, law and load point; `looks`: "<runner>/<law>" -> "k of K", how far each
    cell went; `schedule`: units per runner and law at each look, and their `unit`."""

    requests: int
    fixed_plan: int
    budget: int
    unit: str
    schedule: list[int]
    looks: dict[str, str] = field(default_factory=dict)
    # served exactness samples (m.sample_looks): drawn and what their plan draws, over every runner and law
    samples: int | None = None
    samples_planned: int | None = None
    sample_looks: str | None = None  # "k of K": the sample looks drawn

    def describe(self) -> str:
        """One line: 'sequential: 64 timed requests, 0.50x the fixed plan's 128 (budget 256); ...'."""
        further = sorted(cell for cell, at in self.looks.items() if not at.startswith("1 "))
        cells = (
            f"; measured past the first look: {', '.join(f'{c} (look {self.looks[c]})' for c in further)}"
            if further
            else "; every cell stopped at the first look"
        )
        samples = (
            f"; {self.samples} served exactness samples, {self.samples / max(self.samples_planned, 1):.2f}x their "
            f"plan's {self.samples_planned} (sample look {self.sample_looks})"
            if self.samples is not None and self.samples_planned is not None
            else ""
        )
        return (
            f"sequential: {self.requests} timed requests, {self.requests / max(self.fixed_plan, 1):.2f}x the fixed "
            f"plan's {self.fixed_plan} (budget {self.budget}; looks at {', '.join(map(str, self.schedule))} "
            f"{self.unit}s per runner and law){cells}{samples}"
        )


def cost(m: Measurements) -> Cost | None:
    """The cost of `m`'s sequential run (None: a fixed plan)."""
    rec = m.looks
    if rec is None:
        return None
    points = len({(r.concurrency, r.request_rate) for r in m.requests}) or 1
    per_look = len(rec.taken) * points * rec.requests_per_unit
    out = Cost(
        len(m.requests),
        per_look * rec.fixed_plan,
        per_look * rec.schedule[-1],
        rec.unit,
        list(rec.schedule),
        {cell: f"{k} of {len(rec.schedule)}" for cell, k in sorted(rec.taken.items())},
    )
    if m.sample_looks is not None:
        out.samples = sum(m.sample_looks.drawn.values())
        out.samples_planned = sum(m.sample_looks.planned.values())
        out.sample_looks = f"{m.sample_looks.taken} of {len(m.sample_looks.fractions)}"
    return out
