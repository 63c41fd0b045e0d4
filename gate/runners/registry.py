"""Runner kinds: kind -> runner class. Each runner module declares its kind once, with
`@register("kind")` on its class; the modules listed in BUILTIN are imported on the
first lookup (lazily: no import cycle with the modules that register)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar, Union, get_args

from pydantic import BeforeValidator, Field

from gate.core.registry import Registry
from gate.runners.interface import Runner

BUILTIN = ("gate.runners.transformers", "gate.runners.openai", "gate.runners.llama_server", "gate.runners.vllm_server")

_RUNNERS: Registry[type[Runner]] = Registry(
    "runner kind", lambda: BUILTIN, name_of=lambda cls: cls.kind, module_of=lambda cls: cls.__module__
)
R = TypeVar("R", bound=type[Runner])


def register(kind: str) -> Callable[[R], R]:
    """Class decorator: declare a Runner subclass as the runner of `kind` (sets cls.kind), with
    its policy spec class `cls.spec` (whose `kind` is Literal[kind]). Raises ValueError when
    another class already has that kind, or when the spec's kind tag is not `kind`."""

    def deco(cls: R) -> R:
        tags = get_args(cls.spec.model_fields["kind"].annotation) if hasattr(cls, "spec") else ()
        if tags != (kind,):
            raise ValueError(
                f"runner kind {kind!r}: its spec class {getattr(cls, 'spec', None)!r} must declare "
                f"kind: Literal[{kind!r}]"
            )
        cls.kind = kind
        added = _RUNNERS.add(cls)
        cls.spec.runner = cls
        return added

    return deco


def unregister(kind: str) -> None:
    """Remove runner kind `kind` (a test's toy kind). Raises KeyError when not registered."""
    _RUNNERS.remove(kind)


def registered_kinds() -> list[str]:
    """Every registered runner kind in registration order (the built-in kinds first, in
    BUILTIN order): the first is the default runner."""
    return list(_RUNNERS.names())


def runner_spec_union() -> Any:
    """The policy's `runner` type: the registered kinds' spec classes as a pydantic union
    discriminated by `kind`; a mapping without `kind` is the default kind's (the first
    registered: gate's in-process loop)."""
    specs = tuple(_RUNNERS.get(k).spec for k in registered_kinds())
    default = registered_kinds()[0]

    def kind_default(value: Any) -> Any:
        return {"kind": default, **value} if isinstance(value, dict) and "kind" not in value else value

    union = specs[0] if len(specs) == 1 else Annotated[Union[specs], Field(discriminator="kind")]  # noqa: UP007
    return Annotated[union, BeforeValidator(kind_default)]


def default_runner_spec() -> Any:
    """The `runner` section of a policy that has none: the default kind's spec, defaults only."""
    return _RUNNERS.get(registered_kinds()[0]).spec()


def runner_kinds() -> list[str]:
    """Every registered runner kind, sorted."""
    return sorted(_RUNNERS.names())


def runner_class(kind: str) -> type[Runner]:
    """The runner class of `kind`. Raises KeyError naming the known kinds."""
    return _RUNNERS.get(kind)
