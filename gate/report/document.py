"""The report document: every raw measurement, every outcome and the summary rows.

One pydantic TypeAdapter serialises it (NaN becomes null) and generates its JSON Schema,
checked in as schemas/report.schema.json (`gate schema --report`)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from gate.analysis.cost import Cost
from gate.analysis.interactivity import EqualInteractivity, InteractivityPoint
from gate.analysis.load_points import Crossover, LoadPoint
from gate.analysis.schedule import KChoice
from gate.analysis.summary import SummaryRow
from gate.measure.client_check import ClientCheck
from gate.records import Measurements
from gate.rules.outcome import Outcome

FORMAT = "gate-report/1"


@dataclass
class Report:
    """What `gate check` found. `status_counts` counts outcomes per status."""

    gate_version: str
    policy_file: str
    policy: dict[str, Any]
    created_utc: str
    exit_code: int
    status_counts: dict[str, int]
    outcomes: list[Outcome]
    summary: list[SummaryRow]
    measurements: Measurements
    format: str = FORMAT
    notes: list[str] = field(default_factory=list)
    load: list[LoadPoint] = field(default_factory=list)  # served runs: every runner at every load point
    crossovers: list[Crossover] = field(default_factory=list)  # served runs: where each draft stops paying
    client: list[ClientCheck] = field(default_factory=list)  # served runs: the client's check of itself, per window
    interactivity: list[InteractivityPoint] = field(default_factory=list)  # served: throughput against per-user speed
    equal_interactivity: list[EqualInteractivity] = field(
        default_factory=list
    )  # drafts vs fallback at load.per_user_tokens_s
    schedule: list[KChoice] = field(default_factory=list)  # num_draft_tokens_sweep: every K per load point, the best K
    shard: str | None = (
        None  # "i/n": this report measured the i-th of n shards of the run (gate check --shard; gate merge)
    )
    merged_from: list[str] = field(default_factory=list)  # gate merge: the shard reports this one joins
    # a sequential run: what it spent against its fixed plan and budget (gate.analysis.cost)
    cost: Cost | None = None


ADAPTER = TypeAdapter(Report)


def make_report(
    policy_file: str,
    policy: dict[str, Any],
    m: Measurements,
    outcomes: list[Outcome],
    summary: list[SummaryRow],
    exit_code: int,
    load: list[LoadPoint] | None = None,
    crossovers: list[Crossover] | None = None,
) -> Report:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    return Report(
        gate_version=m.environment.gate,
        policy_file=policy_file,
        policy=policy,
        created_utc=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        exit_code=exit_code,
        status_counts=counts,
        outcomes=outcomes,
        summary=summary,
        measurements=m,
        load=list(load or []),
        crossovers=list(crossovers or []),
    )


def report_schema() -> dict[str, Any]:
    """JSON Schema of the report document (draft 2020-12, as pydantic writes it)."""
    schema = ADAPTER.json_schema(mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gate report"
    return schema
