"""Runner kinds: kind -> runner class. Each runner module declares its kind once, with
`@register("kind")` on its class; the modules listed in BUILTIN are imported on the
first lookup (lazily: no import cycle with the modules that register)."""

from __future__ import annotations

from typing import Callable, TypeVar

from gate.registry import Registry
from gate.runners.interface import Runner

BUILTIN = ("gate.runners.transformers", "gate.runners.openai", "gate.runners.llama_server")

_RUNNERS: Registry[type[Runner]] = Registry("runner kind", lambda: BUILTIN, name_of=lambda cls: cls.kind,
                                           module_of=lambda cls: cls.__module__)
R = TypeVar("R", bound=type[Runner])


def register(kind: str) -> Callable[[R], R]:
    """Class decorator: declare a Runner subclass as the runner of `kind` (sets cls.kind).
    Raises ValueError when another class already has that kind."""

    def deco(cls: R) -> R:
        cls.kind = kind
        return _RUNNERS.add(cls)

    return deco


def runner_kinds() -> list[str]:
    """Every registered runner kind, sorted."""
    return sorted(_RUNNERS.names())


def runner_class(kind: str) -> type[Runner]:
    """The runner class of `kind`. Raises KeyError naming the known kinds."""
    return _RUNNERS.get(kind)
