"""The JSON report: every raw measurement and every outcome (schema: schemas/report.schema.json)."""

from __future__ import annotations

from gate.report.document import ADAPTER, Report
from gate.report.interface import ReportFormat


class JsonReport(ReportFormat):
    """Standard JSON (NaN and infinities written as null)."""

    name = "json"

    def render(self, report: Report) -> str:
        return ADAPTER.dump_json(report, indent=1).decode("utf-8") + "\n"
