"""Loading a policy file: safe YAML, a source map of YAML paths to lines, pydantic validation.

Every problem is reported with the file, the YAML path and the line (gate.core.errors.Problem).
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

import gate.policy.model as policy_model  # the module, not the package (whose __init__ imports this one)
from gate.core.errors import InputError, PolicyValueError, Problem
from gate.drafts import registry as draft_kinds
from gate.policy.model import Policy
from gate.runners import registry as runner_kinds


def _line(mark: Any) -> int:
    """The 1-based line of a YAML mark (0 where the parser gave none)."""
    return int(mark.line) + 1 if mark is not None else 0


class _Loader(yaml.SafeLoader):
    """Safe YAML with YAML 1.2 booleans: only true and false are booleans, so `level: off`
    is the string 'off' (YAML 1.1 would read off/on/yes/no as false/true). Timestamps stay
    strings: pydantic parses the fields that are dates and names the field when one is not
    a real date (PyYAML would raise a bare ValueError for 2026-13-01)."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._expanded = 0  # nodes reached through aliases so far (each alias counts its anchor's whole tree)
        self._sizes: dict[int, int] = {}
        self._open: list[str] = []  # anchors whose node is being composed

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Refuse alias amplification ("billion laughs": a few hundred bytes of nested
        anchors expanding to hundreds of millions of nodes) and an alias inside its own
        anchor, at the alias's line, before anything walks the expanded tree."""
        event = self.peek_event()  # type: ignore[no-untyped-call]  # PyYAML's stub leaves it untyped
        anchor = getattr(event, "anchor", None)
        if isinstance(event, yaml.AliasEvent):
            if anchor in self._open:
                raise AliasError(
                    _line(event.start_mark),
                    f"alias *{anchor} refers to its own anchor &{anchor} (the YAML refers to itself)",
                )
            if anchor in self.anchors:
                self._expanded += _tree_size(self.anchors[anchor], self._sizes)
                if self._expanded > MAX_ALIAS_NODES:
                    raise AliasError(
                        _line(event.start_mark),
                        f"aliases expand to more than {MAX_ALIAS_NODES:,} YAML nodes "
                        f"(at alias *{anchor}); a policy needs far fewer: nested anchors and aliases that "
                        'multiply are refused ("billion laughs")',
                    )
            return super().compose_node(parent, index)
        if anchor is None:
            return super().compose_node(parent, index)
        self._open.append(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._open.pop()


# Nodes that aliases may add to a policy in all (an ordinary anchor reused a few times adds tens).
MAX_ALIAS_NODES = 10_000


class AliasError(Exception):
    """Aliases that expand too far, or that refer to their own anchor: bad input at `line`."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


def _tree_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Nodes in `node`'s tree with every alias expanded, memoized per node (linear in the
    document, however far the aliases multiply)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    if isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_tree_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total = 1 + sum(_tree_size(k, sizes) + _tree_size(v, sizes) for k, v in node.value)
    else:
        total = 1
    sizes[id(node)] = total
    return total


_BOOL = "tag:yaml.org,2002:bool"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _TIMESTAMP)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _safe_data(text: str) -> Any:
    """The document's data through _Loader (a SafeLoader: no arbitrary objects)."""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


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
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            sub = parts + (key,)
            line = key_node.start_mark.line + 1
            if key in seen:
                problems.append(
                    Problem(
                        source.file,
                        yaml_path(sub),
                        line,
                        f"duplicate key {key!r} (first at line {seen[key]}); each key may appear once",
                    )
                )
            seen.setdefault(key, line)
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


def _unwrap(tp: Any) -> Any:
    """Annotated[X, ...] -> X; X | None -> X."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _type_name(tp: Any) -> str:
    """The name pydantic gives a union member in error locations: 'LawSpec', 'list[int]'."""
    tp = _unwrap(tp)
    if get_origin(tp) is not None:
        return f"{get_origin(tp).__name__}[{', '.join(_type_name(a) for a in get_args(tp))}]"
    return getattr(tp, "__name__", str(tp))


def _step(tp: Any, part: Any) -> Any:
    tp = _unwrap(tp)
    if _is_model(tp):
        field = tp.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field else None
    origin = get_origin(tp)
    if origin is list and isinstance(part, int):
        return get_args(tp)[0]
    if origin is dict:
        return get_args(tp)[1]
    if origin in (Union, types.UnionType):
        for member in get_args(tp):
            member = _unwrap(member)
            if _type_name(member) == part:
                return member
            kind = member.model_fields.get("kind") if _is_model(member) else None
            if kind is not None and part in get_args(kind.annotation):
                return member
    return None


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The policy model class at a raw pydantic error location (None when not a model)."""
    tp: Any = Policy
    for part in loc:
        tp = _step(tp, part)
        if tp is None:
            return None
    tp = _unwrap(tp)
    return tp if _is_model(tp) else None


# Names the field gives other values than gate's, and gate's: a synonym is the likely meaning, not the nearest
# spelling ('p50' is the median, not 'p95').
SYNONYMS = {"p50": "median", "avg": "mean", "average": "mean", "minimum": "min", "maximum": "max"}


def _close(key: str, known: list[str]) -> str | None:
    if SYNONYMS.get(key) in known:
        return SYNONYMS[key]
    close = difflib.get_close_matches(key, known, n=1)
    return close[0] if close else None


def _unknown_key(error: dict[str, Any]) -> tuple[str, str | None]:
    """The message for an unknown key and the key it probably meant."""
    key = str(error["loc"][-1])
    model = _model_at(tuple(error["loc"][:-1]))
    if error["loc"][0] == "runner" and len(error["loc"]) == 3:  # a key of another runner kind's spec
        kinds = runner_kinds.registered_kinds()
        owners = [k for k in kinds if key in runner_kinds.runner_class(k).spec.model_fields and k != error["loc"][1]]
        if owners:
            return f"{key} applies to runner kind {' or '.join(owners)}, not {error['loc'][1]}", None
    known = (
        [f.alias or n for n, f in model.model_fields.items()] if model else []
    )  # as YAML spells them (schema_: schema)
    guess = _close(key, known) if known else _close(key, _known_keys())
    if guess:
        return f"unknown key {key!r}; did you mean {guess!r}?", guess
    if known:
        return f"unknown key {key!r}; expected one of: {', '.join(known)}", None
    return f"unknown key {key!r}", None


_NOUN = {"str": "a string", "float": "a number", "int": "an integer", "bool": "true or false", "LawSpec": "a mapping"}


def _noun(tag: str) -> str:
    return "a list" if tag.startswith("list[") else _NOUN.get(tag, tag)


def _got(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    return repr(value)


# The policy's unions discriminated by `kind`: top-level key -> (depth of the kind tag in an
# error location, what a kind is of, its registered names, the registry module).
_TAGGED: dict[str, tuple[int, str, Callable[[], list[str]], str]] = {
    "drafts": (2, "draft", lambda: draft_kinds.names(), "gate/drafts/registry.py"),
    "runner": (1, "runner", lambda: runner_kinds.registered_kinds(), "gate/runners/registry.py"),
}


def _tagged(loc: tuple[Any, ...]) -> tuple[str, list[str], str]:
    """(what a kind is of, the registered kinds, their registry) for an error at `loc`."""
    _, what, names, registry = _TAGGED.get(loc[0] if loc else "drafts", _TAGGED["drafts"])
    return what, names(), registry


def _is_tag(out: list[Any], node: Any, part: Any) -> bool:
    """Whether `part`, the next segment of an error location after the YAML path `out`, is
    the kind tag pydantic adds for a discriminated union (no YAML key): a draft's, or the
    runner's (whose kind may be left to its default)."""
    if not out or out[0] not in _TAGGED or len(out) != _TAGGED[out[0]][0] or not isinstance(node, dict):
        return False
    kinds = _TAGGED[out[0]][2]()
    return bool(node.get("kind", kinds[0] if out[0] == "runner" else None) == part)


def _message(error: dict[str, Any]) -> str:
    kind: str = error["type"]
    msg: str = error["msg"]
    if kind == "extra_forbidden":
        return _unknown_key(error)[0]
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        tag = error["input"].get("kind")
        what, kinds, registry = _tagged(error["loc"])
        if tag in kinds:  # registered, but after the policy's union was built
            return (
                f"{what} kind {tag!r} was registered after gate.policy was imported, so policies cannot use it; "
                f"list its module in {registry} BUILTIN (or register it before importing gate.policy)"
            )
        guess = _close(str(tag), kinds)
        return f"unknown kind {tag!r}; expected one of: {', '.join(kinds)}" + (
            f" (did you mean {guess!r}?)" if guess else ""
        )
    if kind == "union_tag_not_found":
        what, kinds, _ = _tagged(error["loc"])
        msg = f"a {what} needs a 'kind': {' or '.join([', '.join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else kinds)}"
        typo = _close("kind", [str(k) for k in error["input"]]) if isinstance(error["input"], dict) else None
        return msg + (f" (is {typo!r} a misspelt 'kind'?)" if typo else "")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"expected a mapping (key: value lines), got {_got(error['input'])}"
    if kind == "list_type":
        return f"expected a list, got {_got(error['input'])}"
    if kind == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == policy_model.NAME:
        return (
            f"{error['input']!r} is not a valid name: use letters, digits, '_', '.' and '-', starting with a "
            "letter or digit"
        )
    if msg.startswith("Value error, "):  # our own validators: the message says it all
        return msg[len("Value error, ") :]
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_got(error['input'])}"
    if kind == "union_type" or isinstance(error["input"], dict):
        return msg
    if kind == "literal_error" and isinstance(error["input"], str):  # e.g. metric: itl -> did you mean 'itl_ms'?
        guess = _close(error["input"], re.findall(r"'([^']*)'", (error.get("ctx") or {}).get("expected", "")))
        if guess:
            return f"{msg}, got {_got(error['input'])} (did you mean {guess!r}?)"
    return f"{msg}, got {_got(error['input'])}"  # e.g. "Input should be 'cpu', 'cuda' or 'auto', got 'gpu'"


_EXPECTED = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
}


_UNION_MEMBERS = {"LawSpec", "list[LawSpec]", "int", "list[int]", "str", "float", "ConstraintSpec"}


def _union_branch(loc: tuple[Any, ...], data: Any) -> tuple[tuple[Any, ...], str, Any] | None:
    """(location before the tag, union member tag, the YAML value there) for an error
    inside a plain union (law: a mapping or a list; max_new_tokens: a number or a list)."""
    node = data
    for i, part in enumerate(loc):
        if isinstance(part, str) and part in _UNION_MEMBERS and not (isinstance(node, dict) and part in node):
            return tuple(loc[:i]), part, node
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif not (loc[0] in _TAGGED and i == _TAGGED[loc[0]][0]):  # a kind tag is no YAML key: step over it
            return None
    return None


def _branches(errors: list[dict[str, Any]], data: Any) -> list[dict[str, Any]]:
    """One error per plain union: when every member rejects the value's type, one
    'expected a mapping or a list' error; otherwise only the errors of the member the
    YAML meant (the list member for a YAML list, the others otherwise)."""
    groups: dict[tuple[Any, ...], list[tuple[str, Any, dict[str, Any]]]] = {}
    out: list[dict[str, Any]] = []
    for error in errors:
        branch = _union_branch(tuple(error["loc"]), data)
        if branch is None:
            out.append(error)
        else:
            groups.setdefault(branch[0], []).append((branch[1], branch[2], error))
    for prefix, members in groups.items():
        value = members[0][1]
        tags = list(dict.fromkeys(tag for tag, _, _ in members))
        if len(tags) > 1 and all(len(e["loc"]) == len(prefix) + 1 for _, _, e in members):
            out.append(
                {
                    "type": "union_type",
                    "loc": prefix,
                    "input": value,
                    "msg": f"expected {' or '.join(_noun(t) for t in tags)}, got {_got(value)}",
                }
            )
        else:
            wanted = [m for m in members if m[0].startswith("list[") == isinstance(value, list)] or members
            out.extend(e for _, _, e in wanted)
    return out


def _clean_loc(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """Map a pydantic error location onto the YAML document.

    Drops the segments pydantic adds for unions (the draft kind tag, 'list[LawSpec]', ...)
    and for dict keys ('[key]'), and stops at a key the YAML lacks (a missing or an
    unknown key ends the path). Mapping keys stay strings, even when YAML read a number."""
    out: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        if _is_tag(out, node, part) and i + 1 < len(loc):
            continue
        if isinstance(node, dict) and part in node:
            out.append(str(part))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(part)
            node = node[part]
        elif part in _UNION_MEMBERS or part == "[key]":
            continue
        else:
            if isinstance(node, dict) and isinstance(part, str):
                out.append(part)
            break
    return tuple(out)


def _member(part: Any) -> Any:
    """A union member's tag without pydantic's validator wrapper: a model with an after
    validator is tagged 'function-after[_check(), LawSpec]' in error locations; -> 'LawSpec'
    ('list[function-after[...]]' -> 'list[LawSpec]')."""
    return re.sub(r"function-\w+\[\w+\(\), (\w+)\]", r"\1", part) if isinstance(part, str) else part


def _problems(e: ValidationError, data: Any, source: SourceMap) -> list[Problem]:
    """One problem per thing wrong, at the YAML path and line it is about."""
    errors = _branches([{**x, "loc": tuple(_member(p) for p in x["loc"])} for x in e.errors()], data)
    found: list[tuple[str, dict[str, Any]]] = []
    for error in errors:
        path = yaml_path(_clean_loc(tuple(error["loc"]), data))
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, policy_model.FieldError):
            path = f"{path}.{cause.field}" if path else cause.field
        elif error["type"] == "union_tag_invalid":
            path += ".kind"
        found.append((path, error))
    # A misspelt required key is one problem, not "unknown key" plus "required key is missing".
    meant = set()
    for path, error in found:
        if error["type"] == "extra_forbidden":
            guess = _unknown_key(error)[1]
            if guess:
                parent = path[: max(path.rfind("."), 0)]
                meant.add(f"{parent}.{guess}" if parent else guess)
    return _dedupe(
        [
            source.problem(path, _message(error))
            for path, error in found
            if not (error["type"] == "missing" and path in meant)
        ]
    )


@dataclass(frozen=True)
class LoadedPolicy:
    """A validated policy with where it came from (for relative paths and line numbers)."""

    policy: Policy
    path: Path
    source: SourceMap
    warnings: list[Problem] = field(default_factory=list)  # e.g. an under-powered rule (gate validate prints them)

    def error(self, exc: PolicyValueError) -> InputError:
        """Turn an error raised while using a value into one that names file, path and line."""
        return InputError([self.source.problem(*policy_model.sweep_path(self.policy, exc.path, exc.message))])

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
        root = yaml.compose(text, Loader=_Loader)
        data = _safe_data(text)
        if root is None or not isinstance(data, dict):
            raise InputError(
                [
                    Problem(
                        name,
                        "",
                        1,
                        "a policy is a YAML mapping with at least 'version', 'drafts' and 'rules' ('version' and "
                        "'rules' for gate exactness)",
                    )
                ]
            )
        _walk(root, (), source, problems)
    except yaml.YAMLError as e:
        raise InputError([_yaml_problem(name, e)]) from None
    except AliasError as e:
        raise InputError([Problem(name, "", e.line, e.message)]) from None
    except RecursionError:
        raise InputError(
            [Problem(name, "", None, "the YAML refers to itself (an alias inside its own anchor)")]
        ) from None
    if problems:
        raise InputError(problems)
    try:
        policy = Policy.model_validate(data)
    except ValidationError as e:
        raise InputError(_problems(e, data, source)) from None
    problems = [source.problem(p, m) for p, m in policy_model.placed(policy, policy_model._check_names(policy))]
    if problems:
        raise InputError(problems)
    return LoadedPolicy(policy, path, source)


def _dedupe(problems: list[Problem]) -> list[Problem]:
    out: list[Problem] = []
    for p in problems:
        if p not in out:
            out.append(p)
    return out


def _yaml_problem(name: str, e: yaml.YAMLError) -> Problem:
    """Malformed YAML: the line where the parser gave up, and where the construct it was
    reading began (an unclosed bracket, a mapping whose indentation went wrong)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line = mark.line + 1 if mark else None
    reason = getattr(e, "problem", None) or str(e)
    context, context_mark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and context_mark is not None and context_mark.line + 1 != line:
        reason += f" ({context} that starts at line {context_mark.line + 1})"
    elif context:
        reason += f" ({context})"
    if "indent" not in reason and any(
        w in reason for w in ("mapping values are not allowed", "expected <block end>", "could not find expected ':'")
    ):
        reason += "; check the indentation"
    return Problem(name, "", line, f"malformed YAML: {reason}")
