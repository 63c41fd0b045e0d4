"""Typed measurement records with units. Counters are stored; rates are derived.

Records are plain dataclasses that serialise to the JSON report as they are, so any rule
can aggregate the raw values later. They know nothing about rules.

One module per subject: requests (a request, its counters, its overlap), windows (the offered
load, a measured window, the client's workers, the server), exactness, bills, speculation,
identity (the target's), envelope (the search's probes), run (models, environment, workload,
drafts, failures). Measurements, here, holds them all; every record is imported from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gate.records.bills import BillLine, BillRecord, Budget
from gate.records.envelope import EnvelopeRecord, ProbeRecord
from gate.records.exactness import Divergence, ExactnessRecord, NextTokenCounts, SampleRecord, TwoSampleCounts
from gate.records.identity import DriftRecord, ProbeSequence, ReleaseComparison, TargetIdentity, TokenizerComparison
from gate.records.requests import FALLBACK, UNKNOWN_ID, OverlapRecord, RequestRecord, SpecDecodeCounters
from gate.records.run import (
    RECORDED_SAMPLES,
    DraftInfo,
    Environment,
    Failure,
    FailureStage,
    LooksRecord,
    ModelInfo,
    SampleLooksRecord,
    WorkloadInfo,
    describe_failures,
)
from gate.records.speculation import DID_NOT_SPECULATE, SpeculationRecord, SpeculationStatus
from gate.records.windows import (
    ClientWorkerRecord,
    DeviceMemoryRecord,
    OfferedLoad,
    RunRecord,
    ServerRecord,
    busy_seconds,
)

__all__ = [
    "BillLine",
    "BillRecord",
    "Budget",
    "ClientWorkerRecord",
    "DID_NOT_SPECULATE",
    "DeviceMemoryRecord",
    "Divergence",
    "DraftInfo",
    "DriftRecord",
    "EnvelopeRecord",
    "Environment",
    "ExactnessRecord",
    "FALLBACK",
    "Failure",
    "FailureStage",
    "LooksRecord",
    "SampleLooksRecord",
    "Measurements",
    "ModelInfo",
    "NextTokenCounts",
    "OfferedLoad",
    "OverlapRecord",
    "ProbeRecord",
    "ProbeSequence",
    "RECORDED_SAMPLES",
    "ReleaseComparison",
    "RequestRecord",
    "RunRecord",
    "SampleRecord",
    "ServerRecord",
    "SpecDecodeCounters",
    "SpeculationRecord",
    "SpeculationStatus",
    "TargetIdentity",
    "TokenizerComparison",
    "TwoSampleCounts",
    "UNKNOWN_ID",
    "WorkloadInfo",
    "busy_seconds",
    "describe_failures",
]


# A Measurements field that is a process's peak: merged shards keep the highest (gate merge).
PEAK = {"merge": "max"}


@dataclass
class Measurements:
    """Everything measured in one run; the input of rule evaluation and the JSON report."""

    environment: Environment
    requests: list[RequestRecord] = field(default_factory=list)
    overlaps: list[OverlapRecord] = field(default_factory=list)
    exactness: list[ExactnessRecord] = field(default_factory=list)
    samples: list[SampleRecord] = field(default_factory=list)  # served exactness: the short sampled requests
    sample_wall_s: dict[str, float] = field(default_factory=dict)  # "<runner>/<law>" -> wall seconds its samples took
    bills: list[BillRecord] = field(default_factory=list)
    # process peaks: shards merge them as the highest (PEAK)
    process_peak_rss_bytes: int | None = field(default=None, metadata=PEAK)
    cuda_max_memory_allocated_bytes: int | None = field(default=None, metadata=PEAK)
    cuda_max_memory_reserved_bytes: int | None = field(default=None, metadata=PEAK)
    # per runner and law, in-process on an accelerator (gate.measure.device_memory); served: ServerRecord.device_bytes
    device_memory: list[DeviceMemoryRecord] = field(default_factory=list)
    accelerator: str | None = None  # the accelerator's name; None: none (device memory rules are skipped)
    failures: list[Failure] = field(default_factory=list)
    drafts: dict[str, DraftInfo] = field(default_factory=dict)  # name -> what the draft is
    workload: WorkloadInfo | None = None
    laws: list[str] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)  # the measured windows (timed requests per runner and law)
    servers: list[ServerRecord] = field(default_factory=list)  # served runners' engines (empty in-process)
    tokenizers: list[TokenizerComparison] = field(
        default_factory=list
    )  # cross-tokenizer drafts' tokenizers against the target's
    target_identity: TargetIdentity | None = None  # the loaded target's identity and its release comparison
    drift: list[DriftRecord] = field(default_factory=list)  # the target's law against the release's (release.model)
    notes: list[str] = field(
        default_factory=list
    )  # what the measuring said about itself (contention reruns stopped); reported
    envelopes: list[EnvelopeRecord] = field(default_factory=list)  # load.search: one per runner and law
    probe_requests: list[RequestRecord] = field(default_factory=list)  # load.search: its probes' requests, raw
    speculation: list[SpeculationRecord] = field(
        default_factory=list
    )  # did each draft runner speculate (per law, load point)
    looks: LooksRecord | None = None  # a sequential run's looks (None: a fixed plan)
    sample_looks: SampleLooksRecord | None = None  # a sequential run's served exactness sample looks (None: the plan)
