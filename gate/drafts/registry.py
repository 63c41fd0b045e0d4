"""Draft kinds by name: the one list the policy union, its kind messages, the bill, the
roofline and validation are assembled from.

A new draft kind is one module under gate/drafts that declares `KIND = DraftKind(...)`
(spec class, build, costs, checks: see gate.drafts.interface.DraftKind) plus its line in
BUILTIN below. `register`/`unregister` add or remove a kind at run time (plugins, tests);
the policy's pydantic union is built once, when gate.policy.model is imported, so a kind
registered later is listed in messages but parsed only by a union built after it
(`draft_spec_union()`).

This module imports no gate.policy: the policy imports drafts, never the other way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Union

import torch
from pydantic import Field

from gate.core.registry import Registry
from gate.drafts.interface import (
    BuildContext,
    BuiltDraft,
    ConfigContext,
    Draft,
    DraftKind,
    DraftModelConfig,
    ModelRef,
    bill_from_modules,
)
from gate.measure.bill import DraftBill
from gate.measure.kv import KVFormat
from gate.measure.speculation import ProposalFloor

# The registration lines: module paths whose `KIND` is registered, in this order (the order
# of the policy union, of the JSON schema's oneOf and of "expected one of" messages).
BUILTIN = (
    "gate.drafts.model",
    "gate.drafts.prompt_lookup",
    "gate.drafts.early_exit",
    "gate.drafts.cross_tokenizer",
    "gate.drafts.heads",
    "gate.drafts.eagle",
    "gate.drafts.mtp",
)


def _well_formed(kind: DraftKind) -> None:
    """A kind's spec must accept exactly its name as `kind:` (the union's discriminator)."""
    tag = kind.spec.model_fields.get("kind")
    if tag is None or getattr(tag.annotation, "__args__", None) != (kind.name,):
        raise ValueError(
            f"draft kind {kind.name!r}: its spec {kind.spec.__name__} needs `kind: Literal[{kind.name!r}]`"
        )


_KINDS: Registry[DraftKind] = Registry(
    "draft kind",
    lambda: BUILTIN,
    name_of=lambda kind: kind.name,
    module_of=lambda kind: kind.spec.__module__,
    attribute="KIND",
    check=_well_formed,
)


def register(kind: DraftKind) -> DraftKind:
    """Add `kind` (after the built-in kinds). Raises ValueError when its name is taken or its
    spec's `kind` field does not accept exactly its name."""
    if kind.name in _KINDS:
        raise ValueError(f"draft kind {kind.name!r} is already registered")
    return _KINDS.add(kind)


def unregister(name: str) -> None:
    """Remove a kind registered with `register` (KeyError when none has that name)."""
    _KINDS.remove(name)


def kinds() -> list[DraftKind]:
    """Every registered kind, built-in first, in registration order."""
    return list(_KINDS)


def names() -> list[str]:
    """The registered kind names (the policy's `kind:` values), in registration order."""
    return _KINDS.names()


def get(name: str) -> DraftKind:
    """The kind called `name`. Raises KeyError naming the known kinds."""
    return _KINDS.get(name)


def draft_spec_union() -> Any:
    """The policy's DraftSpec type: the registered kinds' spec classes as a pydantic union
    discriminated by `kind` (a single kind: its spec class)."""
    specs = tuple(k.spec for k in kinds())
    if len(specs) == 1:
        return specs[0]
    return Annotated[Union[specs], Field(discriminator="kind")]  # noqa: UP007 - a union of a tuple built at run time


# What callers use, one function per question, so that none of them branches on a kind.


def build_draft(name: str, spec: Any, ctx: BuildContext) -> BuiltDraft:
    """The in-process draft `name` of the policy (and its model info). Raises PolicyValueError."""
    built = get(spec.kind).build(name, spec, ctx)
    if not getattr(built.draft, "kind", None):  # the measurements name a draft by its kind
        built.draft.kind = spec.kind
    return built


def model_config(name: str, spec: Any, ctx: ConfigContext) -> DraftModelConfig | None:
    """The model draft `name` runs, from configs alone (None: none). Raises PolicyValueError."""
    return get(spec.kind).model_config(name, spec, ctx)


def has_distribution(spec: Any) -> bool:
    """Whether the draft gives a full distribution q (the bill's draft probabilities): its
    kind's probability_info, or the spec's own where it depends on a field (cross_tokenizer's
    mapping)."""
    return getattr(spec, "probability_info", get(spec.kind).probability_info) == "distribution"


def loaded_bill(name: str, draft: Draft, target: torch.nn.Module, kv_format_of: Callable[[str], KVFormat]) -> DraftBill:
    """Bill inputs of a loaded draft (gate check); a draft of an unregistered kind (one built
    directly in a test) is billed from its modules."""
    kind = _KINDS.get(draft.kind) if draft.kind in _KINDS else None
    return (kind.loaded_bill if kind else bill_from_modules)(name, draft, target, kv_format_of)


def check_target_config(name: str, spec: Any, config: Any) -> None:
    """Validate draft `name` against the target's transformers config (no weights).
    Raises PolicyValueError at the draft's YAML path."""
    get(spec.kind).check_target_config(name, spec, config)


def tokenizer_sources(name: str, spec: Any) -> list[ModelRef]:
    """Separate models of draft `name` whose tokenizer must match the target's."""
    return get(spec.kind).tokenizer_sources(name, spec)


def check_tokenizer(name: str, spec: Any, target_tokenizer: Any, policy_dir: Any) -> None:
    """Validate draft `name`'s own tokenizer, where its kind brings one (cross_tokenizer).
    Raises PolicyValueError at the draft's YAML path."""
    get(spec.kind).check_tokenizer(name, spec, target_tokenizer, policy_dir)


def policy_problems(name: str, spec: Any, target: Any) -> list[tuple[str, str]]:
    """(YAML path, message) for draft `name` against the policy's target section."""
    return get(spec.kind).policy_problems(name, spec, target)


def check_files(name: str, spec: Any, policy_dir: Any, config: Any) -> None:
    """Validate the files draft `name` reads (paths relative to `policy_dir`) against the
    target's transformers config, without loading weights. Raises PolicyValueError."""
    get(spec.kind).check_files(name, spec, policy_dir, config)


def proposal_floor(spec: Any) -> ProposalFloor:
    """The fewest proposing steps a draft's outputs imply if speculation ran
    (gate.measure.speculation.ProposalFloor), by its kind."""
    return get(spec.kind).proposal_floor(spec)


def file_weight_bytes(name: str, spec: Any, policy_dir: Any) -> int:
    """Weight bytes of draft `name` that runs no model of its own, from its files (0: none)."""
    return get(spec.kind).file_weight_bytes(name, spec, policy_dir)
