"""JUnit XML through the junit-xml package (it escapes; no string-built XML).

One test case per rule and scope, named "<rule_id>[<draft>/<law>]" with classname
"gate.<rule_id>". pass: a passing case (message in system-out); fail: a failure "measured X
(aggregation) vs threshold Y"; error: an error (measurement missing); inconclusive (an
exactness test without the power the policy requires): an error (skipped at level warn); warn: skipped with
the warning as message (it does not fail CI unless --fail-on-warn); off: skipped.
Every failure, error and skip carries a message: junit-xml treats a failure without one as
a pass. Versions, device, seed and model fingerprints are suite properties.
"""

from __future__ import annotations

from junit_xml import TestCase, TestSuite, to_xml_report_string

from gate.report.document import Report
from gate.report.interface import ReportFormat


def _properties(report: Report) -> dict[str, str]:
    env = report.measurements.environment
    props = {"gate": env.gate, "python": env.python, "torch": env.torch, "transformers": env.transformers,
             "device": env.device, "device_name": env.device_name, "platform": env.platform, "seed": str(env.seed),
             "policy": report.policy_file}
    for model in env.models:
        props[f"model.{model.role}"] = f"{model.source} {model.kind} {model.dtype} sha256:{model.fingerprint}"
    return props


class JunitReport(ReportFormat):
    """One <testsuite name="gate"> per run. With fail_on_warn (gate check --fail-on-warn),
    warn-level violations are failures, as they fail the build."""

    name = "junit"

    def __init__(self, fail_on_warn: bool = False):
        self.fail_on_warn = fail_on_warn

    def render(self, report: Report) -> str:
        cases = []
        for o in report.outcomes:
            case = TestCase(o.name, classname=f"gate.{o.rule_id}", stdout=o.message)
            message = o.message or f"{o.rule_id}: {o.status}"
            if o.status == "fail" or (o.status == "warn" and self.fail_on_warn):
                case.add_failure_info(message=message, failure_type="gate.rule_failed")
            elif o.status == "error":
                case.add_error_info(message=message, error_type="gate.measurement_missing")
            elif o.status == "inconclusive" and o.level == "error":
                case.add_error_info(message=message, error_type="gate.inconclusive")
            elif o.status in ("warn", "inconclusive"):
                case.add_skipped_info(message=f"warning: {message}")
            elif o.status == "skipped":
                case.add_skipped_info(message=message)
            cases.append(case)
        for f in report.measurements.failures:
            case = TestCase(f"measurement[{f.stage}/{f.draft}/{f.law}/{f.what}]", classname="gate.measurement", stdout=f.message)
            case.add_error_info(message=f.message or "measurement failed", error_type="gate.measurement_failed")
            cases.append(case)
        suite = TestSuite("gate", cases, properties=_properties(report))
        return to_xml_report_string([suite], prettyprint=True, encoding="utf-8")
