"""Markdown summary for $GITHUB_STEP_SUMMARY or a pull-request comment: verdict, the
per-draft figures and every rule that did not pass (passing rules are counted)."""

from __future__ import annotations

from gate.analysis.schedule import schedule_lines
from gate.core.units import Dimension, format_value
from gate.measure.tokenizers import mapping_lines
from gate.report.console import (
    BREAKDOWN_COLUMNS,
    CLIENT_COLUMNS,
    ENVELOPE_COLUMNS,
    LOAD_COLUMNS,
    PREDICTION_COLUMNS,
    SCHEDULE_COLUMNS,
    breakdown_rows,
    client_rows,
    client_warnings,
    constraint_rows,
    device_peak_cell,
    device_peak_note,
    device_peak_shown,
    envelope_rows,
    load_rows,
    prediction_rows,
    schedule_rows,
)
from gate.report.document import Report
from gate.report.identity import identity_lines
from gate.report.interface import ReportFormat
from gate.report.registry import register
from gate.rules.status import Status

_MARK = {
    Status.PASS: "pass",
    Status.FAIL: "**FAIL**",
    Status.ERROR: "**ERROR**",
    Status.WARN: "warn",
    Status.SKIPPED: "skipped",
    Status.INCONCLUSIVE: "**INCONCLUSIVE**",
    Status.WAIVED: "waived",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _f(x: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if x is None else format(x, fmt) + suffix


class MarkdownReport(ReportFormat):
    """GitHub-flavoured Markdown."""

    name = "markdown"
    appends = True  # step summaries accumulate

    def render(self, report: Report) -> str:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(report.status_counts.items())) or "no rules"
        verdict = {
            0: "passed",
            1: "failed",
            3: "not decided (a verdict inconclusive or a measurement missing)",
            130: "interrupted (SIGINT), not a verdict",
            143: "interrupted (SIGTERM), not a verdict",
        }.get(report.exit_code, f"exit {report.exit_code}")
        if report.shard is not None and report.exit_code in (0, 3):  # a shard decides no rule (gate merge does)
            verdict = f"shard {report.shard}, measurements only, no verdict" + (
                "" if report.exit_code == 0 else " (a measurement failed)"
            )
        env = report.measurements.environment
        out = [
            f"## gate: {verdict}",
            "",
            f"`{_cell(report.policy_file)}`: {counts} (exit code {report.exit_code}); torch {env.torch}, "
            f"transformers {env.transformers}, {env.device}, seed {env.seed}.",
            "",
            *([_cell(report.cost.describe()), ""] if report.cost is not None else []),
        ]
        identity = identity_lines(report.measurements)  # unchanged or updated target (gate.loop.identity)
        out += [f"- **{_cell(x.split(': ', 1)[0])}**: {_cell(x.split(': ', 1)[1])}" for x in identity] + (
            [""] if identity else []
        )
        if report.summary and report.measurements.requests:
            peak = device_peak_shown(report)
            out += [
                "| draft | law | overlap | accept rate | mean acc len | tokens/s | speedup | slower | TTFT p50 | ITL "
                "p99 | bill |" + (" device peak |" if peak else ""),
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if peak else ""),
            ]
            for r in report.summary:
                bill = format_value(r.memory_bill_bytes, Dimension.BYTES) if r.memory_bill_bytes is not None else "-"
                out.append(
                    f"| {_cell(r.runner)} | {_cell(r.law)} | {_f(r.overlap_mean, '.3f')} | "
                    f"{_f(r.acceptance_rate, '.3f')} | "
                    f"{_f(r.mean_acceptance_length, '.2f')} | {_f(r.committed_tokens_per_s, '.1f')} | "
                    f"{_f(r.speedup, '.2f', 'x')} | "
                    f"{_f(None if r.slower_than_fallback is None else 100 * r.slower_than_fallback, '.0f', '%')} | "
                    f"{_f(r.ttft_p50_ms, '.0f', ' ms')} | {_f(r.itl_p99_ms, '.1f', ' ms')} | {bill} |"
                    + (f" {_cell(device_peak_cell(r))} |" if peak else "")
                )
            out.append("")
            if note := device_peak_note(report):
                out += [_cell(note[0].upper() + note[1:]) + ".", ""]
        for by, title in (("category", "By category"), ("context_length", "By context length (tokens)")):
            rows = breakdown_rows(report, by)
            if rows and (by != "category" or len({row[2] for row in rows}) > 1):
                out += [
                    f"<details><summary>{title}</summary>",
                    "",
                    "| " + " | ".join(by.replace("_", " ") if c == "slice" else c for c in BREAKDOWN_COLUMNS) + " |",
                    "|---|---|---|" + "---:|" * (len(BREAKDOWN_COLUMNS) - 3),
                ]
                out += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in rows]
                out += ["", "</details>", ""]
        columns, rows = constraint_rows(report)  # acceptance under each grammar constraint, side by side
        if rows:
            out += [
                "### By grammar constraint",
                "",
                "| " + " | ".join(_cell(c) for c in columns) + " |",
                "|---|---|" + "---:|" * (len(columns) - 2),
            ]
            out += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in rows] + [""]
        if mapping := mapping_lines(report.measurements):  # cross-tokenizer drafts (gate.drafts.cross_tokenizer)
            out += ["### Cross-tokenizer drafts: tokenizers and mapping cost", "", "```"] + mapping + ["```", ""]
        if report.load:
            out += [
                "### At each load point",
                "",
                "| " + " | ".join(LOAD_COLUMNS) + " |",
                "|---|---|---|" + "---:|" * (len(LOAD_COLUMNS) - 3),
            ]
            out += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in load_rows(report)]
            out += [""] + [f"- {_cell(c.message)}" for c in report.crossovers] + [""]
            if predicted := prediction_rows(report):
                out += [
                    "### Predicted at load",
                    "",
                    "The speedup model at each load point: a step with a proposal commits "
                    "(1 - alpha^(K+1)) / (1 - alpha) tokens (i.i.d. acceptance alpha), a step without one 1 token; a "
                    "step costs as many decode steps of the fallback as the step cost says (the draft's TPOT x its "
                    "measured tokens per step over the fallback's TPOT); predicted = model tokens per step / cost. In "
                    "flight: request throughput x mean E2EL (Little's law).",
                    "",
                    "| " + " | ".join(PREDICTION_COLUMNS) + " |",
                    "|---|---|---|" + "---:|" * (len(PREDICTION_COLUMNS) - 3),
                ]
                out += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in predicted] + [""]
        if report.schedule:
            out += [
                "### num_draft_tokens per load",
                "",
                "Each swept K's speedup over the fallback per repetition, their "
                "median (the score) and spread; the best K is the stable K of highest score (K=0: speculation off).",
                "",
                "| " + " | ".join(SCHEDULE_COLUMNS) + " |",
                "|" + "---|" * len(SCHEDULE_COLUMNS),
            ]
            out += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in schedule_rows(report)] + [""]
            out += [f"- {_cell(line)}" for line in schedule_lines(report.schedule)]
            out += [f"- {_cell(c.message)}" for c in report.schedule] + [""]
        if report.equal_interactivity:
            out += [
                "### At equal interactivity",
                "",
                "Output throughput at the same per-user speed (1000 / TPOT), read off "
                "each runner's Pareto front over the load points and search probes:",
                "",
            ]
            out += [f"- {_cell(e.message)}" for e in report.equal_interactivity] + [""]
        if report.measurements.envelopes:
            out += [
                "### Envelope search",
                "",
                "Each runner's SLO load (load.search): every SLO held at the interval's "
                "lower end, something failed at its upper end (an SLO, or the throughput stopped rising).",
                "",
                "| " + " | ".join(ENVELOPE_COLUMNS) + " |",
                "|" + "---|" * len(ENVELOPE_COLUMNS),
            ]
            out += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in envelope_rows(report)] + [""]
        if report.client:
            out += [
                "### Client self-check",
                "",
                "How late the client sent and read each window's requests; requests "
                "it delayed beyond the bound are left out of timing verdicts.",
                "",
                "| " + " | ".join(CLIENT_COLUMNS) + " |",
                "|---|---|---|" + "---:|" * (len(CLIENT_COLUMNS) - 3),
            ]
            out += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in client_rows(report)]
            out += [""] + [f"- client: {_cell(w)}" for w in client_warnings(report)] + [""]
        shown = [o for o in report.outcomes if o.status != Status.PASS]
        if shown:
            out += ["| status | rule | level | message |", "|---|---|---|---|"]
            out += [
                f"| {_MARK.get(o.status, o.status)} | `{_cell(o.name)}` | {o.level} | {_cell(o.message)} |"
                for o in shown
            ]
            out.append("")
        passed = sum(o.status == Status.PASS for o in report.outcomes)
        out.append(f"{passed} rule outcome(s) passed." if passed else "No rule outcome passed.")
        for f in report.measurements.failures:
            out.append(f"- measurement failed: {f.stage} {f.draft}/{f.law} {f.what}: {_cell(f.message)}")
        for note in report.notes:
            out.append(f"- note: {_cell(note.splitlines()[0] if note else note)}")
        return "\n".join(out) + "\n"


register(MarkdownReport, "a Markdown summary (GitHub step summary or pull-request comment); appends")
