"""A report format turns the Report document into text (JSON, JUnit XML, console, ...).

Each format is one module under gate/report that registers its class once
(gate.report.registry.register); the CLI writes the reports it is asked for through the
registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from gate.report.document import Report


class ReportFormat(ABC):
    """One output format.

    `name`: the registry's name ("json", "junit", ...); `appends`: True when write() adds
    to an existing file instead of replacing it (Markdown step summaries accumulate).
    Constructor keywords are the format's options (the registry's create() passes them)."""

    name: str
    appends: bool = False

    @abstractmethod
    def render(self, report: Report) -> str:
        """The whole document as text."""

    def write(self, report: Report, path: Path) -> None:
        """Write the rendered report to `path` (parent folders are created), or append it
        when the format `appends` and the file exists. Raises OSError when it cannot."""
        text = self.render(report)
        if self.appends and path.exists():
            with path.open("a", encoding="utf-8") as f:
                f.write(text)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def print(self, report: Report, console: Console) -> None:
        """Show the report on a rich console (default: the rendered text, no markup)."""
        console.print(self.render(report), markup=False, end="")
