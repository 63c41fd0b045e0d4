"""The tests of tests/unit/test_html_report.py's subject that need the real models, llama-server, vLLM or the browser; the subject and
what it must do are described there."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from gate.cli import cli
from gate.report.document import ADAPTER
from gate.report.html import HtmlReport
from unit.test_html_report import Page  # noqa: F401 - shared with that tier
from unit.test_html_report import EXAMPLE


@pytest.fixture(scope="module")
def example_report():
    """The embedded example's report (examples/smollm2/policy.yaml, gate check), kept gzipped."""
    return ADAPTER.validate_python(json.loads(gzip.decompress(EXAMPLE.read_bytes())))


def test_example_report_plots_every_figure_it_has(example_report):
    text = HtmlReport().render(example_report)
    page = Page(text)
    plots = page.plots()
    assert set(plots) >= {"speedup", "acceptance-per-position", "accepted-length", "overlap-by-category", "speedup-by-category",
                          "ttft-cdf", "itl-cdf", "memory-bill", "exactness"}, plots
    assert all(n > 0 for n in plots.values())
    drafts = [r for r in example_report.summary if r.runner != "fallback"]
    assert plots["speedup"] == len(drafts)
    requests = example_report.measurements.requests
    assert plots["ttft-cdf"] == len([r for r in requests if r.token_times_ms])
    assert plots["itl-cdf"] == sum(len(r.itl_ms) for r in requests)
    assert len(text.encode()) < 600_000  # CDFs are drawn through quantiles: the page stays small


def test_gate_report_renders_a_saved_report(tmp_path, example_report):
    md = tmp_path / "summary.md"
    result = CliRunner().invoke(cli, ["report", str(EXAMPLE), "--html", str(tmp_path / "r.html"), "--markdown", str(md),
                                      "--junit", str(tmp_path / "j.xml"), "--html-url", "https://ci.example/artifacts/r.html"])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and Page(html).plots()
    summary = md.read_text(encoding="utf-8")
    assert summary.startswith("## gate:") and summary.rstrip().endswith(
        "Plots: [r.html](https://ci.example/artifacts/r.html) (self-contained HTML report).")
    assert (tmp_path / "j.xml").read_text().startswith("<?xml")


def test_gate_report_plain_json_and_bad_input(tmp_path, example_report):
    plain = tmp_path / "r.json"
    plain.write_bytes(gzip.decompress(EXAMPLE.read_bytes()))
    out = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["report", str(plain), "--report", f"html={out}"])
    assert result.exit_code == 0 and out.exists(), result.output
    result = CliRunner().invoke(cli, ["report", str(plain)])
    assert result.exit_code == 2 and "nothing to write" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "other"}')
    result = CliRunner().invoke(cli, ["report", str(bad), "--html", str(out)])
    assert result.exit_code == 2 and "not a gate JSON report" in result.output
    result = CliRunner().invoke(cli, ["report", str(plain), "--html", str(out), "--bandwidth", "1GB/s"])
    assert result.exit_code == 2 and "needs all three" in result.output


