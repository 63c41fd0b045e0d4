"""Loading a policy file: safe YAML, a source map of YAML paths to lines, pydantic validation.

Every problem is reported with the file, the YAML path and the line (gate.errors.Problem).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gate.errors import InputError, PolicyValueError, Problem
from gate.policy import model as policy_model
from gate.policy.model import Policy


def yaml_path(parts: tuple[Any, ...] | list[Any]) -> str:
    """('rules', 2, 'threshold') -> 'rules[2].threshold'."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass
class SourceMap:
    """Lines (1-based) of every YAML path in one document, for error messages."""

    file: str
    lines: dict[str, int] = field(default_factory=dict)

    def line(self, path: str) -> int | None:
        """The line of `path`, or of its nearest ancestor that exists in the file."""
        while path:
            if path in self.lines:
                return self.lines[path]
            cut = max(path.rfind("."), path.rfind("["))
            path = path[:cut] if cut > 0 else ""
        return self.lines.get("", 1)

    def problem(self, path: str, message: str) -> Problem:
        return Problem(self.file, path, self.line(path), message)


def _walk(node: yaml.Node, parts: tuple[Any, ...], source: SourceMap, problems: list[Problem]) -> None:
    source.lines[yaml_path(parts)] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            sub = parts + (key,)
            if key in seen:
                problems.append(Problem(source.file, yaml_path(sub), key_node.start_mark.line + 1, f"duplicate key {key!r}"))
            seen.add(key)
            source.lines[yaml_path(sub)] = key_node.start_mark.line + 1
            _walk(value_node, sub, source, problems)
            source.lines[yaml_path(sub)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, parts + (i,), source, problems)


def _known_keys() -> list[str]:
    keys: set[str] = set()
    for obj in vars(policy_model).values():
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj is not BaseModel:
            keys.update(obj.model_fields)
    return sorted(keys)


def _message(error: dict[str, Any]) -> str:
    kind, msg = error["type"], error["msg"]
    if kind == "extra_forbidden":
        key = str(error["loc"][-1])
        close = difflib.get_close_matches(key, _known_keys(), n=1)
        return f"unknown key {key!r}" + (f"; did you mean {close[0]!r}?" if close else "")
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        return f"unknown kind {error['input'].get('kind')!r}; expected one of: model, prompt_lookup, early_exit"
    if kind == "union_tag_not_found":
        return "a draft needs a 'kind': model, prompt_lookup or early_exit"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return msg


_UNION_MEMBERS = {"LawSpec", "list[LawSpec]", "int", "list[int]", "str", "float"}


def _clean_loc(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """Map a pydantic error location onto the YAML document.

    Drops the segments pydantic adds for unions (the draft kind tag, 'list[LawSpec]', ...)
    and stops at a key the YAML lacks (a missing or an unknown key ends the path)."""
    out: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        is_draft_tag = len(out) == 2 and out[0] == "drafts" and isinstance(node, dict) and node.get("kind") == part
        if is_draft_tag and i + 1 < len(loc):
            continue
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(part)
            node = node[part]
        elif part in _UNION_MEMBERS:
            continue
        else:
            if isinstance(node, dict) and isinstance(part, str):
                out.append(part)
            break
    return tuple(out)


@dataclass(frozen=True)
class LoadedPolicy:
    """A validated policy with where it came from (for relative paths and line numbers)."""

    policy: Policy
    path: Path
    source: SourceMap

    def error(self, exc: PolicyValueError) -> InputError:
        """Turn an error raised while using a value into one that names file, path and line."""
        return InputError([self.source.problem(exc.path, exc.message)])

    def resolve(self, relative: str) -> Path:
        """A path written in the policy, relative to the policy file's folder."""
        p = Path(relative).expanduser()
        return p if p.is_absolute() else (self.path.parent / p)


def load_policy(path: str | Path) -> LoadedPolicy:
    """Read, parse and validate a policy file.

    Raises InputError (exit code 2) listing every problem with file, YAML path and line:
    unreadable file, malformed YAML, duplicate or unknown keys, wrong types, bad units.
    """
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError([Problem(name, "", None, "policy file not found")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError([Problem(name, "", None, f"cannot read policy file: {e}")]) from None
    source = SourceMap(name)
    problems: list[Problem] = []
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = mark.line + 1 if mark else None
        reason = getattr(e, "problem", None) or str(e)
        raise InputError([Problem(name, "", line, f"malformed YAML: {reason}")]) from None
    if root is None or not isinstance(data, dict):
        raise InputError([Problem(name, "", 1, "a policy is a YAML mapping with at least 'version' and 'drafts'")])
    _walk(root, (), source, problems)
    if problems:
        raise InputError(problems)
    try:
        policy = Policy.model_validate(data)
    except ValidationError as e:
        for error in e.errors():
            p = yaml_path(_clean_loc(error["loc"], data))
            problems.append(source.problem(p, _message(error)))
        raise InputError(_dedupe(problems)) from None
    problems = [source.problem(p, m) for p, m in policy_model._check_names(policy)]
    if problems:
        raise InputError(problems)
    return LoadedPolicy(policy, path, source)


def _dedupe(problems: list[Problem]) -> list[Problem]:
    out: list[Problem] = []
    for p in problems:
        if p not in out:
            out.append(p)
    return out
