"""The HTML report (gate/report/html.py): one self-contained page, verdict first, every plot
with data, escaped text; `gate report` renders saved reports; `gate check --html`."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from gate.cli import cli
from gate.records import Budget, DraftInfo, Measurements
from gate.report import registry as formats
from gate.report.document import make_report
from gate.report.html import HtmlReport
from gate.rules.evaluate import Settings, evaluate, exit_code
from gate.analysis.load_points import load_summary
from gate.rules.outcome import Outcome
from gate.rules.status import Status
from gate.analysis.summary import summarize

from unit.test_rules import measurements, rule
from unit.test_served_rules import run as served_run

DATA = Path(__file__).resolve().parents[1] / "data"
EXAMPLE = DATA / "smollm2-example-report.json.gz"
EVIL = '<script>alert("x")</script>&$x^2$'


class Page(HTMLParser):
    """The page's elements in order: (tag, attributes) and the text of headings."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.headings: list[str] = []
        self._in: str | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("h1", "h2", "h3"):
            self._in, self._text = tag, ""

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self.headings.append(self._text.strip())
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in:
            self._text += data

    def plots(self) -> dict[str, int]:
        return {a["data-plot"]: int(a["data-points"]) for t, a in self.tags if "data-plot" in a}


def in_process_report(draft: str = "good") -> tuple:
    """Two drafts on five prompts of two categories under greedy, a budgeted bill, a speedup
    rule with intervals, a memory rule and a sampling exactness outcome with two tests."""
    m = measurements(6)
    if draft != "good":
        for r in m.requests + m.overlaps:
            r.draft = draft if r.draft == "good" else r.draft
        m.drafts = {draft: DraftInfo("model"), "bad": DraftInfo("model")}
        m.bills[0].draft = draft
    m.bills[0].budget = Budget(8 * 2**30, 8 * 2**30 - m.bills[0].total_bytes, 2**20, 10, 1000, 100)
    rules = [rule(id="speedup", metric="speedup", aggregation="pooled", comparison=">=", threshold="1.0x"),
             rule(id="mem", metric="memory_bill_bytes", aggregation="max", comparison="<=", threshold="2 GiB"), rule()]
    outcomes = evaluate(rules, m, Settings())
    tests = [dict(name="pit", kind="ks", df=0, statistic=0.05, pvalue=0.4, n=120, target_effect=0.1, power=0.9,
                  detectable=0.15, samples_needed=300, adjusted_pvalue=0.8, verdict="pass", role="evidence"),
             dict(name="next-token p1", kind="g", df=12, statistic=20.0, pvalue=0.002, n=400, target_effect=0.1, power=0.9,
                  detectable=None, samples_needed=500, adjusted_pvalue=0.004, verdict="fail", role="claim")]
    outcomes.append(Outcome("exact-sampling", f"{draft}/greedy", draft, "greedy", "exactness", "test", "==", 0.0, None, "error",
                            Status.FAIL, 0.004, 520, None, "exactness (sampling): fail", details=tests))
    policy = {"rules": [{"id": "exact-sampling", "kind": "exactness", "significance": 0.01}]}
    return make_report("p.yaml", policy, m, outcomes, summarize(m), exit_code(outcomes, m)), m


@pytest.fixture(scope="module")
def rendered() -> tuple[str, Page]:
    report, _ = in_process_report()
    text = HtmlReport().render(report)
    return text, Page(text)


def test_registered_as_html():
    assert "html" in formats.names()
    assert formats.get("html") is HtmlReport
    assert "HTML" in formats.descriptions()["html"]


def test_opens_with_the_verdict_and_the_rules_that_did_not_pass(rendered):
    text, page = rendered
    assert page.headings[0] == "gate: failed"
    assert page.headings[1] == "Rules that did not pass"
    rules = text[text.index('id="rules"'):text.index('id="summary"')]
    assert "speedup[bad/greedy]" in rules and "exact-sampling[good/greedy]" in rules
    assert "speedup[good/greedy]" not in rules  # it passed: counted, not listed
    assert text.index("Rules that did not pass") < text.index('data-plot=')


def test_every_plot_has_data_a_caption_and_an_svg(rendered):
    text, page = rendered
    plots = page.plots()
    assert set(plots) >= {"speedup", "speedup-by-category", "acceptance-per-position", "accepted-length", "overlap-by-category",
                          "ttft-cdf", "itl-cdf", "memory-bill", "exactness"}
    assert all(n > 0 for n in plots.values()), plots
    for m in re.finditer(r'<figure class="plot"[^>]*>(.*?)</figure>', text, re.S):
        body = m.group(1)
        assert body.count("<svg") == 1 and "<figcaption>" in body and len(re.search(r"<figcaption>(.*)</figcaption>", body).group(1)) > 40
    assert plots["speedup"] == 2 and plots["acceptance-per-position"] == 8  # 2 drafts; 2 drafts x 4 positions
    assert plots["ttft-cdf"] == 18 and plots["exactness"] == 2  # 3 runners x 6 requests; two tests


def test_plots_without_data_are_named_with_the_reason(rendered):
    text, page = rendered
    skipped = {a["data-skipped"] for t, a in page.tags if "data-skipped" in a}
    assert skipped == {"speedup-by-context", "overlap-by-context", "speedup-by-load", "throughput-vs-interactivity", "roofline",
                       "predicted-vs-measured"}
    assert "not a served run" in text and "no context-length sweep" in text


def test_axes_say_their_units(rendered):
    text, _ = rendered
    for label in ("speedup (x", "time to first token (ms, log scale)", "inter-token latency (ms, log scale above 1)", "acceptance rate (share of steps)",
                  "steps (%)", "resident bytes at the peak of a step (GiB)", "mean overlap (sum min(p, q), 0-1)",
                  "p-value (Holm-adjusted, log)"):
        assert label in text, label


def test_self_contained_no_script_no_network(rendered):
    text, page = rendered
    assert "<script" not in text.lower()
    for tag, attrs in page.tags:
        for key in ("src", "href", "xlink:href"):
            value = attrs.get(key) or ""
            assert not re.match(r"(https?:)?//", value), (tag, key, value)
    assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", text)
    ids = [a["id"] for _, a in page.tags if "id" in a]
    assert len(ids) == len(set(ids)), "duplicate element ids across inline SVGs"


def test_text_from_the_report_is_escaped():
    report, _ = in_process_report(EVIL)
    report.notes.append("note with <b>markup</b>")
    report.policy_file = "<i>p.yaml</i>"
    text = HtmlReport().render(report)
    assert "<script>" not in text and "<b>markup" not in text and "<i>p.yaml" not in text
    # markupsafe writes a double quote as &#34; (html.escape wrote &quot;): the same character, escaped
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;$x^2$" in text
    assert Page(text).plots()["speedup"] == 2  # a '$' in a name is text, not TeX: the plots still render


def test_served_run_plots_speedup_per_concurrency_with_the_crossover():
    m = served_run({1: 1.5, 2: 1.2, 4: 0.7})
    rows, crossings = load_summary(m, 0.95, 300, 0)
    outcomes = evaluate([rule(id="s", metric="speedup", aggregation="pooled", comparison=">=", threshold="1.0x")], m, Settings())
    report = make_report("p.yaml", {"measurement": {"confidence": 0.95}}, m, outcomes, summarize(m), 1, rows, crossings)
    assert crossings and crossings[0].at == 4
    text = HtmlReport().render(report)
    plots = Page(text).plots()
    assert plots["speedup-by-load"] == 3  # one draft at three concurrencies
    assert "concurrency (requests in flight)" in text and "crossover d" in text
    assert "crossover at concurrency 4" in text
    assert "acceptance-per-position" not in plots  # served stream: no per-step counters, skipped


def test_empty_report_still_renders_a_page():
    from unit.test_rules import env

    m = Measurements(environment=env(), laws=["greedy"])
    report = make_report("p.yaml", {}, m, [], [], 3)
    text = HtmlReport().render(report)
    page = Page(text)
    assert page.headings[0] == "gate: not decided (a verdict inconclusive or a measurement missing)" and page.plots() == {}
    assert "No rule outcome" in text


def test_roofline_rows_add_the_roofline_and_predicted_plots(rendered):
    from gate.measure.roofline import step
    from gate.commands.bill import RooflineRow

    report, _ = in_process_report()
    bw, pk = 100e9, 1e12
    rows = [RooflineRow("fallback", [step("decode", 10**8, 2 * 10**8, 1000, 100, b, 1, pk, bw) for b in (1, 8)], 50.0, None, {}),
            RooflineRow("good", [step("verify", 10**8, 2 * 10**8, 1000, 100, b, 5, pk, bw) for b in (1, 8)], 10.0, 0.1,
                        {"greedy": {"alpha": 0.9, "predicted_speedup": 2.5, "measured_speedup": 2.0}})]
    plots = Page(HtmlReport(roofline=rows, bandwidth=bw, peak_flops=pk).render(report)).plots()
    assert plots["roofline"] == 4 and plots["predicted-vs-measured"] == 1


def test_gate_check_takes_html():
    result = CliRunner().invoke(cli, ["check", "--help"])
    assert "--html FILE" in result.output and "--html-url" in result.output


