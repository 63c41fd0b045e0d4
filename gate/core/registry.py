"""One registry type for every axis of variation: draft kinds, runner kinds, workload
sources, report formats.

A kind is declared once, in its own module, and that module is named in its folder's
`BUILTIN` tuple; the registry imports those modules the first time it is read (lazily, so
no import cycle with the modules that register). A module registers its entry at import
(`REGISTRY.add(...)`) or, with `attribute`, exposes it under that name for the registry to
collect. Entries are listed built-in first, in BUILTIN order (whatever order their modules
were imported in), then the others in registration order.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """name -> entry for one axis.

    `what`: the axis in messages ("draft kind"); `builtin`: the module paths imported on
    first read, or a function returning them (read then: the folder's BUILTIN tuple); `name_of`/`module_of`: an entry's
    name and the module that declares it (for the
    BUILTIN order); `attribute`: the module attribute holding the entry, for modules that do
    not register themselves (None: they call add())."""

    def __init__(
        self,
        what: str,
        builtin: tuple[str, ...] | Callable[[], tuple[str, ...]],
        name_of: Callable[[T], str],
        module_of: Callable[[T], str],
        attribute: str | None = None,
        check: Callable[[T], None] | None = None,
    ):
        self.what = what
        self._builtin = builtin
        self._name_of = name_of
        self._module_of = module_of
        self._attribute = attribute
        self._check = check
        self._entries: dict[str, T] = {}
        self._loaded = False

    @property
    def builtin(self) -> tuple[str, ...]:
        """The built-in modules, in their listed order."""
        return tuple(self._builtin() if callable(self._builtin) else self._builtin)

    def _ensure(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self.builtin:
            loaded = importlib.import_module(module)
            if self._attribute is not None:
                self.add(getattr(loaded, self._attribute))

    def add(self, entry: T) -> T:
        """Register `entry` under its name; adding the same entry again is a no-op. Returns
        `entry`. Raises ValueError when another entry already has the name."""
        if self._check is not None:
            self._check(entry)
        name = self._name_of(entry)
        known = self._entries.get(name)
        if known is not None and known is not entry and known != entry:
            raise ValueError(
                f"{self.what} {name!r} is already registered (registered twice: by "
                f"{self._module_of(known)} and {self._module_of(entry)})"
            )
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Remove the entry called `name` (tests that register a toy one). Raises KeyError."""
        self._ensure()
        del self._entries[name]

    def entries(self) -> dict[str, T]:
        """Every entry by name, built-in first in BUILTIN order, then in registration order."""
        self._ensure()
        rank = {module: i for i, module in enumerate(self.builtin)}
        ordered = sorted(self._entries.items(), key=lambda item: rank.get(self._module_of(item[1]), len(self.builtin)))
        return dict(ordered)  # sorted() is stable: registration order within a rank

    def names(self) -> list[str]:
        """The registered names, in entries() order."""
        return list(self.entries())

    def get(self, name: str) -> T:
        """The entry called `name`. Raises KeyError naming the known ones (and the closest)."""
        entries = self.entries()
        if name in entries:
            return entries[name]
        close = difflib.get_close_matches(str(name), list(entries), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown {self.what} {name!r}; known: {', '.join(entries)}{hint}")

    def __contains__(self, name: object) -> bool:
        return name in self.entries()

    def __iter__(self) -> Iterator[T]:
        return iter(self.entries().values())
