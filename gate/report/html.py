"""One self-contained HTML page: the verdict, the rules that did not pass, then plots.

Plots are drawn with matplotlib (already a dependency; no JavaScript, nothing fetched at
view time) and inlined as SVG with text kept as text (`svg.fonttype: none`), so the page is
searchable, prints as vectors and needs no network. On the embedded example
(examples/smollm2/policy.yaml: 3 drafts x 2 laws x 24 prompts, 9 plots) the page is about 320 kB;
the size grows with the number of drafts and laws, not with the number of requests (CDFs
are drawn through at most 200 quantiles per curve).

Every plot is a `<figure class="plot" data-plot="NAME" data-points="N">` holding one inline
SVG and a one-line caption saying what it shows; N counts the plotted values. A plot the
report has no data for is left out and named, with the reason, under "Not plotted".
The page is the Jinja2 template templates/report.html.j2 (its CSS in templates/report.css),
autoescaped: every text taken from the report is escaped (matplotlib escapes SVG text and
`text.parse_math` is off, so a `$` in a draft name is not TeX).

Plots (names as in data-plot): acceptance-per-position, accepted-length (SummaryRow),
overlap-by-category, overlap-by-context (SummaryRow breakdowns), speedup (rule outcomes'
intervals where a speedup rule has one, else the summary's point values),
speedup-by-category, speedup-by-context, speedup-by-load (served runs: LoadPoint
intervals, Crossover marked), ttft-cdf, itl-cdf (RequestRecord.token_times_ms),
memory-bill (BillRecord lines against resources.capacity or the memory rules' thresholds),
roofline and predicted-vs-measured (only when given RooflineRow rows, `gate roofline`'s
figures: a saved report carries no prediction), exactness (sampling tests' p-values and
the effect they detect at their power)."""

from __future__ import annotations

import functools
import io
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from gate.analysis.schedule import schedule_lines
from gate.core.units import Dimension, format_value
from gate.exactness.stats import DEFAULT_SIGNIFICANCE
from gate.measure.tokenizers import mapping_lines
from gate.metrics.catalogue import MEMORY_BILL_BYTES, SPEEDUP
from gate.records import FALLBACK
from gate.report.console import (
    CLIENT_COLUMNS,
    CONSTRAINT_FIGURES,
    ENVELOPE_COLUMNS,
    PREDICTION_COLUMNS,
    SCHEDULE_COLUMNS,
    client_rows,
    client_warnings,
    constraint_labels,
    constraint_rows,
    device_peak_cell,
    device_peak_note,
    device_peak_shown,
    envelope_rows,
    prediction_rows,
    schedule_rows,
)
from gate.report.document import Report
from gate.report.identity import identity_lines
from gate.report.interface import ReportFormat
from gate.report.registry import register
from gate.rules.status import Status

_VERDICT = {
    0: "passed",
    1: "failed",
    2: "invalid input",
    3: "not decided (a verdict inconclusive or a measurement missing)",
    130: "interrupted (SIGINT), not a verdict",
    143: "interrupted (SIGTERM), not a verdict",
}
_STATUS_CLASS = {
    Status.FAIL: "fail",
    Status.ERROR: "error",
    Status.INCONCLUSIVE: "inconclusive",
    Status.WARN: "warn",
    Status.WAIVED: "waived",
    Status.SKIPPED: "skipped",
    Status.PASS: "pass",
}
_ORDER = {
    Status.ERROR: 0,
    Status.FAIL: 1,
    Status.INCONCLUSIVE: 2,
    Status.WARN: 3,
    Status.WAIVED: 4,
    Status.SKIPPED: 5,
    Status.PASS: 6,
}
_CDF_QUANTILES = 200  # points per CDF curve at most: the page's size does not grow with the requests
_WIDTH_IN = 7.6  # figure width (inches): fits an A4/Letter page at 100 dpi-equivalent

_RC = {
    "svg.fonttype": "none",  # text stays text: small, searchable, printable
    "text.parse_math": False,  # a '$' in a draft name is text, not TeX
    "font.size": 9.0,
    "font.family": "sans-serif",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 8.0,
    "legend.frameon": False,
}


@dataclass
class Plot:
    """One rendered plot: its name (data-plot), the values it shows (data-points), the
    inline SVG and the caption (plain text, escaped when the page is written)."""

    name: str
    title: str
    points: int
    svg: str
    caption: str


@dataclass
class Skipped:
    """A plot left out: its name and why (plain text)."""

    name: str
    title: str
    reason: str


@functools.cache
def _template() -> jinja2.Template:
    """The page template (templates/report.html.j2, its CSS in templates/report.css), autoescaped."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gate.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["fold"] = _fold
    return env.get_template("report.html.j2")


def _fold(text: str, keep: int = 180) -> tuple[str, str] | None:
    """A long text split after about its first `keep` characters, at a space (the table of
    rules stays short enough to see the plots below it); None for a short one."""
    if len(text) <= keep + 40:
        return None
    cut = text.rfind(" ", 0, keep)
    cut = cut if cut > keep // 2 else keep
    return text[:cut], text[cut:]


def _outcome_row(o: Any) -> dict[str, str]:
    """One row of the table of outcomes that did not pass."""
    measured = "-" if o.measured is None else f"{o.measured:.4g}"
    if o.interval is not None:
        measured += f" ({o.interval.low:.4g}-{o.interval.high:.4g})"
    return {
        "cls": _STATUS_CLASS.get(o.status, ""),
        "status": str(o.status).upper(),
        "name": o.name,
        "level": str(o.level),
        "measured": measured,
        "message": o.message,
    }


def _grid(report: Report, shown: list[Any]) -> dict[str, Any]:
    """Rules that did not pass (rows) by scope (columns): status and measured value per cell,
    so thirty outcomes fit on one screen; passing cells of those rules included."""
    rules = list(dict.fromkeys(o.rule_id for o in shown))
    column = {
        o.scope: "/".join(o.scope.split("/", 2)[:2]) for o in report.outcomes
    }  # draft/law; categories in the cell
    scopes = list(dict.fromkeys(column[o.scope] for o in report.outcomes if o.rule_id in rules))
    cells: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for o in report.outcomes:
        if o.rule_id in rules:
            cells[(o.rule_id, column[o.scope])].append(o)
    rows = []
    for rule in rules:
        row: list[dict[str, Any] | None] = []
        for scope in scopes:
            here = cells.get((rule, scope), [])
            if not here:
                row.append(None)
                continue
            worst = min(here, key=lambda o: _ORDER.get(o.status, 9))
            parts = []
            for o in here:
                cats = o.scope.split("/", 2)[2] if o.scope.count("/") >= 2 else ""
                label = str(o.status) if len(here) == 1 else f"{cats}: {o.status}"
                value = "" if o.measured is None else f"{o.measured:.3g}"
                parts.append({"message": o.message, "label": label, "value": value})
            row.append({"cls": _STATUS_CLASS.get(worst.status, ""), "parts": parts})
        rows.append({"rule": rule, "cells": row})
    return {"scopes": scopes, "rows": rows}


def _summary_rows(report: Report) -> list[dict[str, Any]]:
    """The table of drafts against the fallback: each row's cells and its class (pays:
    the speedup interval lies wholly above 1.0x, costs: wholly below)."""

    def f(x: float | None, fmt: str, suffix: str = "") -> str:
        return "-" if x is None else format(x, fmt) + suffix

    intervals = _speedup_intervals(report)
    out = []
    for r in (r for r in report.summary if r.requests):
        speedup = f(r.speedup, ".2f", "x")
        iv = intervals.get((r.runner, r.law, None))
        if iv is not None and iv[1] is not None:
            speedup = f"{iv[0]:.2f}x ({iv[1]:.2f}-{iv[2]:.2f})"
        # coloured only where the interval decides: wholly above 1.0x pays, wholly below costs
        cls = ""
        if r.runner != FALLBACK and iv is not None and iv[1] is not None and iv[2] is not None:
            cls = "pays" if iv[1] > 1 else "costs" if iv[2] < 1 else ""
        bill = format_value(r.memory_bill_bytes, Dimension.BYTES) if r.memory_bill_bytes is not None else "-"
        slower = None if r.slower_than_fallback is None else 100 * r.slower_than_fallback
        cells = [
            r.runner,
            r.law,
            str(r.requests),
            f(r.overlap_mean, ".3f"),
            f(r.acceptance_rate, ".3f"),
            f(r.mean_acceptance_length, ".2f"),
            f(r.committed_tokens_per_s, ".1f"),
            speedup,
            f(slower, ".0f", "%"),
            f(r.ttft_p50_ms, ".0f", " ms"),
            f(r.itl_p99_ms, ".1f", " ms"),
            bill,
            *([device_peak_cell(r)] if device_peak_shown(report) else []),
        ]
        out.append({"cls": cls, "cells": cells})
    return out


def _constraints(report: Report) -> dict[str, Any] | None:
    """Overlap, acceptance rate and mean acceptance length of each draft and law under each
    grammar constraint (workload.constraints), side by side; None with fewer than two."""
    _, rows = constraint_rows(report)
    if not rows:
        return None
    return {
        "labels": constraint_labels(report),
        "figures": [name for name, _, _ in CONSTRAINT_FIGURES],
        "rows": rows,
    }


def _clean(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))) else float(x)


def _colors(names: Iterable[str]) -> dict[str, Any]:
    """One colour per runner, stable across plots: the fallback grey, drafts tab10 in order."""
    from matplotlib import colormaps

    tab = colormaps["tab10"]
    out: dict[str, Any] = {FALLBACK: "#555555"}
    i = 0
    for n in names:
        if n not in out:
            out[n] = tab(i % 10)
            i += 1
    return out


def _figure(panels: int = 1, height_in: float = 2.9, sharey: bool = True) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(_WIDTH_IN, height_in), layout="constrained")
    axes = fig.subplots(1, panels, sharey=sharey, squeeze=False)[0]
    return fig, list(axes)


_SVG_HEAD = re.compile(r"^.*?(?=<svg)", re.S)


def _svg(fig: Any, name: str) -> str:
    """The figure as an inline <svg> element (no XML prolog or DOCTYPE, ids salted per plot
    so two plots' clip paths never share an id), scaled to the page width."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": f"gate-{name}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    if not re.fullmatch(r"[a-z0-9-]+", name):
        raise ValueError(f"plot name {name!r}: lower-case letters, digits and '-' only")
    text = _SVG_HEAD.sub("", buf.getvalue(), count=1)
    # matplotlib numbers its groups per figure (figure_1, axes_1, ...): prefix every id and
    # every reference to one with the plot's name, so ids stay unique on the page
    text = re.sub(r'\bid="([^"]+)"', rf'id="{name}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{name}-\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{name}-\1"', text)
    # let CSS size it: keep the viewBox, drop the fixed width and height of the root element
    return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 role="img"', text, count=1).strip()


def _legend(ax: Any, outside: bool = False, **kw: Any) -> None:
    """A legend if anything is labelled; `outside`: right of the axes, never over the data."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(**({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if outside else {}), **kw)


def _plain_log(axis: Any) -> None:
    """Tick labels of a log axis as plain numbers (matplotlib writes them as TeX, which
    text.parse_math, off for the report's names, would show raw)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _around_one(ax: Any, values: list[float]) -> None:
    """x limits spanning `values` and 1.0x with a margin, so no marker sits on the frame."""
    lo, hi = min(values + [1.0]), max(values + [1.0])
    pad = 0.08 * (hi - lo or 1.0)
    ax.set_xlim(max(lo - pad, 0.0), hi + pad)


class HtmlReport(ReportFormat):
    """A self-contained HTML page with inline SVG plots (see the module docstring).

    `roofline`: optional gate.commands.bill.RooflineRow rows (what `gate roofline` computes from
    a policy, a bandwidth and a peak): adds the roofline and predicted-vs-measured plots;
    `bandwidth` (B/s) and `peak_flops` (FLOP/s) draw the roof itself."""

    name = "html"

    def __init__(
        self, roofline: list[Any] | None = None, bandwidth: float | None = None, peak_flops: float | None = None
    ) -> None:
        self.roofline = list(roofline or [])
        self.bandwidth = bandwidth
        self.peak_flops = peak_flops

    # --- the page -----------------------------------------------------------------------

    def render(self, report: Report) -> str:
        plots, skipped = self.plots(report)
        env = report.measurements.environment
        verdict = _VERDICT.get(report.exit_code, f"exit {report.exit_code}")
        meta = (
            f"gate {report.gate_version}, {report.created_utc}; torch {env.torch}, transformers {env.transformers}, "
            f"{env.device} ({env.device_name}), seed {env.seed}"
            + (f", {env.cpu_count} CPUs, {env.threads} threads" if env.cpu_count else "")
        )
        not_passed = [o for o in report.outcomes if o.status != Status.PASS]
        tables = [self._envelope(report), self._prediction(report), self._schedule(report), self._client(report)]
        return _template().render(
            verdict=verdict,
            verdict_class={0: "pass", 1: "fail"}.get(report.exit_code, "error"),
            policy_file=report.policy_file,
            counts=", ".join(f"{v} {k}" for k, v in sorted(report.status_counts.items())) or "no rules",
            exit_code=report.exit_code,
            meta=meta,
            identity=identity_lines(report.measurements),  # unchanged or updated target (gate.loop.identity)
            shown=[_outcome_row(o) for o in sorted(not_passed, key=lambda o: _ORDER.get(o.status, 9))],
            grid=_grid(report, not_passed) if not_passed else None,
            passed=len(report.outcomes) - len(not_passed),
            summary=_summary_rows(report),
            device_peak=device_peak_shown(report),
            device_peak_note=device_peak_note(report),
            constraints=_constraints(report),
            mapping=mapping_lines(report.measurements),  # cross-tokenizer drafts (gate.drafts.cross_tokenizer)
            crossovers=[c.message for c in report.crossovers],
            plots=plots,
            skipped=skipped,
            tables=[t for t in tables if t is not None],
            failures=[f"{f.stage} {f.draft}/{f.law} {f.what}: {f.message}" for f in report.measurements.failures],
            notes=report.notes,
        )

    def _envelope(self, report: Report) -> dict[str, Any] | None:
        """The envelope search (load.search): each runner's SLO load and its probes."""
        if not report.measurements.envelopes:
            return None
        return _table_section(
            "envelope-search",
            "Envelope search",
            "Each runner's SLO load: every SLO held at the interval's "
            "lower end, something failed at its upper end (an SLO, or the throughput stopped rising: "
            "the server saturated).",
            ENVELOPE_COLUMNS,
            envelope_rows(report),
        )

    def _prediction(self, report: Report) -> dict[str, Any] | None:
        """The speedup model at each load point beside the measured speedup (gate.analysis.load_points)."""
        rows = prediction_rows(report)
        if not rows:
            return None
        return _table_section(
            "predicted-at-load",
            "Predicted at load",
            "A step with a proposal commits (1 - alpha^(K+1)) "
            "/ (1 - alpha) tokens (i.i.d. acceptance alpha), a step without one 1 token; a step costs as "
            "many decode steps of the fallback as the step cost says (the draft's TPOT x its measured "
            "tokens per step over the fallback's TPOT, at the same load); predicted = the model's tokens "
            "per step / cost. In flight: request throughput x mean E2EL (Little's law); verified tokens "
            "per step: in flight x (1 + proposals per step).",
            PREDICTION_COLUMNS,
            rows,
        )

    def _schedule(self, report: Report) -> dict[str, Any] | None:
        """num_draft_tokens per load (num_draft_tokens_sweep): every K's speedup and the best K."""
        if not report.schedule:
            return None
        return _table_section(
            "num-draft-tokens",
            "num_draft_tokens per load",
            "Each swept K's speedup over the fallback per "
            "repetition, their median (the score) and spread (max - min over the median); the best K is "
            "the stable K of highest score, K=0 being speculation off.",
            SCHEDULE_COLUMNS,
            schedule_rows(report),
            "schedule",
            schedule_lines(report.schedule) + [c.message for c in report.schedule],
        )

    def _client(self, report: Report) -> dict[str, Any] | None:
        """The client's check of itself, per served window (gate.measure.client_check)."""
        if not report.client:
            return None
        return _table_section(
            "client",
            "Client self-check",
            "How late the client sent and read each window's requests "
            "(schedule lag: begun after it was due; loop lag: its worker's event loop ran late while it "
            "was in flight). Requests it delayed beyond the bound are left out of timing verdicts.",
            CLIENT_COLUMNS,
            client_rows(report),
            "client-warnings",
            client_warnings(report),
        )

    # --- the plots -----------------------------------------------------------------------

    def plots(self, report: Report) -> tuple[list[Plot], list[Skipped]]:
        """Every plot the report has data for, and the others with the reason."""
        import matplotlib

        makers: list[tuple[str, str, Callable[[Report, dict[str, Any]], Plot | str]]] = [
            (SPEEDUP.name, "Speedup against the fallback", _speedup),
            ("speedup-by-category", "Speedup by category", _speedup_by_category),
            ("speedup-by-context", "Speedup by context length", _speedup_by_context),
            ("speedup-by-load", "Speedup by load (served)", _speedup_by_load),
            ("throughput-vs-interactivity", "Throughput against per-user speed (served)", _interactivity),
            ("acceptance-per-position", "Acceptance per position", _acceptance_per_position),
            ("accepted-length", "Accepted-length histogram", _accepted_length),
            ("overlap-by-category", "Overlap by category", _overlap_by_category),
            ("overlap-by-context", "Overlap by context length", _overlap_by_context),
            ("ttft-cdf", "Time to first token", _ttft_cdf),
            ("itl-cdf", "Inter-token latency", _itl_cdf),
            ("memory-bill", "Memory bill", _memory_bill),
            ("roofline", "Roofline", self._roofline),
            ("predicted-vs-measured", "Predicted vs measured speedup", self._predicted),
            ("exactness", "Exactness tests", _exactness),
        ]
        runners = [FALLBACK, *report.measurements.drafts, *(r.runner for r in report.summary)]
        colors = _colors(runners)
        plots, skipped = [], []
        with matplotlib.rc_context(_RC):  # type: ignore[arg-type]  # its keys typed as literals
            for name, title, make in makers:
                got = make(report, colors)
                if isinstance(got, str):
                    skipped.append(Skipped(name, title, got))
                else:
                    got.name, got.title = name, title
                    plots.append(got)
        return plots, skipped

    def _roofline(self, report: Report, colors: dict[str, Any]) -> Plot | str:
        steps = [(r.runner, s) for r in self.roofline for s in r.steps]
        if not steps:
            return (
                "a saved report has no roofline: run `gate report` with --roofline-policy, --bandwidth and --peak "
                "(or see `gate roofline`)"
            )
        fig, (ax,) = _figure(height_in=3.2)
        xs = [s.intensity for _, s in steps]
        if self.bandwidth and self.peak_flops:
            lo, hi = min(xs) / 4, max(max(xs) * 4, 4 * self.peak_flops / self.bandwidth)
            grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
            ax.plot(
                grid, [min(self.peak_flops, self.bandwidth * x) / 1e9 for x in grid], color="black", lw=1, label="roof"
            )
        for runner in dict.fromkeys(r for r, _ in steps):
            mine = [s for r, s in steps if r == runner]
            ax.plot(
                [s.intensity for s in mine],
                [s.attainable_flops / 1e9 for s in mine],
                "o" if runner == FALLBACK else "s",
                color=colors.get(runner),
                label=f"{runner} ({mine[0].name})",
            )
            for s in mine:
                ax.annotate(
                    f"b={s.batch}",
                    (s.intensity, s.attainable_flops / 1e9),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log(ax.xaxis)
        _plain_log(ax.yaxis)
        ax.set_xlabel("operational intensity (FLOP/byte)")
        ax.set_ylabel("attainable (GFLOP/s)")
        _legend(ax, loc="lower right")
        return Plot(
            "",
            "",
            len(steps),
            _svg(fig, "roofline"),
            "The fallback's decode step and each draft's verification step (num_draft_tokens + 1 tokens per sequence) "
            "at each batch size b on the roofline: left of the ridge a step is bandwidth-bound.",
        )

    def _predicted(self, report: Report, colors: dict[str, Any]) -> Plot | str:
        pts = [
            (r.runner, law, v["predicted_speedup"], v["measured_speedup"])
            for r in self.roofline
            for law, v in r.by_law.items()
            if v.get("predicted_speedup") is not None and v.get("measured_speedup") is not None
        ]
        if not pts:
            return (
                "the report carries no predicted speedup (gate roofline --report computes one from a policy, "
                "bandwidth and peak)"
            )
        fig, (ax,) = _figure(height_in=3.2)
        top = max(max(p[2], p[3]) for p in pts) * 1.15
        ax.plot([0, top], [0, top], color="black", lw=0.8, ls="--", label="predicted = measured")
        for runner, law, pred, meas in pts:
            ax.plot([pred], [meas], "o", color=colors.get(runner))
            ax.annotate(f"{runner} · {law}", (pred, meas), fontsize=7, xytext=(4, 2), textcoords="offset points")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel("predicted speedup (x, primer formula: alpha = mean overlap, c from the roofline)")
        ax.set_ylabel("measured speedup (x)")
        _legend(ax, loc="upper left")
        return Plot(
            "",
            "",
            len(pts),
            _svg(fig, "predicted"),
            "Each draft and law: the speedup Leviathan et al.'s formula predicts from the measured overlap and the "
            "roofline's cost coefficient against the speedup measured; below the diagonal the draft underdelivers.",
        )


# --- plot makers: each returns a Plot or the reason it has nothing to plot ---------------


def _drafts(report: Report) -> list[Any]:
    return [r for r in report.summary if r.runner != FALLBACK and r.requests]


def _laws(rows: Iterable[Any]) -> list[str]:
    return list(dict.fromkeys(r.law for r in rows))


def _speedup_intervals(report: Report) -> dict[tuple[str, str, str | None], tuple[float, float | None, float | None]]:
    """(draft, law, category or None) -> (point, low, high) from the speedup rules'
    outcomes (the first outcome with an interval wins; a scope with several categories
    is not a single category and is left out)."""
    out: dict[tuple[str, str, str | None], tuple[float, float | None, float | None]] = {}
    for o in report.outcomes:
        if o.metric != SPEEDUP.name or o.measured is None or o.aggregation not in ("pooled", "mean", "median"):
            continue
        parts = o.scope.split("/", 2)
        cats = parts[2].split(",") if len(parts) > 2 else []
        if len(cats) > 1:
            continue
        key = (o.draft, o.law, cats[0] if cats else None)
        iv = o.interval
        if key not in out or (out[key][1] is None and iv is not None):
            out[key] = (o.measured, iv.low if iv else None, iv.high if iv else None)
    return out


def _errorbar(
    ax: Any, y: float, point: float, low: float | None, high: float | None, color: Any, label: str | None
) -> None:
    if low is not None and high is not None:
        ax.errorbar(
            [point],
            [y],
            xerr=[[max(point - low, 0)], [max(high - point, 0)]],
            fmt="o",
            color=color,
            capsize=3,
            label=label,
        )
    else:
        ax.plot([point], [y], "D", color=color, mfc="white", label=label)


def _speedup(report: Report, colors: dict[str, Any]) -> Plot | str:
    rows = [r for r in _drafts(report) if r.speedup is not None]
    if not rows:
        return "no draft has a measured speedup (no paired timed requests)"
    intervals = _speedup_intervals(report)
    fig, (ax,) = _figure(height_in=0.6 + 0.32 * len(rows) + 0.6)
    labels, with_ci, seen = [], 0, []
    for i, r in enumerate(rows):
        iv = intervals.get((r.runner, r.law, None))
        point, low, high = iv if iv is not None and iv[1] is not None else (r.speedup, None, None)
        with_ci += low is not None
        seen += [x for x in (point, low, high) if x is not None]
        _errorbar(ax, -i, point, low, high, colors.get(r.runner), None)
        labels.append(f"{r.runner} · {r.law}")
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    _around_one(ax, seen)
    ax.set_ylim(-len(rows) + 0.4, 0.6)
    ax.set_yticks([-i for i in range(len(rows))], labels)
    ax.set_xlabel("speedup (x, committed tokens/s over the fallback's on the same prompts)")
    ax.grid(axis="y", visible=False)
    level = next((o.interval.level for o in report.outcomes if o.interval is not None), 0.95)
    caption = (
        f"Which draft pays: pooled speedup per draft and law; bars are the speedup rule's {level:.0%} interval "
        f"({with_ci} of {len(rows)}), hollow diamonds point values without one; right of 1.0x the draft pays."
    )
    return Plot("", "", len(rows), _svg(fig, SPEEDUP.name), caption)


def _breakdown_plot(report: Report, colors: dict[str, Any], by: str, figure: str, name: str) -> tuple[Any, int] | None:
    """Horizontal points per slice (category) with the drafts side by side, one panel per law."""
    rows = _drafts(report)
    laws = _laws(rows)
    slices = list(dict.fromkeys(s for r in rows for s in (r.by_category if by == "category" else r.by_context_length)))
    if not slices or all(
        getattr(b, figure) is None
        for r in rows
        for b in (r.by_category if by == "category" else r.by_context_length).values()
    ):
        return None
    intervals = _speedup_intervals(report) if figure == SPEEDUP.name else {}
    fig, axes = _figure(len(laws), height_in=0.9 + 0.28 * len(slices))
    drafts = list(dict.fromkeys(r.runner for r in rows))
    n, seen = 0, []
    for ax, law in zip(axes, laws, strict=False):
        for j, d in enumerate(drafts):
            r = next((x for x in rows if x.runner == d and x.law == law), None)
            if r is None:
                continue
            parts = r.by_category if by == "category" else r.by_context_length
            off = (j - (len(drafts) - 1) / 2) * 0.8 / max(len(drafts), 1)
            first = True
            for i, s in enumerate(slices):
                b = parts.get(s)
                value = None if b is None else getattr(b, figure)
                if value is None:
                    continue
                iv = intervals.get((d, law, s)) if by == "category" else None
                iv = iv if iv is not None and iv[1] is not None else None
                _errorbar(
                    ax,
                    -i + off,
                    value,
                    iv[1] if iv else None,
                    iv[2] if iv else None,
                    colors.get(d),
                    d if first else None,
                )
                seen += [x for x in (value, *(iv[1:] if iv else ())) if x is not None]
                first = False
                n += 1
        ax.set_title(law, fontsize=9)
        ax.grid(axis="y", visible=False)
        ax.set_ylim(-len(slices) + 0.4, 0.6)
    if figure == SPEEDUP.name:
        for ax in axes:
            ax.axvline(1.0, color="black", lw=0.8, ls="--")
            _around_one(ax, seen)
    axes[0].set_yticks(
        [-i for i in range(len(slices))], slices if by == "category" else [f"{s} tokens" for s in slices]
    )
    _legend(axes[-1], outside=True)
    return fig, n


_OVERLAP_AXIS = "mean overlap (sum min(p, q), 0-1)"
_NO_SWEEP = "the workload has no context-length sweep (workload.context_lengths)"


def _breakdown(
    by: str, field: str, name: str, xlabel: str, missing: str, caption: str, unit_range: bool = False
) -> Callable[[Report, dict[str, Any]], Plot | str]:
    """A plot of one breakdown figure (SummaryRow.by_category / by_context_length) per slice,
    draft and law; `missing`: why it is not plotted when no slice has the figure."""

    def plot(report: Report, colors: dict[str, Any]) -> Plot | str:
        if by == "category" and len({c for r in _drafts(report) for c in r.by_category}) < 2:
            return "the workload has fewer than two categories"
        got = _breakdown_plot(report, colors, by, field, name)
        if got is None:
            return missing
        fig, n = got
        for ax in fig.axes:
            ax.set_xlabel(xlabel)
            if unit_range:
                ax.set_xlim(-0.02, 1.02)
        return Plot("", "", n, _svg(fig, name), caption)

    return plot


_speedup_by_category = _breakdown(
    "category",
    SPEEDUP.name,
    "speedup-by-category",
    "speedup (x)",
    "no category has a measured speedup",
    "Where each draft pays: pooled speedup per workload category and law (point values; bars where a speedup rule is "
    "scoped to the category); right of the dashed 1.0x line the draft pays.",
)
_speedup_by_context = _breakdown(
    "context_length",
    SPEEDUP.name,
    "speedup-by-context",
    "speedup (x)",
    _NO_SWEEP,
    "Pooled speedup per requested context length (prompt tokens) and law: how the draft's gain changes with longer "
    "contexts; right of 1.0x it pays.",
)
_overlap_by_category = _breakdown(
    "category",
    "overlap_mean",
    "overlap-by-category",
    _OVERLAP_AXIS,
    "no overlap was measured per category",
    "Why a draft pays where it does: mean per-position overlap sum_x min(p(x), q(x)) of each draft with the target "
    "along the target's own continuations, per category and law.",
    unit_range=True,
)
_overlap_by_context = _breakdown(
    "context_length",
    "overlap_mean",
    "overlap-by-context",
    _OVERLAP_AXIS,
    _NO_SWEEP,
    "Mean per-position overlap of each draft with the target per requested context length (prompt tokens) and law.",
    unit_range=True,
)


def _speedup_by_load(report: Report, colors: dict[str, Any]) -> Plot | str:
    pts = [p for p in report.load if p.runner != FALLBACK and p.speedup is not None]
    if not pts:
        return "not a served run (no load points)" if not report.load else "no load point has a draft speedup"
    panels = list(dict.fromkeys((p.law, p.kind) for p in pts))
    fig, axes = _figure(len(panels), height_in=3.0)
    for ax, (law, kind) in zip(axes, panels, strict=False):
        mine = [p for p in pts if (p.law, p.kind) == (law, kind)]
        for d in dict.fromkeys(p.runner for p in mine):
            line = sorted((p for p in mine if p.runner == d), key=lambda p: p.value)
            xs = [p.value for p in line]
            ax.plot(xs, [p.speedup for p in line], "o-", color=colors.get(d), label=d)
            ci = [p for p in line if p.speedup_low is not None and p.speedup_high is not None]
            if ci:
                ax.fill_between(
                    [p.value for p in ci],
                    [p.speedup_low for p in ci],
                    [p.speedup_high for p in ci],
                    color=colors.get(d),
                    alpha=0.2,
                    lw=0,
                )
            for c in report.crossovers:
                if (c.draft, c.law, c.kind) == (d, law, kind) and c.at is not None:
                    ax.axvline(c.at, color=colors.get(d), ls=":", lw=1.2)
                    ax.annotate(
                        f"crossover {d}",
                        (c.at, 1.0),
                        rotation=90,
                        fontsize=7,
                        xytext=(3, 4),
                        textcoords="offset points",
                        color=colors.get(d),
                    )
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        if len({p.value for p in mine}) > 2 and min(p.value for p in mine) > 0:
            ax.set_xscale("log", base=2)
            _plain_log(ax.xaxis)
        ax.set_xlabel("concurrency (requests in flight)" if kind == "concurrency" else "request rate (requests/s)")
        ax.set_title(law, fontsize=9)
    axes[0].set_ylabel("speedup (x)")
    _legend(axes[-1], outside=True)
    return Plot(
        "",
        "",
        len(pts),
        _svg(fig, "speedup-by-load"),
        "Served runs: each draft's speedup (paired requests, shaded: its interval) at every load point; a dotted line "
        "marks the crossover, the lowest load whose whole interval lies below 1.0x.",
    )


def _table_section(
    section_id: str,
    title: str,
    intro: str,
    columns: Sequence[str],
    rows: list[list[str]],
    list_class: str | None = None,
    lines: list[str] | None = None,
) -> dict[str, Any]:
    """A report section for the template's table_section: heading, one paragraph, a table of
    `rows` under `columns`, and a list of `lines` (class `list_class`) when there are any."""
    return {
        "id": section_id,
        "title": title,
        "intro": intro,
        "columns": list(columns),
        "rows": rows,
        "list_class": list_class,
        "lines": lines or [],
    }


def _interactivity(report: Report, colors: dict[str, Any]) -> Plot | str:
    pts = report.interactivity
    if not pts:
        return "not a served run (no load points)" if not report.load else "no load point or probe has a TPOT"
    laws = list(dict.fromkeys(p.law for p in pts))
    fig, axes = _figure(len(laws), height_in=3.0)
    for ax, law in zip(axes, laws, strict=False):
        mine = [p for p in pts if p.law == law]
        for r in dict.fromkeys(p.runner for p in mine):
            theirs = [p for p in mine if p.runner == r]
            ax.plot(
                [p.per_user_tokens_s for p in theirs],
                [p.output_throughput for p in theirs],
                "o",
                color=colors.get(r),
                alpha=0.35,
                ms=4,
            )
            front = sorted((p for p in theirs if p.pareto), key=lambda p: p.per_user_tokens_s)
            ax.plot(
                [p.per_user_tokens_s for p in front],
                [p.output_throughput for p in front],
                "o-",
                color=colors.get(r),
                label=r,
            )
        for e in report.equal_interactivity:
            if e.law == law:
                ax.axvline(e.per_user_tokens_s, color="black", lw=0.8, ls=":")
        ax.set_xlabel("per-user speed (tokens/s per request: 1000 / TPOT)")
        ax.set_title(law, fontsize=9)
    axes[0].set_ylabel("output throughput (tokens/s)")
    _legend(axes[-1], outside=True)
    return Plot(
        "",
        "",
        len(pts),
        _svg(fig, "interactivity"),
        "Served runs: output throughput against per-user speed at every load point and envelope-search probe; the "
        "line joins each runner's Pareto front (no other point of it is both faster per user and higher in "
        "throughput), the dotted line marks load.per_user_tokens_s, where drafts are compared at equal interactivity.",
    )


def _acceptance_per_position(report: Report, colors: dict[str, Any]) -> Plot | str:
    rows = [r for r in _drafts(report) if r.acceptance_rate_per_pos]
    if not rows:
        return "no per-step counters (a served engine's stream without them, or no speculative request)"
    laws = _laws(rows)
    fig, axes = _figure(len(laws))
    n = 0
    for ax, law in zip(axes, laws, strict=False):
        for r in (x for x in rows if x.law == law):
            xs = list(range(1, len(r.acceptance_rate_per_pos) + 1))
            ax.plot(xs, r.acceptance_rate_per_pos, "o-", color=colors.get(r.runner), label=r.runner)
            n += len(xs)
        ax.set_xlabel("position in the proposed block (1 = first proposal)")
        ax.set_ylim(0, 1.02)
        ax.set_title(law, fontsize=9)
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0].set_ylabel("acceptance rate (share of steps)")
    _legend(axes[-1], outside=True)
    return Plot(
        "",
        "",
        n,
        _svg(fig, "acceptance-per-position"),
        "Share of verification steps whose proposal at each position was committed (vLLM's "
        "num_accepted_tokens_per_pos / num_drafts), per draft and law: how fast acceptance decays along the block.",
    )


def _accepted_length(report: Report, colors: dict[str, Any]) -> Plot | str:
    rows = [r for r in _drafts(report) if sum(r.accepted_length_histogram)]
    if not rows:
        return "no per-step counters (a served engine's stream without them, or no speculative request)"
    laws = _laws(rows)
    fig, axes = _figure(len(laws))
    n = 0
    for ax, law in zip(axes, laws, strict=False):
        mine = [x for x in rows if x.law == law]
        width = 0.8 / max(len(mine), 1)
        for j, r in enumerate(mine):
            total = sum(r.accepted_length_histogram)
            xs = [k + (j - (len(mine) - 1) / 2) * width for k in range(len(r.accepted_length_histogram))]
            ax.bar(
                xs,
                [100 * c / total for c in r.accepted_length_histogram],
                width=width,
                color=colors.get(r.runner),
                label=r.runner,
            )
            n += len(xs)
        ax.set_xlabel("proposals committed per step (k)")
        ax.set_title(law, fontsize=9)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(axis="x", visible=False)
    axes[0].set_ylabel("steps (%)")
    _legend(axes[-1], outside=True)
    return Plot(
        "",
        "",
        n,
        _svg(fig, "accepted-length"),
        "Accepted-length histogram: the share of verification steps that committed k of their proposals, per draft "
        "and law (k = num_draft_tokens: the whole block was accepted).",
    )


def _quantile_curve(values: list[float]) -> tuple[list[float], list[float]]:
    """An empirical CDF as (x, F) through at most _CDF_QUANTILES + 1 points."""
    xs = sorted(values)
    n = len(xs)
    if n <= _CDF_QUANTILES:
        return xs, [(i + 1) / n for i in range(n)]
    idx = sorted({min(n - 1, round(q * (n - 1) / _CDF_QUANTILES)) for q in range(_CDF_QUANTILES + 1)})
    return [xs[i] for i in idx], [(i + 1) / n for i in idx]


def _cdf(
    report: Report, colors: dict[str, Any], values: Callable[[Any], list[float]], name: str, xlabel: str
) -> tuple[Any, int] | None:
    by: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in report.measurements.requests:
        if r.token_times_ms:
            by[(r.law, r.draft)].extend(x for x in values(r) if x is not None and math.isfinite(x))
    by = {k: v for k, v in by.items() if v}
    if not by or all(d == FALLBACK for _, d in by):
        return None
    laws = list(dict.fromkeys(law for law, _ in by))
    fig, axes = _figure(len(laws))
    n = 0
    for ax, law in zip(axes, laws, strict=False):
        runners = [d for (lw, d) in by if lw == law]
        runners.sort(key=lambda d: d != FALLBACK)
        for d in runners:
            xs, fs = _quantile_curve(by[(law, d)])
            ax.step(
                xs,
                fs,
                where="post",
                color=colors.get(d),
                lw=2.0 if d == FALLBACK else 1.2,
                ls="--" if d == FALLBACK else "-",
                label=d,
            )
            n += len(by[(law, d)])
        # log above 1 ms (contended outliers would squash the body of the curve), linear
        # below so that ITL 0 (tokens of one step) stays on the axis
        if min(x for (lw, _), v in by.items() if lw == law for x in v) > 0:
            ax.set_xscale("log")
        else:
            ax.set_xscale("symlog", linthresh=1.0)
            ax.set_xlim(left=0)
        _plain_log(ax.xaxis)
        ax.set_xlabel(xlabel)
        ax.set_ylim(0, 1.01)
        ax.set_title(law, fontsize=9)
    axes[0].set_ylabel("share of samples (CDF)")
    _legend(axes[-1], loc="lower right")
    return fig, n


def _cdf_plot(
    values: Callable[[Any], list[float]], key: str, xlabel: str, empty: str, caption: str
) -> Callable[[Report, dict[str, Any]], Plot | str]:
    """A per-law CDF plot of `values` (one request record -> its samples): the plot, or
    `empty` when no timed speculative request gives a sample."""

    def plot(report: Report, colors: dict[str, Any]) -> Plot | str:
        got = _cdf(report, colors, values, key, xlabel)
        if got is None:
            return empty
        fig, n = got
        return Plot("", "", n, _svg(fig, key), caption)

    return plot


_ttft_cdf = _cdf_plot(
    lambda r: [r.ttft_ms],
    "ttft-cdf",
    "time to first token (ms, log scale)",
    "no timed speculative request with token times",
    "Distribution of time to first token per request, each draft (solid) against the fallback (dashed), per law: "
    "a curve to the right is slower.",
)
_itl_cdf = _cdf_plot(
    lambda r: r.itl_ms,
    "itl-cdf",
    "inter-token latency (ms, log scale above 1)",
    "no timed speculative request with two or more tokens",
    "Distribution of token-by-token inter-token latency, each draft (solid) against the fallback (dashed), per "
    "law; tokens committed by one verification step share a time (ITL 0), so a draft's curve starts with a jump.",
)


def _memory_bill(report: Report, colors: dict[str, Any]) -> Plot | str:
    bills = [b for b in report.measurements.bills if any(line.coexists_at_peak for line in b.lines)]
    if not bills:
        return "no resource bill was made"
    capacity = next((b.budget.capacity_bytes for b in bills if b.budget is not None), None)
    budgets = sorted(
        {
            o.threshold
            for o in report.outcomes
            if o.metric == MEMORY_BILL_BYTES.name and o.comparison in ("<=", "<") and o.relative_to is None
        }
    )
    top = max([b.total_bytes for b in bills] + ([capacity] if capacity else []) + budgets)
    unit, scale = ("GiB", 2**30) if top >= 2**30 else ("MiB", 2**20)
    names = list(dict.fromkeys(line.name for b in bills for line in b.lines if line.coexists_at_peak))
    from matplotlib import colormaps

    tab = colormaps["tab20"]
    line_color = {name: tab(i % 20) for i, name in enumerate(names)}
    fig, (ax,) = _figure(height_in=1.2 + 0.4 * len(bills))
    n = 0
    for i, b in enumerate(bills):
        left = 0.0
        for line in b.lines:
            if not line.coexists_at_peak or line.bytes <= 0:
                continue
            ax.barh(
                [-i],
                [line.bytes / scale],
                left=left,
                color=line_color[line.name],
                label=line.name
                if i == next(j for j, x in enumerate(bills) if any(y.name == line.name for y in x.lines))
                else None,
            )
            left += line.bytes / scale
            n += 1
        text = format_value(b.total_bytes, Dimension.BYTES)
        if b.budget is not None:
            text += f"; headroom {format_value(b.budget.headroom_bytes, Dimension.BYTES)}" + (
                " (does not fit)" if b.budget.headroom_bytes < 0 else f", {b.budget.extra_sequences} more sequences"
            )
        ax.annotate(text, (left, -i), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
    if capacity:
        ax.axvline(capacity / scale, color="black", lw=1.2, label=f"capacity {format_value(capacity, Dimension.BYTES)}")
    for t in budgets:
        ax.axvline(
            t / scale, color="firebrick", lw=1, ls="--", label=f"rule threshold {format_value(int(t), Dimension.BYTES)}"
        )
    ax.set_xlim(0, top / scale * 1.35)
    ax.set_yticks(
        [-i for i in range(len(bills))], [f"{b.draft}\n({b.sequences} seq x {b.context_tokens} tok)" for b in bills]
    )
    ax.set_xlabel(f"resident bytes at the peak of a step ({unit})")
    ax.grid(axis="y", visible=False)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.1 / len(bills)), ncol=3)
    against = (
        "the declared capacity (resources.capacity) and the headroom left"
        if capacity
        else "the memory rules' thresholds"
        if budgets
        else "no capacity (resources.capacity is not declared)"
    )
    return Plot(
        "",
        "",
        n,
        _svg(fig, "memory-bill"),
        f"The resident memory bill per runner, its lines stacked (weights, KV caches, verification, logits, ...), "
        f"against {against}.",
    )


def _exactness(report: Report, colors: dict[str, Any]) -> Plot | str:
    tests = []
    for o in report.outcomes:
        if not o.tests_law:
            continue
        for d in o.details:
            p = d.get("adjusted_pvalue") if d.get("adjusted_pvalue") is not None else d.get("pvalue")
            if isinstance(d, dict) and "pvalue" in d and (value := _clean(p)) is not None:
                tests.append((o, d, max(value, 1e-300)))
    if not tests:
        return "no sampling exactness test in the report (greedy exactness is token equality: see the rules table)"
    significance = {
        r.get("id"): r.get("significance", DEFAULT_SIGNIFICANCE)
        for r in report.policy.get("rules", [])
        if isinstance(r, dict)
    }
    fig, axes = _figure(2, height_in=0.9 + 0.3 * len(tests), sharey=True)
    labels = []
    for i, (o, d, p) in enumerate(tests):
        color = colors.get(o.draft)
        marker = "o" if d.get("role") == "claim" else "s"
        axes[0].plot([p], [-i], marker, color=color)
        det = _clean(d.get("detectable"))
        if det is not None:
            axes[1].plot([det], [-i], marker, color=color)
        else:
            axes[1].annotate("no power", (0, -i), fontsize=7, va="center")
        target = _clean(d.get("target_effect"))
        if target is not None:
            axes[1].plot([target], [-i], "|", color="black", ms=10)
        labels.append(f"{o.draft} · {o.law}: {d.get('name', d.get('kind', 'test'))} (n={d.get('n')})")
    for alpha in sorted({significance.get(o.rule_id, DEFAULT_SIGNIFICANCE) for o, _, _ in tests}):
        axes[0].axvline(alpha, color="firebrick", ls="--", lw=1, label=f"significance {alpha:g}")
    axes[0].set_xscale("log")
    _plain_log(axes[0].xaxis)
    axes[0].set_xlabel("p-value (Holm-adjusted, log)")
    powers = sorted({power for _, d, _ in tests if (power := d.get("power")) is not None})
    axes[1].set_xlabel("detectable effect at power " + "/".join(f"{p:g}" for p in powers))
    axes[1].set_xlim(left=0)
    axes[0].set_yticks([-i for i in range(len(tests))], labels)
    for ax in axes:
        ax.grid(axis="y", visible=False)
    _legend(axes[0], loc="best")
    return Plot(
        "",
        "",
        len(tests),
        _svg(fig, "exactness"),
        "Sampling exactness: each test's Holm-adjusted p-value (left of the dashed line: the sampler differs from the "
        "target's law) and the smallest effect it detects at the stated power (circles: claim tests, squares: evidence "
        "only; the black tick: the effect the policy requires).",
    )


register(HtmlReport, "one self-contained HTML page: the verdict, the rules that did not pass, inline SVG plots")
