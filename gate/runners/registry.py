"""Runner kinds: kind -> runner class. Each runner module declares its kind once, with
`@register("kind")` on its class; the modules listed in BUILTIN are imported on the
first lookup (lazily: no import cycle with the modules that register)."""

from __future__ import annotations

import importlib
from typing import Callable, TypeVar

from gate.runners.interface import Runner

BUILTIN = ("gate.runners.transformers",)

_RUNNERS: dict[str, type[Runner]] = {}
R = TypeVar("R", bound=type[Runner])


def register(kind: str) -> Callable[[R], R]:
    """Class decorator: declare a Runner subclass as the runner of `kind` (sets cls.kind).
    Raises ValueError when another class already has that kind."""

    def deco(cls: R) -> R:
        if _RUNNERS.get(kind, cls) is not cls:
            raise ValueError(f"runner kind {kind!r} is already registered by {_RUNNERS[kind].__name__}")
        cls.kind = kind
        _RUNNERS[kind] = cls
        return cls

    return deco


def _load() -> None:
    for module in BUILTIN:
        importlib.import_module(module)


def runner_kinds() -> list[str]:
    """Every registered runner kind, sorted."""
    _load()
    return sorted(_RUNNERS)


def runner_class(kind: str) -> type[Runner]:
    """The runner class of `kind`. Raises KeyError naming the known kinds."""
    _load()
    if kind not in _RUNNERS:
        raise KeyError(f"unknown runner kind {kind!r}; known: {', '.join(sorted(_RUNNERS))}")
    return _RUNNERS[kind]
