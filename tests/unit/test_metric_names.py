"""Metric and rule-kind names live in their declarations: a metric's in gate.metrics.catalogue
(and how its samples are taken, gate.rules.samples), a rule kind's in its own module under
gate/rules/kinds/. Behaviour elsewhere reads the catalogue's flags (Metric.better,
ratio_to_fallback, measured_by, needs, ...) or refers to the declared Metric (SPEEDUP.name), never
a name written as a string: a name written elsewhere is how `request_speedup` once missed what
`speedup` saw."""

from __future__ import annotations

import ast
from pathlib import Path

from gate.metrics.catalogue import METRICS
from gate.report.junit import _seconds
from gate.rules.evaluate import Settings, evaluate
from gate.rules.kinds import registry as rule_kinds
from unit.test_served_rules import rule, run

ROOT = Path(__file__).resolve().parents[2]
METRIC_DECLARATIONS = {"gate/metrics/catalogue.py", "gate/rules/samples.py"}
# "metric" and "exactness" are also words of the policy ("metric:") and the run's stages: only
# the unambiguous rule-kind names are counted
KIND_NAMES = set(rule_kinds.names()) - {"metric", "exactness"}
NAMES = set(METRICS) | KIND_NAMES
# (file, name) -> why the string there is not the metric's name but a word that is spelled alike
ALIKE = {
    ("gate/records/run.py", "overlap"): "FailureStage.OVERLAP, the stage of the overlap pass as reports serialise it",
}


def kind_module(name: str) -> str:
    """The file that declares rule kind `name`."""
    module = type(rule_kinds.get(name)).__module__
    return module.replace(".", "/") + ".py"


def names_written(path: Path) -> list[str]:
    """The string constants in `path` that are a metric or an unambiguous rule-kind name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in NAMES]


def test_metric_and_rule_kind_names_are_written_only_where_they_are_declared():
    found = []
    for path in sorted((ROOT / "gate").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name in names_written(path):
            declared = rel in METRIC_DECLARATIONS if name in METRICS else rel == kind_module(name)
            if not declared and (rel, name) not in ALIKE:
                found.append(f"{rel}: {name!r}")
    assert not found, f"metric or rule-kind names written outside their declarations: {found}"


def test_the_check_sees_a_name_written_outside_its_declaration(tmp_path):
    written = tmp_path / "x.py"
    written.write_text('if rule.metric == "speedup" or kind == "envelope":\n    pass\n', encoding="utf-8")
    assert names_written(written) == ["speedup", "envelope"]
    assert kind_module("envelope") == "gate/rules/kinds/envelope.py"


def test_a_request_speedup_case_is_timed_on_the_fallbacks_requests_too():
    """JUnit times a case by the requests its verdict rests on: a rule that divides by the
    fallback (speedup, request_speedup) rests on the fallback's requests as well (this read
    `metric == "speedup"`, so request_speedup's cases left them out)."""
    m = run({1: 1.6})
    (pooled,) = evaluate([rule(metric="speedup", aggregation="pooled")], m, Settings())
    (per_request,) = evaluate([rule(metric="request_speedup", aggregation="mean")], m, Settings())
    report = type("R", (), {"measurements": m})()
    draft_only = sum(r.e2el_ms for r in m.requests if r.draft == "d") / 1e3
    both = sum(r.e2el_ms for r in m.requests) / 1e3
    assert _seconds(report, pooled) == _seconds(report, per_request) == round(both, 6)
    assert both > draft_only
