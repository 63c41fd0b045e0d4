"""A report format turns the Report document into text (JSON, JUnit XML, console, ...)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from gate.report.document import Report


class ReportFormat(ABC):
    """One output format."""

    name: str

    @abstractmethod
    def render(self, report: Report) -> str:
        """The whole document as text."""

    def write(self, report: Report, path: Path) -> None:
        """Write the rendered report to `path` (parent folders are created)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.render(report), encoding="utf-8")
