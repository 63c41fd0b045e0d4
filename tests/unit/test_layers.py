"""Layering of the gate package: no import cycles, counting every import.

Every module under gate/ (a package's __init__ counts as the module of that package) is
parsed with ``ast``; its imports at module level, inside functions and under
``if TYPE_CHECKING:`` all count. ``import a.b.c`` depends on ``a.b.c``; ``from a.b import c``
depends on ``a.b`` (its __init__ runs and its namespace is read) and on ``a.b.c`` when that
is a module. Relative imports are resolved against the importing module. The test is
generic: it walks whatever modules exist, so files may move without touching it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "gate"


def module_names(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under root/package (packages by __init__)."""
    out: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a (possibly relative) `from ... import` source."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The gate modules `module` imports anywhere in its file (module and function level)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    deps: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                deps.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node.level, node.module)
            deps.add(source)
            for alias in node.names:
                deps.add(f"{source}.{alias.name}")
    out = set()
    for dep in deps:
        # `import gate.a.b` of a name that is not a module (an attribute): its longest module prefix
        while dep and dep not in known:
            dep = dep.rpartition(".")[0]
        if dep and dep != module and dep.split(".")[0] == PACKAGE:
            out.add(dep)
    return out


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """module -> the gate modules it imports."""
    known = module_names(root, package)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ())))]
        path = [start]
        state[start] = 1
        while stack:
            node, todo = stack[-1]
            if not todo:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            nxt = todo.pop(0)
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, sorted(graph.get(nxt, ()))))
    return None


def all_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """A cycle per strongly connected component with more than one module (for the message)."""
    cycles: list[list[str]] = []
    remaining = {k: set(v) for k, v in graph.items()}
    while (cycle := find_cycle(remaining)) is not None:
        cycles.append(cycle)
        remaining[cycle[-2]].discard(cycle[-1])  # break it and look for the next one
    return cycles


def test_the_graph_sees_every_import_kind(tmp_path: Path) -> None:
    """Module-level, function-level, relative and package imports are all edges."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from gate.sub.b import thing\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from . import b\n    import gate.c\n")
    (pkg / "sub" / "b.py").write_text("from gate.sub import a\nthing = 1\n")
    (pkg / "c.py").write_text("import os\n")
    graph = import_graph(tmp_path)
    assert graph["gate.sub.a"] == {"gate.sub", "gate.sub.b", "gate.c"}
    assert graph["gate.sub.b"] == {"gate.sub", "gate.sub.a"}
    assert graph["gate.sub"] == {"gate.sub.b"}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles_in_gate() -> None:
    graph = import_graph()
    assert len(graph) > 20, f"found only {len(graph)} modules under {ROOT / PACKAGE}"
    cycles = all_cycles(graph)
    assert not cycles, "import cycles in gate/ (module-level and function-level imports count):\n" + "\n".join(
        "  " + " -> ".join(c) for c in cycles)
