"""The docs site's reference pages, generated from the code so that they cannot drift.

mkdocs loads this file as a hook (mkdocs.yml: `hooks:`): a page under docs/reference/ holds a
short introduction and a marker line

    <!-- gate-reference: policy -->

which on_page_markdown replaces with PAGES["policy"]() (likewise cli, metrics, rule-kinds,
exit-codes, reports). Each page function returns Markdown and reads only gate's own
declarations:

- policy: the pydantic models' JSON Schema (gate.policy.schema.policy_schema: field types,
  defaults, constraints and descriptions), one table per model;
- cli: the click command tree (gate.cli.cli), rendered by mkdocs-click at build time (plain
  style: each command's usage and options as `--help` prints them; mkdocs-click 0.9's table
  style shows click 8.3's unset defaults as `Sentinel.UNSET`);
- metrics: the metric catalogue (gate.metrics.catalogue.METRICS);
- rule-kinds: the rule-kind registry (gate.rules.kinds.registry: BUILTIN and what registers);
- exit-codes: gate.core.errors.EXIT_CODES, and what each command's help says of them;
- reports: the report-format registry (gate.report.registry) and the JSON report's schema
  (gate.report.document.report_schema).

Run it to print one page: .venv/bin/python scripts/docs_reference.py policy
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
from collections.abc import Callable
from typing import Any

MARKER = re.compile(r"^<!--\s*gate-reference:\s*([\w-]+)\s*-->[ \t]*$", re.MULTILINE)


# --- Markdown text ---------------------------------------------------------------------------


def _escape(text: str, cell: bool = False) -> str:
    """`text` (a docstring or description) as Markdown that shows it as written: HTML-like
    `<draft>` and emphasis characters escaped outside `code spans`; in a table cell, pipes
    escaped and lines joined."""
    parts = re.split(r"(`[^`\n]*`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a code span: shown literally already
            out.append(part.replace("|", "\\|") if cell else part)
            continue
        part = part.replace("\\", "\\\\").replace("<", "&lt;").replace(">", "&gt;")
        part = re.sub(r"([*_\[\]])", r"\\\1", part)
        if cell:
            part = part.replace("|", "\\|")
        out.append(part)
    text = "".join(out)
    return " ".join(text.split()) if cell else text


def _paragraphs(doc: str | None) -> list[str]:
    """A docstring as paragraphs, each one line (wrapped lines joined)."""
    if not doc:
        return []
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)) if p.strip()]


def _code(value: Any) -> str:
    return f"`{value}`"


# --- JSON Schema to tables (the policy and the report) ------------------------------------


class _Schema:
    """Renders a pydantic JSON Schema: one section per model ($defs entry), in the order they
    are first reached from the top, each titled with the YAML path where it is used."""

    def __init__(self, schema: dict[str, Any], root_name: str, enum_links: dict[tuple[str, ...], str] | None = None):
        self.schema = schema
        self.defs: dict[str, Any] = schema.get("$defs", {})
        self.root_name = root_name
        self.enum_links = enum_links or {}
        self.order: list[str] = []  # def names in the order they are reached
        self.where: dict[str, str] = {}  # def name -> the first path that uses it
        self._walked: set[str] = set()
        self._walk(schema, "")

    @staticmethod
    def anchor(name: str) -> str:
        return name.lower()

    def _refs(self, node: Any, path: str) -> list[tuple[str, str]]:
        """(def name, path) for every $ref under `node` (one field's schema), depth first."""
        found: list[tuple[str, str]] = []
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                found.append((ref.rsplit("/", 1)[-1], path))
            for key, value in node.items():
                if key == "items":
                    found += self._refs(value, path + "[]")
                elif key == "patternProperties":
                    for v in value.values():
                        found += self._refs(v, path + ".<name>")
                elif key == "additionalProperties" and isinstance(value, dict):
                    found += self._refs(value, path + ".<name>")
                elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
                    for v in value:
                        found += self._refs(v, path)
        return found

    def _walk(self, model: dict[str, Any], path: str) -> None:
        pending: list[tuple[str, str]] = []
        for field, sub in model.get("properties", {}).items():
            pending += self._refs(sub, f"{path}.{field}" if path else field)
        for name, where in pending:
            if name not in self.where:
                self.where[name] = where
                self.order.append(name)
        for name, where in pending:
            if name in self.defs and name not in self._walked:
                self._walked.add(name)
                self._walk(self.defs[name], where)

    def type_of(self, node: dict[str, Any]) -> str:
        """A field's type in words, with links to the models it names."""
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            return f"[{name}](#{self.anchor(name)})"
        if "const" in node:
            return _code(json.dumps(node["const"]))
        if "enum" in node:
            values = tuple(str(v) for v in node["enum"])
            for known, link in self.enum_links.items():
                if set(values) == set(known):
                    return link
            return " or ".join(_code(json.dumps(v)) for v in node["enum"])
        for key in ("anyOf", "oneOf"):
            if key in node:
                options = [o for o in node[key] if o.get("type") != "null"]
                words = [self.type_of(o) for o in options]
                if "discriminator" in node:
                    prop = node["discriminator"]["propertyName"]
                    return f"one of, by `{prop}`: " + ", ".join(words)
                return " or ".join(dict.fromkeys(words))
        t = node.get("type")
        if t == "array":
            inner = self.type_of(node["items"]) if "items" in node else "any"
            if "prefixItems" in node:
                inner = "(" + ", ".join(self.type_of(i) for i in node["prefixItems"]) + ")"
                return f"list {inner}"
            return f"list of {inner}"
        if t == "object":
            if "patternProperties" in node:
                (value,) = node["patternProperties"].values()
                return f"map of name to {self.type_of(value)}"
            extra = node.get("additionalProperties")
            if isinstance(extra, dict):
                return f"map of string to {self.type_of(extra)}"
            if "title" in node and "properties" in node:
                return str(node["title"])
            return "mapping"
        if isinstance(t, list):
            return " or ".join(t)
        return str(t) if t else "any"

    @staticmethod
    def constraints(node: dict[str, Any]) -> list[str]:
        """A field's bounds, lengths and patterns in words (from the field or its non-null option)."""
        out: list[str] = []
        nodes = [node] + [o for key in ("anyOf", "oneOf") for o in node.get(key, []) if o.get("type") != "null"]
        for n in nodes:
            for key, word in (
                ("minimum", ">="),
                ("exclusiveMinimum", ">"),
                ("maximum", "<="),
                ("exclusiveMaximum", "<"),
            ):
                if key in n:
                    out.append(f"{word} {n[key]:g}" if isinstance(n[key], float) else f"{word} {n[key]}")
            if "minItems" in n:
                out.append(f"at least {n['minItems']} item{'s' if n['minItems'] != 1 else ''}")
            if "maxItems" in n:
                out.append(f"at most {n['maxItems']} items")
            if "minLength" in n:
                out.append(f"at least {n['minLength']} characters")
            if "pattern" in n:
                out.append(f"matches `{n['pattern']}`")
        return list(dict.fromkeys(out))

    def table(self, model: dict[str, Any]) -> list[str]:
        props = model.get("properties", {})
        if not props:
            return []
        required = set(model.get("required", []))
        lines = ["| Field | Type | Default | Description |", "| --- | --- | --- | --- |"]
        for field, sub in props.items():
            if "default" in sub and sub["default"] is not None:
                default = _code(json.dumps(sub["default"]))
            elif field in required:
                default = "**required**"
            else:
                default = ""
            described = sub.get("description") or ""
            bounds = self.constraints(sub)
            text = _escape(described, cell=True)
            if bounds:
                text = (text + " " if text else "") + "(" + _escape("; ".join(bounds), cell=True) + ")"
            lines.append(f"| `{field}` | {self.type_of(sub)} | {default} | {text} |")
        return lines

    def section(self, name: str, model: dict[str, Any], where: str, level: int) -> list[str]:
        title = f"{'#' * level} {name} {{ #{self.anchor(name)} }}"
        lines = [title, ""]
        if where:
            lines += [f"Used at `{where}`.", ""]
        for p in _paragraphs(model.get("description")):
            lines += [_escape(p), ""]
        if model.get("additionalProperties") is False:
            lines += ["Keys not listed here are refused.", ""]
        lines += self.table(model)
        return lines + [""]

    def render(self, level: int = 2) -> list[str]:
        lines = self.section(self.root_name, self.schema, "", level)
        for name in self.order:
            if name in self.defs:
                lines += self.section(name, self.defs[name], self.where[name], level)
        return lines


# --- The pages -------------------------------------------------------------------------------


def policy_page() -> str:
    """Every key of a version-1 policy: the top-level mapping, then each model it uses."""
    from gate.metrics.catalogue import METRICS
    from gate.policy.schema import policy_schema
    from gate.rules.kinds import registry

    schema = _Schema(
        policy_schema(),
        "Policy",
        enum_links={
            tuple(METRICS): "a metric name: see [Metrics](metrics.md)",
            tuple(registry.names()): "a rule kind: see [Rule kinds](rule-kinds.md)",
        },
    )
    lines = [
        "The tables below are generated from gate's pydantic models (`gate.policy.model`) when the site is "
        "built; `gate schema` prints the same models as a JSON Schema (schemas/policy.schema.json), which editors "
        "can use to complete and check a policy.",
        "",
    ]
    return "\n".join(lines + schema.render()).rstrip() + "\n"


def cli_page() -> str:
    """The command summary, then every command's usage and options (mkdocs-click renders the
    directive from gate.cli's click objects when the site is built)."""
    from gate.cli import cli

    lines = ["| Command | What it does |", "| --- | --- |"]
    for name, command in cli.commands.items():
        first = (_paragraphs(command.help) or [""])[0]
        summary = re.split(r"(?<=\.)\s+(?=[A-Z])", first, maxsplit=1)[0]  # its first sentence
        lines.append(f"| [`gate {name}`](#gate-{name}) | {_escape(summary, cell=True)} |")
    lines += [
        "",
        "::: mkdocs-click",
        "    :module: gate.cli",
        "    :command: cli",
        "    :prog_name: gate",
        "    :depth: 1",
        "    :style: plain",
        "",
    ]
    return "\n".join(lines)


# What each flag of a gate.metrics.catalogue.Metric means on the page; a field of Metric that is
# in neither table makes the page fail to build (a new flag must say what it means here).
_METRIC_SHOWN_ELSEWHERE = ("name", "dimension", "aggregations", "sample", "description", "better")
_METRIC_WORDS: dict[str, Callable[[Any], str | None]] = {
    "sampling": lambda v: (
        f"Sampled per {v}"
        + {
            "position": " (one value per position of a target continuation)",
            "request": " (one value per request)",
            "token": " (one value per token or step of a request)",
            "pooled": " (counters or totals pooled across requests)",
            "once": " (computed or measured once per draft: decided on the value itself, no interval)",
        }.get(v, "")
        + "."
    ),
    "fallback_has_it": lambda v: (
        "The fallback produces it too: `relative_to: fallback` applies." if v else "The fallback does not produce it."
    ),
    "timed": lambda v: "Read from clocks: contended requests are left out of its verdicts." if v else None,
    "repeatable": lambda v: "More timed repetitions can settle an inconclusive verdict." if v else None,
    "ratio_not_share": lambda v: "A ratio, not a share: a percentage threshold is refused." if v else None,
    "share": lambda v: "A share, in [0, 1] by its definition." if v else None,
    "failure_stage": lambda v: f"A failure at stage `{getattr(v, 'value', v)}` leaves it unmeasured.",
    "ratio_to_fallback": lambda v: (
        "A draft's ratio to the fallback by its definition (paired requests)." if v else None
    ),
    "measured_by": lambda v: {
        "any": "Measured by every runner.",
        "in_process": "Measured only by gate's in-process loop (`runner.kind: transformers`).",
        "load_points": "Measured only by a served runner at load points.",
    }.get(v, f"Measured by {v}."),
    "needs": lambda v: f"Needs `{v}` in the policy." if v else None,
    "takes_line": lambda v: "A rule on it names one line of the bill (`rules[].line`)." if v else None,
    "takes_position": lambda v: (
        "A rule on it names one proposal position (`rules[].position`, 1-based)." if v else None
    ),
    "between_tokens": lambda v: (
        "A time between a stream's tokens: a client that stamps late can make it look shorter." if v else None
    ),
    "of_proposals": lambda v: (
        "Its denominator is the draft's proposals: undefined where the draft made none." if v else None
    ),
    "counts": lambda v: f"A count of {v}." if v else None,
    "on_accelerator": lambda v: (
        'Measured only on an accelerator: without one a rule on it is skipped ("not measured: no accelerator").'
        if v
        else None
    ),
    "includes_server_headers": lambda v: (
        "Served, it includes the server's time to its response headers (`server_headers_ms`), which each verdict "
        "states beside it."
        if v
        else None
    ),
}


def metric_fields_not_described() -> list[str]:
    """The gate.metrics.catalogue.Metric fields that the metrics page does not render."""
    from gate.metrics.catalogue import Metric

    shown = set(_METRIC_SHOWN_ELSEWHERE) | set(_METRIC_WORDS)
    return [f.name for f in dataclasses.fields(Metric) if f.name not in shown]


def metrics_page() -> str:
    """Every metric a rule can bind to (rules[].metric), from gate.metrics.catalogue.METRICS."""
    from gate.metrics.catalogue import METRICS

    missing = metric_fields_not_described()
    if missing:
        raise RuntimeError(f"scripts/docs_reference.py does not say what Metric fields {missing} mean (_METRIC_WORDS)")
    lines = [
        f"{len(METRICS)} metrics, in the catalogue's order (`gate.metrics.catalogue.METRICS`).",
        "",
        "| Metric | Unit | Better | What it is |",
        "| --- | --- | --- | --- |",
    ]
    for m in METRICS.values():
        lines.append(
            f"| [`{m.name}`](#{m.name}) | {m.dimension.value} | {m.better} | {_escape(m.description, cell=True)} |"
        )
    lines.append("")
    for m in METRICS.values():
        lines += [f"## `{m.name}` {{ #{m.name} }}", "", _escape(m.description), ""]
        lines.append(f"- Unit: {m.dimension.value}; {m.better} is better.")
        lines.append(f"- One sample: {_escape(m.sample)}.")
        lines.append("- Aggregations (`rules[].aggregation`): " + ", ".join(_code(a) for a in m.aggregations) + ".")
        for field, words in _METRIC_WORDS.items():
            text = words(getattr(m, field))
            if text:
                lines.append(f"- {text}")
        lines.append("")
    return "\n".join(lines)


def rule_kinds_page() -> str:
    """Every registered rule kind (rules[].kind): what it decides and the keys it reads."""
    from gate.rules.kinds import registry

    lines = [
        "A rule's `kind:` picks how it is decided; `metric` is the default. The kinds below are the ones "
        "registered in `gate.rules.kinds.registry` (its `BUILTIN` list, in order).",
        "",
        "| Kind | Decides a metric | Needs exactness samples |",
        "| --- | --- | --- |",
    ]
    names = registry.names()
    for name in names:
        kind = registry.get(name)
        metric = "yes" if kind.reads_metric else "no"
        exact = "yes" if kind.needs_exactness else "no"
        lines.append(f"| [`{name}`](#{name}) | {metric} | {exact} |")
    lines.append("")
    for i, name in enumerate(names):
        kind = registry.get(name)
        module = sys.modules[type(kind).__module__]
        lines += [f"## `{name}` {{ #{name} }}", ""]
        if i == 0:
            lines += ["The default kind: a rule without `kind:` is one of these.", ""]
        for p in _paragraphs(module.__doc__) + _paragraphs(type(kind).__doc__):
            lines += [_escape(p), ""]
        keys = ", ".join(f"[`{k}`](policy.md#rulespec)" for k in kind.keys)
        lines += [f"Keys it reads (`rules[]`): {keys}.", "", f"Declared in `{type(kind).__module__}`.", ""]
    return "\n".join(lines)


def _exit_sentences(help_text: str) -> str | None:
    """The part of a command's help that says what its exit codes mean: from the sentence that
    first mentions exit to the end of that paragraph."""
    for paragraph in _paragraphs(help_text):
        match = re.search(r"\b[Ee]xit\b", paragraph)
        if match:
            start = max(paragraph.rfind(". ", 0, match.start()) + 2, 0) if ". " in paragraph[: match.start()] else 0
            return paragraph[start:]
    return None


def exit_codes_page() -> str:
    """gate.core.errors.EXIT_CODES, then what each command's help says of its codes."""
    from gate.cli import cli
    from gate.core.errors import EXIT_CODES

    lines = ["| Code | Meaning |", "| --- | --- |"]
    for code, meaning in EXIT_CODES.items():
        lines.append(f"| `{code}` | {_escape(meaning, cell=True)} |")
    lines += [
        "",
        "Click's own usage errors (an unknown option, a missing argument) exit 2 too; an unexpected error "
        "exits 3 without a traceback (set `GATE_DEBUG=1` to see it).",
        "",
        "## By command",
        "",
        "What each command's help (`gate COMMAND --help`) says of its exit codes:",
        "",
        "| Command | Exit codes |",
        "| --- | --- |",
    ]
    for name, command in cli.commands.items():
        said = _exit_sentences(command.help or "")
        text = _escape(said, cell=True) if said else "its help names no codes of its own: see the table above"
        lines.append(f"| [`gate {name}`](cli.md#gate-{name}) | {text} |")
    return "\n".join(lines) + "\n"


def reports_page() -> str:
    """The registered report formats, then the JSON report document's schema."""
    from gate.report import registry
    from gate.report.document import report_schema

    lines = [
        "## Formats",
        "",
        "Every format registered in `gate.report.registry`. `gate check` and `gate merge` write JSON and JUnit "
        "always (`--json`, `--junit`), Markdown and HTML when asked (`--markdown`, `--html`), print the console "
        "tables, and write any format with `--report FORMAT=PATH`; `gate report` renders a saved JSON report "
        "again in any of them.",
        "",
        "| Format | What it is | Appends to an existing file | Module |",
        "| --- | --- | --- | --- |",
    ]
    formats = registry.formats()
    for name, description in registry.descriptions().items():
        cls = formats[name]
        appends = "yes" if cls.appends else "no"
        lines.append(f"| `{name}` | {_escape(description, cell=True)} | {appends} | `{cls.__module__}` |")
    lines += [
        "",
        "## The JSON report",
        "",
        "The JSON report holds every raw measurement and every outcome; `gate report`, `gate explain`, "
        "`gate compare` and `gate merge` read it (also gzip-compressed), and `gate schema --report` prints its "
        "JSON Schema (schemas/report.schema.json). The tables below are generated from that schema.",
        "",
    ]
    schema = _Schema(report_schema(), "Report")
    lines += schema.render(level=3)
    return "\n".join(lines).rstrip() + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "policy": policy_page,
    "cli": cli_page,
    "metrics": metrics_page,
    "rule-kinds": rule_kinds_page,
    "exit-codes": exit_codes_page,
    "reports": reports_page,
}


def expand(markdown: str, where: str = "page") -> str:
    """`markdown` with every gate-reference marker replaced by its generated page. Raises
    ValueError naming `where` for a marker of an unknown page."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in PAGES:
            raise ValueError(f"{where}: unknown reference page {name!r} (expected one of {', '.join(PAGES)})")
        return PAGES[name]().rstrip("\n")

    return MARKER.sub(replace, markdown)


# --- mkdocs hook -----------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: expand the reference markers of a page (a marker naming no page fails the build)."""
    if not MARKER.search(markdown):
        return markdown
    try:
        return expand(markdown, page.file.src_uri)
    except ValueError as e:
        from mkdocs.exceptions import PluginError

        raise PluginError(str(e)) from e


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PAGES:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(PAGES)}}}")
    print(PAGES[sys.argv[1]](), end="")
