"""The JSON report: every raw measurement and every outcome (schema: schemas/report.schema.json)."""

from __future__ import annotations

from gate.report.document import ADAPTER, Report
from gate.report.interface import ReportFormat
from gate.report.registry import register


class JsonReport(ReportFormat):
    """Standard JSON (NaN and infinities written as null)."""

    name = "json"

    def render(self, report: Report) -> str:
        return ADAPTER.dump_json(report, indent=1).decode("utf-8") + "\n"


register(JsonReport, "every raw measurement and every outcome (schemas/report.schema.json)")
