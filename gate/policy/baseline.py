"""What a run is compared with from outside it, read once when the policy is validated: the
saved report of the released draft (`baseline`, for relative_to: baseline rules) and the
released target (`target.release`, gate.loop.identity compares the loaded one with it).

Whether the baseline's environment matches this run's (device, torch, transformers, the
target's fingerprint) can only be told once this run has measured: gate.commands.check.finish
compares them (gate.commands.compare.environment_differences). Both saved reports are read by
gate.policy.saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.core.errors import InputError, PolicyValueError
from gate.measure.release import Release
from gate.policy import saved
from gate.records import Measurements


@dataclass(frozen=True)
class Baseline:
    """The baseline report's measurements and where they were read from."""

    measurements: Measurements
    path: Path


def _saved(path: Path, at: str, what: str) -> Any:
    """The saved report `path` that the policy names at YAML path `at` ("the baseline report").
    Raises PolicyValueError at `at` when it is absent or not a gate report."""
    why = saved.absent(path)
    if why is not None:
        raise PolicyValueError(at, f"{what} {path} {why}")
    try:
        return saved.read_report(path)
    except InputError as e:
        raise PolicyValueError(at, "; ".join(str(p) for p in e.problems)) from None


def load_baseline(loaded: Any) -> Baseline | None:
    """The policy's baseline report (None when the policy names none). Every candidate draft
    mapped in baseline.drafts must exist in it. Raises InputError (file, YAML path, line)
    for a missing, unreadable or mismatched report."""
    spec = loaded.policy.baseline
    if spec is None:
        return None
    path = loaded.resolve(spec.report)
    try:
        report = _saved(path, "baseline.report", "the baseline report")
    except PolicyValueError as e:
        raise loaded.error(e) from None
    for cand, name in spec.drafts.items():
        if name not in report.measurements.drafts:
            raise loaded.error(
                PolicyValueError(
                    f"baseline.drafts.{cand}",
                    f"the baseline report has no draft {name!r}; its drafts: {', '.join(report.measurements.drafts)}",
                )
            )
    return Baseline(report.measurements, path)


def load_release(loaded: Any) -> Release | None:
    """The policy's pinned release (None without `target.release`), read without loading
    weights: a report is read and must carry the target identity with a probe; a model
    source must exist. Raises PolicyValueError at the YAML path (target.release.report, ...)."""
    from gate.models.loading import resolve_source

    spec = loaded.policy.target.release
    if spec is None:
        return None
    if spec.fingerprint is not None:
        return Release("fingerprint", spec.tolerance_logits, fingerprint=spec.fingerprint)
    if spec.model is not None:
        source = resolve_source(spec.model, spec.gguf_file, loaded.path.parent, "target.release.model")
        return Release(f"model {spec.model}", spec.tolerance_logits, source=source, dtype=spec.dtype)
    return _release_report(loaded.resolve(spec.report), spec.report, spec.tolerance_logits)


def _release_report(path: Path, written: str, tolerance: float) -> Release:
    """The release from a saved gate report. Raises PolicyValueError (target.release.report)."""
    at = "target.release.report"
    report = _saved(path, at, "the release report")
    ident = report.measurements.target_identity
    target = next((x for x in report.measurements.environment.models if x.role == "target"), None)
    if ident is None:
        hint = f"; pin its weights by fingerprint instead (fingerprint: {target.fingerprint})" if target else ""
        raise PolicyValueError(
            at, f"the report {path} records no target identity (a report of an older gate, or of a served run){hint}"
        )
    if not ident.probe:
        why = f" ({ident.probe_error})" if ident.probe_error else ""
        raise PolicyValueError(
            at,
            f"the report {path} has no logit probe of its target{why}; pin its weights by fingerprint "
            f"instead (fingerprint: {ident.fingerprint})",
        )
    return Release(
        f"report {written}", tolerance, ident.fingerprint, dict(ident.config), ident.config_digest, list(ident.probe)
    )
