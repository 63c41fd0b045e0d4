"""Engines by name: the one list the policy's `engine:` values, the counter detection and
the refusal messages are assembled from. Each engine module declares its Engine once, with
`@register` on its class; the modules listed in BUILTIN are imported on the first lookup
(lazily: no import cycle with the modules that register)."""

from __future__ import annotations

from typing import TypeVar

from gate.core.registry import Registry
from gate.runners.engines.interface import Engine, ServerSnapshot

# The registration lines, in this order (of engine_names(): the policy's Literal and messages).
BUILTIN = (
    "gate.runners.engines.generic",
    "gate.runners.engines.vllm",
    "gate.runners.engines.llama_cpp",
    "gate.runners.engines.sglang",
    "gate.runners.engines.trtllm",
)

_ENGINES: Registry[Engine] = Registry(
    "engine", lambda: BUILTIN, name_of=lambda e: e.name, module_of=lambda e: type(e).__module__
)
E = TypeVar("E", bound=type[Engine])


def register(cls: E) -> E:
    """Class decorator: register an instance of the Engine subclass `cls` under `cls.name`.
    Raises ValueError when another engine already has that name."""
    _ENGINES.add(cls())
    return cls


def engine(name: str) -> Engine:
    """The engine called `name`. Raises KeyError naming the known engines."""
    return _ENGINES.get(name)


def engine_names() -> list[str]:
    """Every registered engine name, built-in first in BUILTIN order."""
    return _ENGINES.names()


def engines() -> list[Engine]:
    """Every registered engine, in engine_names() order."""
    return list(_ENGINES)


def unregister(name: str) -> None:
    """Remove the engine called `name` (tests that register a toy one). Raises KeyError."""
    _ENGINES.remove(name)


def detect_engine(snapshot: ServerSnapshot) -> str | None:
    """The first engine (engine_names() order) whose marker counter (Engine.marker) appears
    in `snapshot`, or None."""
    names = {k.split("{", 1)[0] for k in snapshot.values}
    return next((e.name for e in engines() if e.marker is not None and e.marker in names), None)
