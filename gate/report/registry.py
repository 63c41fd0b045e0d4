"""The report formats gate knows, by name: json, junit, markdown, console, html.

Each format registers once, at the end of its own module:

    register(JsonReport, "every raw measurement and every outcome (schemas/report.schema.json)")

and this registry imports the built-in modules (BUILTIN) the first time it is read. The
CLI writes and prints the reports it is asked for through create(); a new format is one
module under gate/report plus its name in BUILTIN."""

from __future__ import annotations

from typing import Any

from gate.core.registry import Registry
from gate.report.interface import ReportFormat

# The built-in formats, in the order they are listed.
BUILTIN = ("gate.report.json", "gate.report.junit", "gate.report.markdown", "gate.report.console", "gate.report.html")

_FORMATS: Registry[tuple[type[ReportFormat], str]] = Registry(
    "report format", lambda: BUILTIN, name_of=lambda entry: entry[0].name, module_of=lambda entry: entry[0].__module__
)


def register(cls: type[ReportFormat], description: str) -> type[ReportFormat]:
    """Add a format under `cls.name` with a one-line description (its module calls this
    once, at import). Returns `cls`. Raises ValueError when another class has the name."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"report format {cls.__qualname__} has no name")
    _FORMATS.add((cls, description))
    return cls


def unregister(name: str) -> None:
    """Remove a format (tests that register a toy one). Raises KeyError for an unknown name."""
    _FORMATS.remove(name)


def formats() -> dict[str, type[ReportFormat]]:
    """Every registered format class by name: built-in ones in BUILTIN order, then the
    others in registration order."""
    return {name: cls for name, (cls, _) in _FORMATS.entries().items()}


def names() -> list[str]:
    """The registered format names, in formats() order."""
    return _FORMATS.names()


def descriptions() -> dict[str, str]:
    """name -> the one-line description each format registered with (formats() order)."""
    return {name: description for name, (_, description) in _FORMATS.entries().items()}


def get(name: str) -> type[ReportFormat]:
    """The format class called `name`. Raises KeyError (naming the known ones) otherwise."""
    return _FORMATS.get(name)[0]


def create(name: str, **options: Any) -> ReportFormat:
    """An instance of the format called `name`, built with `options` (its constructor's
    keywords, e.g. junit's warn_as). Raises KeyError for an unknown name, TypeError for
    an option the format does not take."""
    return get(name)(**options)
