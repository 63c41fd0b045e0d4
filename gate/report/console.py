"""The console summary: one row per draft and law, then every rule's outcome (rich tables)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gate.report.document import Report
from gate.report.interface import ReportFormat
from gate.units import Dimension, format_value

_STYLE = {"pass": "green", "fail": "bold red", "error": "bold magenta", "warn": "yellow", "skipped": "dim", "inconclusive": "bold yellow"}


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


class ConsoleReport(ReportFormat):
    """Human-readable tables; `render` returns plain text (no colour) for files and tests."""

    name = "console"

    def tables(self, report: Report) -> list[Table]:
        summary = Table(title="Drafts against the fallback (same target, law and prompts)", title_justify="left")
        for col in ("draft", "law", "req", "overlap", "top-1", "accept rate", "mean acc len", "tokens/s",
                    "speedup", "TTFT p50", "ITL p50", "ITL p99", "bill"):
            summary.add_column(col, justify="left" if col in ("draft", "law") else "right")
        for r in report.summary:
            summary.add_row(
                escape(r.runner), escape(r.law), str(r.requests), _f(r.overlap_mean, ".3f"), _f(r.top1_agreement, ".3f"),
                _f(r.acceptance_rate, ".3f"), _f(r.mean_acceptance_length, ".2f"), _f(r.committed_tokens_per_s, ".1f"),
                _f(r.speedup, ".2f") + ("x" if r.speedup is not None else ""),
                _f(r.ttft_p50_ms, ".0f") + (" ms" if r.ttft_p50_ms is not None else ""),
                _f(r.itl_p50_ms, ".1f") + (" ms" if r.itl_p50_ms is not None else ""),
                _f(r.itl_p99_ms, ".1f") + (" ms" if r.itl_p99_ms is not None else ""),
                format_value(r.memory_bill_bytes, Dimension.BYTES) if r.memory_bill_bytes is not None else "-",
            )
        rules = Table(title="Rules", title_justify="left")
        for col in ("status", "rule", "level", "message"):
            rules.add_column(col, overflow="fold")
        for o in report.outcomes:
            rules.add_row(f"[{_STYLE.get(o.status, '')}]{o.status.upper()}[/]", escape(o.name), o.level, escape(o.message))
        tables = [summary, rules]
        if report.measurements.failures:
            failures = Table(title="Measurements that could not be made", title_justify="left")
            for col in ("stage", "draft", "law", "what", "why"):
                failures.add_column(col, overflow="fold")
            for f in report.measurements.failures:
                failures.add_row(*(escape(x) for x in (f.stage, f.draft, f.law, f.what, f.message)))
            tables.append(failures)
        return tables

    def footer(self, report: Report) -> str:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(report.status_counts.items())) or "no rules"
        return f"gate: {counts}; exit code {report.exit_code}"

    def print(self, report: Report, console: Console) -> None:
        for table in self.tables(report):
            console.print(table)
        console.print(self.footer(report))

    def render(self, report: Report) -> str:
        buffer = io.StringIO()
        self.print(report, Console(file=buffer, width=160, no_color=True, force_terminal=False))
        return buffer.getvalue()
