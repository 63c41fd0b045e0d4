"""JUnit XML through the junit-xml package (it escapes; no string-built XML).

One test case per rule and scope, named "<rule_id>[<scope>]" (scope "draft/law" or
"draft/law/categories", "/constraint=<label>" when scoped by grammar constraint) with the classname "gate.<rule_id>":
both depend only on the
policy, so they are stable from run to run, and unique (GitLab drops duplicate names).
Passing cases are always present (message in system-out).

Mapping (documented in docs/concepts/reports.md):
- pass: a passing case; fail: a failure; error (measurement missing): an error;
- warn: skipped by default ("warning: ..."); `warn_as` "failure" (--fail-on-warn or
  --junit-warn failure) or "passed";
- inconclusive: `inconclusive_as` "auto" follows what the outcome does to the exit code
  (measurement.inconclusive: error -> error, fail -> failure, warn -> skipped;
  --fail-on-inconclusive -> failure), or forced to "error", "failure" or "skipped";
- waived: skipped with "waived by OWNER until DATE: REASON"; off: skipped.

The package's traps are guarded: a failure or error without a message is silently a pass
there, so every one carries a message; and the <testsuites> element's totals do not sum
`skipped`, so gate sets it. Versions, device, seed and model fingerprints are suite properties.
With a pinned release (policy target.release) the suite says whether the target is unchanged or
updated: property `target.identity` and a passing case `target-identity` (class gate.target_identity)
whose system-out carries the figures; rules on target_drift_* decide, as any rule.

Times: a case's `time` is the summed E2E seconds of the timed requests its verdict rests on
(none for bills and the process peak, which rest on no request); the suite's is every timed
request's E2E seconds, each once.
"""

from __future__ import annotations

import re
import xml.dom.minidom
import xml.etree.ElementTree as ET

from junit_xml import TestCase, TestSuite

from gate.metrics.catalogue import COMPUTED_ONCE, compares_with_fallback
from gate.records import FALLBACK
from gate.report.document import Report
from gate.report.identity import identity_lines
from gate.report.interface import ReportFormat
from gate.report.registry import register
from gate.rules.status import Status


def _properties(report: Report) -> dict[str, str]:
    env = report.measurements.environment
    props = {
        "gate": env.gate,
        "python": env.python,
        "torch": env.torch,
        "transformers": env.transformers,
        "device": env.device,
        "device_name": env.device_name,
        "platform": env.platform,
        "seed": str(env.seed),
        "policy": report.policy_file,
    }
    for model in env.models:
        props[f"model.{model.role}"] = f"{model.source} {model.kind} {model.dtype} sha256:{model.fingerprint}"
    for server in report.measurements.servers:  # served runs: what each runner's engine was
        props[f"server.{server.runner}"] = " ".join(
            x for x in (server.version, " ".join(server.command or []) or server.endpoint) if x
        )
    for c in report.crossovers:
        props[f"crossover.{c.draft}.{c.law}.{c.kind}"] = "none" if c.at is None else f"{c.at:g}"
    ident = report.measurements.target_identity
    if ident is not None:  # the loaded target's identity, and against a pinned release its classification
        props["target.config_digest"] = ident.config_digest
        if ident.release is not None:
            props["target.identity"] = ident.release.classification
            props["target.release"] = ident.release.release
    return props


def _mark(case: TestCase, kind: str, message: str, type_: str) -> None:
    message = message or type_  # never empty: junit-xml reads a failure without a message as a pass
    if kind == "failure":
        case.add_failure_info(message=message, failure_type=type_)
    elif kind == "error":
        case.add_error_info(message=message, error_type=type_)
    elif kind == "skipped":
        case.add_skipped_info(message=message)


class JunitReport(ReportFormat):
    """One <testsuite name="gate"> per run (see the module docstring for the mapping)."""

    name = "junit"

    def __init__(
        self,
        fail_on_warn: bool = False,
        fail_on_inconclusive: bool = False,
        warn_as: str | None = None,
        inconclusive_as: str = "auto",
    ):
        self.warn_as = warn_as or ("failure" if fail_on_warn else "skipped")
        self.fail_on_inconclusive = fail_on_inconclusive
        self.inconclusive_as = inconclusive_as

    def _inconclusive(self, effect: str) -> str:
        if self.inconclusive_as != "auto":
            return self.inconclusive_as
        if self.fail_on_inconclusive:
            return "failure"
        return {"error": "error", "fail": "failure"}.get(effect, "skipped")

    def render(self, report: Report) -> str:
        cases = []
        for o in report.outcomes:
            case = TestCase(o.name, classname=f"gate.{o.rule_id}", stdout=o.message, elapsed_sec=_seconds(report, o))
            message = o.message or f"{o.rule_id}: {o.status}"
            if o.status == Status.FAIL:
                _mark(case, "failure", message, "gate.rule_failed")
            elif o.status == Status.ERROR:
                _mark(case, "error", message, "gate.measurement_missing")
            elif o.status == Status.WARN:
                _mark(case, self.warn_as, f"warning: {message}", "gate.rule_warning")
            elif o.status == Status.INCONCLUSIVE:
                _mark(case, self._inconclusive(o.inconclusive_as), f"inconclusive: {message}", "gate.inconclusive")
            elif o.status in (Status.WAIVED, Status.SKIPPED):
                _mark(case, "skipped", message, "gate.skipped")
            cases.append(case)
        identity = identity_lines(report.measurements)
        if identity:  # a pinned release: the classification and its figures, a passing case (rules on drift decide)
            cases.append(TestCase("target-identity", classname="gate.target_identity", stdout="\n".join(identity)))
        for f in report.measurements.failures:
            case = TestCase(
                f"measurement[{f.stage}/{f.draft}/{f.law}/{f.what}]", classname="gate.measurement", stdout=f.message
            )
            _mark(case, "error", f.message or "measurement failed", "gate.measurement_failed")
            cases.append(case)
        suite = TestSuite("gate", cases, properties=_properties(report))
        return _document([suite], sum(r.e2el_ms for r in report.measurements.requests if r.e2el_ms == r.e2el_ms) / 1e3)


def _seconds(report: Report, o: object) -> float | None:
    """A case's time: the summed E2E seconds of the timed requests its verdict rests on (the
    scope's draft and law, categories and per-value; the fallback's too when the rule divides
    by it). None (no attribute) for a verdict that rests on no timed request: bills, the
    process peak, or nothing measured."""
    from gate.rules.scope import parse_scope

    if o.metric in COMPUTED_ONCE:  # type: ignore[attr-defined]
        return None
    try:
        where = parse_scope(o.scope)  # type: ignore[attr-defined]
    except ValueError:
        return None
    # the fallback's requests count too where the rule compares with it (speedup, request_speedup, relative_to)
    runners = {where.runner} | ({FALLBACK} if compares_with_fallback(o.metric, o.relative_to) else set())  # type: ignore[attr-defined]
    ms = sum(
        r.e2el_ms
        for r in report.measurements.requests
        if r.draft in runners and where.of(r.draft).takes(r) and r.e2el_ms == r.e2el_ms
    )
    return round(ms / 1e3, 6) or None


# Characters XML 1.0 forbids (control characters, surrogates, non-characters): removed.
_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _document(suites: list[TestSuite], seconds: float) -> str:
    """<testsuites> with every total summed, skipped included (junit-xml leaves it out).
    The suite's time is `seconds`, the timed requests' summed E2E time (each request
    once), not junit-xml's sum over cases, which counts a request once per rule."""
    root = ET.Element("testsuites")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "disabled": 0}
    for suite in suites:
        element = suite.build_xml_doc(encoding="utf-8")
        for key in totals:
            totals[key] += int(element.get(key, 0))
        element.set("time", f"{seconds:.6f}")
        root.append(element)
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{seconds:.6f}")
    text = _ILLEGAL.sub("", ET.tostring(root, encoding="unicode"))
    return (
        xml.dom.minidom.parseString(text.encode("utf-8")).toprettyxml(indent="    ", encoding="utf-8").decode("utf-8")
    )


register(JunitReport, "JUnit XML: one test case per rule and scope, for CI test views")
