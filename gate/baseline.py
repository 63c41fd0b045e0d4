"""The saved report of the released draft that `relative_to: baseline` rules compare with.

Read once, when the policy is validated. Whether its environment matches this run's
(device, torch, transformers, the target's fingerprint) can only be told once this run
has measured: gate.check.finish compares them (gate.compare.environment_differences).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.errors import InputError, PolicyValueError
from gate.records import Measurements


@dataclass(frozen=True)
class Baseline:
    """The baseline report's measurements and where they were read from."""

    measurements: Measurements
    path: Path


def load_baseline(loaded: Any) -> Baseline | None:
    """The policy's baseline report (None when the policy names none). Every candidate draft
    mapped in baseline.drafts must exist in it. Raises InputError (file, YAML path, line)
    for a missing, unreadable or mismatched report."""
    from gate.report.explain import load_report

    spec = loaded.policy.baseline
    if spec is None:
        return None
    path = loaded.resolve(spec.report)
    if not path.is_file():
        why = "is a directory, not a report" if path.is_dir() else "does not exist"
        raise loaded.error(PolicyValueError("baseline.report", f"the baseline report {path} {why}"))
    try:
        report = load_report(path)
    except InputError as e:
        raise loaded.error(PolicyValueError("baseline.report", "; ".join(str(p) for p in e.problems))) from None
    for cand, name in spec.drafts.items():
        if name not in report.measurements.drafts:
            raise loaded.error(PolicyValueError(f"baseline.drafts.{cand}", f"the baseline report has no draft {name!r}; its drafts: "
                                                f"{', '.join(report.measurements.drafts)}"))
    return Baseline(report.measurements, path)
