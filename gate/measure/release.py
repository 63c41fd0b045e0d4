"""The released target a run's target is compared with (policy `target.release`), as
validation resolved it (gate.policy.baseline.load_release); gate.loop.identity compares with it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.records import ProbeSequence


@dataclass(frozen=True)
class Release:
    """The pinned release as validation resolved it (policy `target.release`).

    `given`: "fingerprint", "report <path>" or "model <source>"; `tolerance_logits`: the
    unchanged-within-tolerance bound (logits). From a report: its target `fingerprint`,
    `config` fields, `config_digest` and `probe`; from a model: `source`
    (gate.models.loading.ModelSource) and `dtype` (its fingerprint and config are read once
    it is loaded)."""

    given: str
    tolerance_logits: float
    fingerprint: str | None = None
    config: dict[str, Any] | None = None
    config_digest: str | None = None
    probe: list[ProbeSequence] | None = None
    source: Any = None
    dtype: str = "float32"
