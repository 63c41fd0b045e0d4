"""The console summary: one row per draft and law, then every rule's outcome (rich tables)."""

from __future__ import annotations

import io
import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gate.analysis.schedule import schedule_lines
from gate.core.units import Dimension, format_value
from gate.measure.tokenizers import mapping_lines
from gate.metrics.catalogue import ACCEPTANCE_RATE, GOODPUT, MEAN_ACCEPTANCE_LENGTH, OVERLAP, SPEEDUP
from gate.records import DID_NOT_SPECULATE, FALLBACK
from gate.report.document import Report
from gate.report.identity import identity_lines
from gate.report.interface import ReportFormat
from gate.report.registry import register
from gate.rules.status import Change, Status

_STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
    Status.WARN: "yellow",
    Status.SKIPPED: "dim",
    Status.INCONCLUSIVE: "bold yellow",
    Status.WAIVED: "cyan",
    Change.REGRESSED: "bold red",
    Change.IMPROVED: "green",
    Change.UNCHANGED: "default",
    Change.MISSING: "bold magenta",
}


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def device_peak_cell(r: Any) -> str:
    """A summary row's measured device peak, with the bill's ratio to it ("2.10 GiB (bill
    0.97x)"); "-" where not measured."""
    if r.device_peak_bytes is None:
        return "-"
    cell = format_value(r.device_peak_bytes, Dimension.BYTES)
    if r.memory_bill_bytes and r.device_peak_bytes > 0:
        cell += f" (bill {r.memory_bill_bytes / r.device_peak_bytes:.2f}x)"
    return cell


def device_peak_shown(report: Report) -> bool:
    """Whether any summary row has a measured device peak (the reports add a column for it)."""
    return any(r.device_peak_bytes is not None for r in report.summary)


def device_peak_note(report: Report) -> str | None:
    """Where no row has a measured device peak: "device peak memory: not measured: ..." with
    the reasons the rows give (e.g. "no accelerator"); None where one has, or none says."""
    if device_peak_shown(report):
        return None
    notes = dict.fromkeys(r.device_memory_note for r in report.summary if r.device_memory_note)
    return "device peak memory: " + "; ".join(notes) if notes else None


class ConsoleReport(ReportFormat):
    """Human-readable tables; `render` returns plain text (no colour) for files and tests."""

    name = "console"

    def tables(self, report: Report) -> list[Table | Text]:
        summary = Table(title="Drafts against the fallback (same target, law and prompts)", title_justify="left")
        for col in (
            "draft",
            "law",
            "req",
            OVERLAP.name,
            "top-1",
            "accept rate",
            "mean acc len",
            "tokens/s",
            SPEEDUP.name,
            "slower",
            "TTFT p50",
            "ITL p50",
            "ITL p99",
            "bill",
            *(["device peak"] if device_peak_shown(report) else []),
        ):
            summary.add_column(col, justify="left" if col in ("draft", "law") else "right")
        summary.caption = device_peak_note(report)
        summary.caption_justify = "left"
        for r in report.summary:
            summary.add_row(
                escape(r.runner + did_not_speculate(report, r.runner, r.law)),
                escape(r.law),
                str(r.requests),
                _f(r.overlap_mean, ".3f"),
                _f(r.top1_agreement, ".3f"),
                _f(r.acceptance_rate, ".3f"),
                _f(r.mean_acceptance_length, ".2f"),
                _f(r.committed_tokens_per_s, ".1f"),
                _f(r.speedup, ".2f") + ("x" if r.speedup is not None else ""),
                _percent(r.slower_than_fallback),
                _f(r.ttft_p50_ms, ".0f") + (" ms" if r.ttft_p50_ms is not None else ""),
                _f(r.itl_p50_ms, ".1f") + (" ms" if r.itl_p50_ms is not None else ""),
                _f(r.itl_p99_ms, ".1f") + (" ms" if r.itl_p99_ms is not None else ""),
                format_value(r.memory_bill_bytes, Dimension.BYTES) if r.memory_bill_bytes is not None else "-",
                *([device_peak_cell(r)] if device_peak_shown(report) else []),
            )
        slices = [
            t
            for t in (
                breakdown_table(report, "category"),
                breakdown_table(report, "context_length"),
                constraint_table(report),
            )
            if t is not None
        ]
        rules = Table(title="Rules", title_justify="left")
        for col in ("status", "rule", "level", "message"):
            rules.add_column(col, overflow="fold")
        for o in report.outcomes:
            rules.add_row(
                f"[{_STYLE.get(o.status, '')}]{o.status.upper()}[/]", escape(o.name), o.level, escape(o.message)
            )
        served = load_tables(report) + schedule_tables(report)
        tables: list[Table | Text] = [summary, *slices, *served, rules] if report.measurements.requests else [rules]
        if identity := identity_lines(report.measurements):  # unchanged or updated target (gate.loop.identity)
            ident = Table(title="Target identity", title_justify="left", show_header=False)
            ident.add_column("identity", overflow="fold")
            for line in identity:
                ident.add_row(escape(line))
            tables.insert(0, ident)
        if mapping := mapping_lines(report.measurements):  # cross-tokenizer drafts (gate.drafts.cross_tokenizer)
            cross = Table(
                title="Cross-tokenizer drafts: tokenizers and mapping cost", title_justify="left", show_header=False
            )
            cross.add_column("mapping", overflow="fold")
            for line in mapping:
                cross.add_row(escape(line))
            tables.insert(tables.index(summary) + 1 if summary in tables else 0, cross)
        if report.notes:
            notes = Table(title="Notes", title_justify="left", show_header=False)
            notes.add_column("note", overflow="fold")
            for note in report.notes:
                notes.add_row(escape(note))
            tables.append(notes)
        if report.measurements.failures:
            failures = Table(title="Measurements that could not be made", title_justify="left")
            for col in ("stage", "draft", "law", "what", "why"):
                failures.add_column(col, overflow="fold")
            for f in report.measurements.failures:
                failures.add_row(*(escape(x) for x in (f.stage, f.draft, f.law, f.what, f.message)))
            tables.append(failures)
        return tables

    def footer(self, report: Report) -> str:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(report.status_counts.items())) or (
            f"shard {report.shard} measured, no rule decided here (gate merge decides them)"
            if report.shard is not None
            else "no rules"
        )
        spent = f"\n{report.cost.describe()}" if report.cost is not None else ""
        return f"gate: {counts}; exit code {report.exit_code}{spent}"

    def print(self, report: Report, console: Console) -> None:
        for table in self.tables(report):
            for part in fit(table, console.width) if isinstance(table, Table) else [table]:
                console.print(part)
        console.print(self.footer(report), soft_wrap=True)  # one line each, however long: CI logs grep them

    def render(self, report: Report) -> str:
        buffer = io.StringIO()
        self.print(report, Console(file=buffer, width=160, no_color=True, force_terminal=False))
        return buffer.getvalue()


def did_not_speculate(
    report: Report, runner: str, law: str, axis: str | None = None, value: float | None = None
) -> str:
    """' (did not speculate)' after a runner whose speculation did not run under `law` (at the
    load point `axis` = `value`, or at any of them), from measurements.speculation; '' otherwise.
    Its figures are shown as measured, but no verdict rests on them."""
    for rec in report.measurements.speculation:
        at = rec.concurrency if axis == "concurrency" else rec.request_rate
        if (
            rec.runner == runner
            and rec.law == law
            and rec.status in DID_NOT_SPECULATE
            and (axis is None or at == value)
        ):
            return " (did not speculate)"
    return ""


# Columns that name a row: a table too wide for the console repeats them in each of its parts.
KEY_COLUMNS = ("runner", "draft", "law", "load", "rep")


def fit(table: Table, width: int) -> list[Table]:
    """`table` when its columns fit `width` characters, else its columns split into parts
    that do, each led by the table's key columns (its leading KEY_COLUMNS), titled "(1/2)",
    "(2/2)": a CI log is not a terminal, and rich would cut a too-wide table's cells ("fallba…").
    A table without key columns, or one that cannot be split, is returned as it is."""
    columns = list(table.columns)
    keys = next((i for i, c in enumerate(columns) if str(c.header) not in KEY_COLUMNS), len(columns))

    def need(c: Any) -> int:  # the column's natural width plus its padding and rule
        cells = [str(c.header), *(str(x) for x in c.cells)]
        return max(Text.from_markup(x).cell_len for x in cells) + 3

    if keys == 0 or keys == len(columns) or sum(need(c) for c in columns) + 1 <= width:
        return [table]
    base = sum(need(c) for c in columns[:keys]) + 1
    parts: list[list[Any]] = [[]]
    for c in columns[keys:]:
        if parts[-1] and base + sum(need(x) for x in parts[-1]) + need(c) > width:
            parts.append([])
        parts[-1].append(c)
    if len(parts) == 1:
        return [table]
    out = []
    for i, part in enumerate(parts, 1):
        t = Table(title=f"{table.title} ({i}/{len(parts)})" if table.title else None, title_justify="left")
        chosen = columns[:keys] + part
        for c in chosen:
            t.add_column(c.header, justify=c.justify, overflow="fold")
        for row in zip(*(list(c.cells) for c in chosen), strict=False):
            t.add_row(*row)
        out.append(t)
    return out


LOAD_COLUMNS = (
    "runner",
    "law",
    "load",
    "req",
    "out tok/s",
    "req/s",
    GOODPUT.name,
    "TTFT p50",
    "TTFT p99",
    "ITL p99",
    "step p50",
    "TPOT",
    "accept rate",
    "mean acc len",
    "accept by pos",
    "tok/burst",
    "speedup (CI)",
)


def load_rows(report: Report) -> list[list[str]]:
    """One row per runner, law and load point of a served run (gate.analysis.load_points.LoadPoint);
    tok/burst says when the client's timing could not separate bursts there (gate.measure.client_check)."""

    def unseparated(p: Any) -> str:
        blind = any(
            not c.bursts_separable for c in report.client if (c.runner, c.law, c.load) == (p.runner, p.law, p.label)
        )
        return " (client cannot separate bursts)" if blind and p.tokens_per_burst is not None else ""

    def ms(x: float | None, fmt: str = ".0f") -> str:
        return "-" if x is None else f"{format(x, fmt)} ms"

    rows = []
    for p in report.load:
        speedup = (
            "-"
            if p.speedup is None
            else f"{p.speedup:.2f}x"
            + (f" ({p.speedup_low:.2f}-{p.speedup_high:.2f})" if p.speedup_low is not None else " (no CI)")
        )
        rows.append(
            [
                p.runner + did_not_speculate(report, p.runner, p.law, p.kind, p.value),
                p.law,
                p.label,
                str(p.requests),
                _f(p.output_throughput, ".1f"),
                _f(p.request_throughput, ".2f"),
                _f(p.goodput, ".2f"),
                ms(p.ttft_p50_ms),
                ms(p.ttft_p99_ms),
                ms(p.itl_p99_ms, ".1f"),
                ms(p.step_p50_ms, ".1f"),
                ms(p.tpot_mean_ms, ".1f"),
                _f(p.acceptance_rate, ".3f"),
                _f(p.mean_acceptance_length, ".2f"),
                "-" if not p.acceptance_per_pos else " ".join(f"{x:.2f}" for x in p.acceptance_per_pos),
                _f(p.tokens_per_burst, ".2f") + unseparated(p),
                speedup,
            ]
        )
    return rows


PREDICTION_COLUMNS = (
    "draft",
    "law",
    "load",
    "in flight (Little)",
    "verified tok/step",
    "alpha (i.i.d.)",
    "steps proposing",
    "tok/step (model)",
    "tok/step (measured)",
    "step cost (x decode)",
    "predicted",
    "measured",
)


def prediction_rows(report: Report) -> list[list[str]]:
    """One row per draft, law and load point with the speedup model at load
    (gate.analysis.load_points: predicted = the model's tokens per step / the step cost ratio)
    beside the measured speedup; only rows where the model has its figures."""
    rows = []
    for p in report.load:
        if p.runner == FALLBACK or p.predicted_speedup is None:
            continue
        rows.append(
            [
                p.runner,
                p.law,
                p.label,
                _f(p.effective_batch, ".2f"),
                _f(p.verified_per_step, ".1f"),
                _f(p.alpha_iid, ".3f"),
                "-" if p.proposal_share is None else f"{p.proposal_share:.0%}",
                _f(p.expected_tokens_per_step, ".2f"),
                _f(p.tokens_per_step, ".2f"),
                _f(p.step_cost_ratio, ".2f"),
                f"{p.predicted_speedup:.2f}x",
                "-" if p.speedup is None else f"{p.speedup:.2f}x",
            ]
        )
    return rows


CLIENT_COLUMNS = (
    "runner",
    "law",
    "load",
    "rep",
    "req",
    "workers",
    "schedule lag p50/p99/max",
    "loop lag p99/max",
    "send p50",
    "server headers p50/p99",
    "worker CPU",
    "delayed",
    "tokens != server",
    "TTFT - server",
)


def client_rows(report: Report) -> list[list[str]]:
    """One row per served window: the client's check of itself (gate.measure.client_check)."""

    def ms(*xs: float | None) -> str:
        return "-" if all(x is None for x in xs) else "/".join("-" if x is None else f"{x:.1f}" for x in xs) + " ms"

    def server(c: Any) -> str:  # gate's TTFT minus the server's: its prefill per request, its histogram's mean
        parts = [
            f"{label} {x:+.1f} ms"
            for label, x in (("prefill", c.ttft_minus_server_prefill_ms), ("mean", c.ttft_minus_server_ms))
            if x is not None
        ]
        return ", ".join(parts) or "-"

    def bound(c: Any) -> str:
        return f" (>{c.max_client_lag_ms:g} ms)" if c.max_client_lag_ms is not None else ""

    return [
        [
            c.runner,
            c.law,
            c.load,
            "-" if c.repetition is None else str(c.repetition),
            str(c.requests),
            str(c.workers),
            ms(c.schedule_lag_p50_ms, c.schedule_lag_p99_ms, c.schedule_lag_max_ms),
            ms(c.loop_lag_p99_ms, c.loop_lag_max_ms),
            ms(c.send_p50_ms),
            ms(c.server_headers_p50_ms, c.server_headers_p99_ms),
            "-" if c.worker_cpu_max is None else f"{c.worker_cpu_max:.0%}",
            f"{c.delayed}{bound(c)}",
            str(c.token_mismatches),
            server(c),
        ]
        for c in report.client
    ]


ENVELOPE_COLUMNS = (
    "runner",
    "law",
    "SLO load",
    "stopped",
    "out tok/s at lower",
    "probes (load: verdict, tok/s)",
    "wall",
    "SLOs",
)


def envelope_rows(report: Report) -> list[list[str]]:
    """One row per runner and law of the envelope search (load.search, gate.load.search): the
    interval [lower, upper), why the search stopped, and every probe in run order."""

    def median(xs: list[float]) -> float | None:
        return sorted(xs)[len(xs) // 2] if xs else None

    rows = []
    for e in report.measurements.envelopes:
        at = next((p for p in e.probes if p.load == e.lower), None)
        thr = median(at.throughputs) if at is not None else None
        probes = ", ".join(
            f"{p.load:g}: {p.verdict}" + (f" {median(p.throughputs):.0f}" if p.throughputs else "") for p in e.probes
        )
        slos = [f"{k} <= {v:g} ms" for k, v in e.slo_ms.items()]
        slos = ([f"{', '.join(slos)} on {e.min_good_share:.0%}"] if slos else []) + (
            [f"itl p99 <= {e.itl_p99_ms:g} ms"] if e.itl_p99_ms is not None else []
        )
        rows.append(
            [
                e.runner,
                e.law,
                e.shown(),
                e.stop,
                _f(thr, ".1f"),
                probes,
                f"{e.wall_s:.0f} s",
                "; ".join(slos) or "saturation only",
            ]
        )
    return rows


SCHEDULE_COLUMNS = (
    "draft",
    "law",
    "load",
    "K",
    "runner",
    "speedup per repetition",
    "median",
    "spread",
    "pooled speedup [CI]",
    "chosen",
)


def schedule_rows(report: Report) -> list[list[str]]:
    """One row per swept draft, law, load point and K (num_draft_tokens_sweep,
    gate.analysis.schedule): the per-repetition speedups, their median and spread, the pooled
    speedup with its interval, and which K is the best there."""
    rows = []
    for c in report.schedule:
        for x in c.cells:
            reps = ", ".join("-" if v is None else f"{v:.2f}" for v in x.per_repetition) if x.k else "1 (the fallback)"
            ci = (
                "-"
                if x.speedup is None
                else f"{x.speedup:.2f}x"
                + (f" [{x.speedup_low:.2f}, {x.speedup_high:.2f}]" if x.k and x.speedup_low is not None else "")
            )
            mark = (
                "best"
                if x.k == c.best_k
                else (
                    "no proposal"
                    if x.no_proposal
                    else "unstable"
                    if x.k and x.spread is not None and not x.stable
                    else ""
                )
            )
            if x.k == c.declared_k:
                mark = f"{mark}, declared" if mark else "declared"
            rows.append(
                [
                    c.draft,
                    c.law,
                    c.label,
                    str(x.k),
                    x.runner,
                    reps,
                    _f(x.score, ".2f"),
                    "-" if x.spread is None or not x.k else f"{x.spread:.0%}",
                    ci,
                    mark,
                ]
            )
    return rows


def schedule_tables(report: Report) -> list[Table | Text]:
    """The num_draft_tokens sweep's table and its K schedule (none without a sweep)."""
    if not report.schedule:
        return []
    table = Table(
        title="num_draft_tokens per load (num_draft_tokens_sweep): the best stable K at each load point",
        title_justify="left",
    )
    for col in SCHEDULE_COLUMNS:
        table.add_column(col, justify="left" if col in ("draft", "law", "load", "runner", "chosen") else "right")
    for row in schedule_rows(report):
        table.add_row(*(escape(x) for x in row))
    lines = Table(title="K schedule", title_justify="left", show_header=False)
    lines.add_column("schedule", overflow="fold")
    for line in schedule_lines(report.schedule) + [c.message for c in report.schedule]:
        lines.add_row(escape(line))
    return [table, lines]


def client_warnings(report: Report) -> list[str]:
    """The client self-check's warnings, each with its window."""
    return [
        f"{c.runner} {c.law} {c.load}" + (f" rep {c.repetition}" if c.repetition is not None else "") + f": {w}"
        for c in report.client
        for w in c.warnings
    ]


def load_tables(report: Report) -> list[Table | Text]:
    """The served run's tables: every load point, the crossovers and the servers (none in-process)."""
    if not report.load:
        return []
    table = Table(
        title="At each load point (served; acceptance from the server's counters; speedup: paired requests, "
        f"{int(100 * report.policy.get('measurement', {}).get('confidence', 0.95))}% CI)",
        title_justify="left",
    )
    for col in LOAD_COLUMNS:
        table.add_column(col, justify="left" if col in ("runner", "law", "load") else "right")
    for row in load_rows(report):
        table.add_row(*(escape(x) for x in row))
    out: list[Table | Text] = [table]
    if report.crossovers:
        cross = Table(
            title="Crossover: the lowest load at which a draft's speedup interval lies below 1.0x",
            title_justify="left",
            show_header=False,
        )
        cross.add_column("crossover", overflow="fold")
        for c in report.crossovers:
            cross.add_row(escape(c.message))
        out.append(cross)
    if predicted := prediction_rows(report):
        model = Table(
            title="Predicted at load: the model's tokens per step (i.i.d. alpha, the share of steps proposing) "
            "over the step cost (a step in decode steps of the fallback at that load), beside the measured "
            "speedup",
            title_justify="left",
        )
        for col in PREDICTION_COLUMNS:
            model.add_column(col, justify="left" if col in ("draft", "law", "load") else "right")
        for row in predicted:
            model.add_row(*(escape(x) for x in row))
        out.append(model)
    if report.equal_interactivity:
        eq = Table(
            title="At equal interactivity (output throughput at the same per-user speed, read off each runner's "
            "Pareto front)",
            title_justify="left",
            show_header=False,
        )
        eq.add_column("comparison", overflow="fold")
        for e in report.equal_interactivity:
            eq.add_row(escape(e.message))
        out.append(eq)
    if report.measurements.envelopes:
        env = Table(
            title="Envelope search (load.search): each runner's SLO load [held, failed), probes in run order",
            title_justify="left",
        )
        for col in ENVELOPE_COLUMNS:
            env.add_column(col, justify="left", overflow="fold")
        for row in envelope_rows(report):
            env.add_row(*(escape(x) for x in row))
        out.append(env)
    if report.client:
        client = Table(
            title="Client self-check (how late the client sent and read; delayed requests are left out of "
            "timing verdicts)",
            title_justify="left",
        )
        for col in CLIENT_COLUMNS:
            client.add_column(col, justify="left" if col in ("runner", "law", "load") else "right")
        for row in client_rows(report):
            client.add_row(*(escape(x) for x in row))
        out.append(client)
        for w in client_warnings(report):
            out.append(Text(f"client: {w}"))
    servers = report.measurements.servers
    if servers:
        t = Table(title="Servers", title_justify="left")
        for col in ("runner", "version", "peak RSS", "verification", "KV pool", "command"):
            t.add_column(col, overflow="fold")
        for x in servers:
            verification = (
                "-"
                if x.verification is None
                else x.verification + ("" if x.lossless is None else " (lossless)" if x.lossless else " (NOT lossless)")
            )
            pool = (
                "-"
                if x.kv_pool_tokens is None
                else f"{x.kv_pool_tokens:,} tokens"
                + (f", {format_value(x.kv_pool_bytes, Dimension.BYTES)}" if x.kv_pool_bytes else "")
                + (f" at {x.served_dtype}" if x.served_dtype else "")
            )
            t.add_row(
                escape(x.runner),
                escape(x.version or "-"),
                format_value(x.peak_rss_bytes, Dimension.BYTES) if x.peak_rss_bytes is not None else "-",
                escape(verification),
                escape(pool),
                escape(" ".join(x.command) if x.command else (x.endpoint or "-")),
            )
        out.append(t)
    return out


def breakdown_rows(report: Report, by: str) -> list[list[str]]:
    """Rows (draft, law, slice, requests, overlap, accept rate, mean acc len, speedup, slower) for every draft."""
    rows = []
    for r in report.summary:
        slices = r.by_category if by == "category" else r.by_context_length
        if r.runner == "fallback":
            continue
        for name, b in slices.items():
            rows.append(
                [
                    r.runner,
                    r.law,
                    name,
                    str(b.requests),
                    _f(b.overlap_mean, ".3f"),
                    _f(b.acceptance_rate, ".3f"),
                    _f(b.mean_acceptance_length, ".2f"),
                    _f(b.speedup, ".2f") + ("x" if b.speedup is not None else ""),
                    _percent(b.slower_than_fallback),
                ]
            )
    return rows


BREAKDOWN_COLUMNS = (
    "draft",
    "law",
    "slice",
    "req",
    OVERLAP.name,
    "accept rate",
    "mean acc len",
    SPEEDUP.name,
    "slower than fallback",
)


def breakdown_table(report: Report, by: str) -> Table | None:
    """Where each draft pays and where it does not: pooled figures per category (or context length)."""
    rows = breakdown_rows(report, by)
    if not rows or (by == "category" and len({row[2] for row in rows}) < 2):
        return None
    title = "By category" if by == "category" else "By context length (tokens)"
    t = Table(title=f"{title}: counters and tokens pooled per slice", title_justify="left")
    for col in BREAKDOWN_COLUMNS:
        t.add_column(
            by.replace("_", " ") if col == "slice" else col,
            justify="left" if col in ("draft", "law", "slice") else "right",
        )
    for row in rows:
        t.add_row(*(escape(x) for x in row))
    return t


CONSTRAINT_FIGURES = (
    (OVERLAP.name, "overlap_mean", ".3f"),
    ("accept rate", ACCEPTANCE_RATE.name, ".3f"),
    ("mean acc len", MEAN_ACCEPTANCE_LENGTH.name, ".2f"),
)


def constraint_labels(report: Report) -> list[str]:
    """The grammar-constraint labels (workload.constraints) the summary rows break down by,
    in the workload's order; fewer than two: nothing to set side by side."""
    return list(dict.fromkeys(c for r in report.summary for c in r.by_constraint))


def constraint_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """Acceptance under each grammar constraint side by side, one row per draft and law:
    (column names, rows). Columns: draft, law, then per constraint label its overlap, accept
    rate and mean acceptance length ('<label>: <figure>'). ([], []) with fewer than two labels."""
    labels = constraint_labels(report)
    if len(labels) < 2:
        return [], []
    columns = ["draft", "law"] + [f"{c}: {name}" for c in labels for name, _, _ in CONSTRAINT_FIGURES]
    rows = []
    for r in report.summary:
        if r.runner == "fallback":
            continue
        row = [r.runner, r.law]
        for c in labels:
            b = r.by_constraint.get(c)
            row += [_f(None if b is None else getattr(b, key), fmt) for _, key, fmt in CONSTRAINT_FIGURES]
        rows.append(row)
    return columns, rows


def constraint_table(report: Report) -> Table | None:
    """Overlap, acceptance rate and mean acceptance length under each grammar constraint,
    the constraints of one draft and law on adjacent rows (counters pooled per constraint);
    None with fewer than two constraints. One row per constraint, not one column group: a
    terminal keeps it readable with many labels (Markdown and HTML set them side by side)."""
    labels = constraint_labels(report)
    if len(labels) < 2:
        return None
    t = Table(
        title="By grammar constraint (workload.constraints): counters pooled per constraint", title_justify="left"
    )
    for col in ("draft", "law", "constraint", *(name for name, _, _ in CONSTRAINT_FIGURES)):
        t.add_column(col, justify="left" if col in ("draft", "law", "constraint") else "right")
    for r in report.summary:
        if r.runner == "fallback":
            continue
        for c in labels:
            b = r.by_constraint.get(c)
            t.add_row(
                escape(r.runner),
                escape(r.law),
                escape(c),
                *(_f(None if b is None else getattr(b, key), fmt) for _, key, fmt in CONSTRAINT_FIGURES),
            )
    return t


def bill_tables(bills: list) -> list[Table]:  # type: ignore[type-arg]
    """One table per runner: line, formula, bytes, whether it coexists at the peak; then the budget."""
    tables = []
    for b in bills:
        t = Table(
            title=f"Resource bill: {escape(b.draft)} ({b.sequences} seq x {b.context_tokens} tokens)",
            title_justify="left",
        )
        for col in ("allocation", "formula", "bytes", "at peak"):
            t.add_column(col, justify="right" if col == "bytes" else "left", overflow="fold")
        for line in b.lines:
            t.add_row(
                escape(line.name),
                escape(line.formula),
                format_value(line.bytes, Dimension.BYTES),
                "yes" if line.coexists_at_peak else "no",
            )
            if line.measured_bytes is not None:
                t.add_row(
                    "  measured",
                    f"real cache tensors at {line.measured_at_tokens} tokens (formula: "
                    f"{line.predicted_at_measured_bytes} B)",
                    format_value(line.measured_bytes, Dimension.BYTES),
                    "",
                )
        t.add_row("total", "", format_value(b.total_bytes, Dimension.BYTES), "")
        if b.budget is not None:
            u = b.budget
            t.add_row("capacity", "", format_value(u.capacity_bytes, Dimension.BYTES), "")
            t.add_row(
                "headroom",
                "capacity - total" + ("  DOES NOT FIT" if u.headroom_bytes < 0 else ""),
                format_value(u.headroom_bytes, Dimension.BYTES),
                "",
            )
            t.add_row(
                "more sequences that fit",
                f"headroom / {format_value(u.bytes_per_extra_sequence, Dimension.BYTES)} per sequence",
                str(u.extra_sequences),
                "",
            )
            t.add_row(
                "more context per sequence",
                f"headroom / {format_value(u.bytes_per_extra_context_token, Dimension.BYTES)} per token",
                f"{u.extra_context_tokens} tokens",
                "",
            )
        tables.append(t)
    return tables


def roofline_tables(rows: list) -> list[Table]:  # type: ignore[type-arg]
    """Steps on the roofline per runner and batch; predicted vs measured speedup per law."""
    t = Table(title="Steps on the roofline", title_justify="left")
    for col in (
        "runner",
        "step",
        "batch",
        "tokens/seq",
        "GFLOP",
        "MB read",
        "FLOP/byte",
        "attainable GFLOP/s",
        "time",
        "bound",
        "ridge batch",
    ):
        t.add_column(col, justify="left" if col in ("runner", "step", "bound") else "right")
    for r in rows:
        for s in r.steps:
            t.add_row(
                escape(r.runner),
                s.name,
                str(s.batch),
                str(s.tokens_per_sequence),
                f"{s.flops / 1e9:.3g}",
                f"{s.bytes / 1e6:.4g}",
                f"{s.intensity:.3g}",
                f"{s.attainable_flops / 1e9:.4g}",
                f"{s.time_s * 1e3:.3g} ms",
                s.bound,
                "never" if r.ridge_batch == float("inf") else f"{r.ridge_batch:.1f}",
            )
    p = Table(
        title="Predicted (primer formula: alpha = mean overlap, c from the roofline) vs measured speedup",
        title_justify="left",
    )
    for col in ("draft", "law", "cost coefficient c", "alpha", "predicted speedup", "measured speedup"):
        p.add_column(col, justify="left" if col in ("draft", "law") else "right")
    for r in rows[1:]:
        if not r.by_law:
            p.add_row(escape(r.runner), "(no --report)", _f(r.cost_coefficient, ".3f"), "-", "-", "-")
        for law, v in r.by_law.items():
            p.add_row(
                escape(r.runner),
                escape(law),
                _f(r.cost_coefficient, ".3f"),
                _f(v["alpha"], ".3f"),
                _f(v["predicted_speedup"], ".2f"),
                _f(v["measured_speedup"], ".2f"),
            )
    return [t, p]


def comparison_table(result) -> Table:  # type: ignore[no-untyped-def]
    """gate compare: one row per figure, candidate over baseline with its interval."""
    t = Table(
        title=f"{result.candidate_file} against {result.baseline_file} (tolerance {result.tolerance:.0%})",
        title_justify="left",
    )
    for col in ("verdict", "draft", "law", "figure", "baseline", "candidate", "ratio", "interval", "note"):
        t.add_column(col, overflow="fold")

    def shown(x: float | str | None, figure: str) -> str:
        if x is None:
            return "-"
        if isinstance(x, str):
            return x
        return format_value(float(x), Dimension.BYTES) if figure.startswith("memory") else f"{float(x):.3f}"

    for c in result.comparisons:
        interval = f"{c.interval.low:.3f}-{c.interval.high:.3f}" if c.interval else "-"
        t.add_row(
            f"[{_STYLE.get(c.verdict, '')}]{c.verdict}[/]",
            escape(c.draft if c.draft == c.baseline_draft else f"{c.draft} (was {c.baseline_draft})"),
            escape(c.law),
            escape(c.figure),
            shown(c.baseline, c.figure),
            shown(c.candidate, c.figure),
            "-" if c.ratio is None or math.isnan(c.ratio) else f"{c.ratio:.3f}x",
            interval,
            escape(c.note),
        )
    return t


register(ConsoleReport, "tables on the terminal: one row per draft and law, then every outcome")
