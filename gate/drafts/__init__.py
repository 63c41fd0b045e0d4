"""Proposal mechanisms, one module each: model, early_exit, prompt_lookup, cross_tokenizer
(a draft with another tokenizer), heads (trained Medusa-style heads).

Each module declares its policy spec and a `KIND = DraftKind(...)` (build, bill and roofline
costs, checks: gate.drafts.interface); gate.drafts.registry lists the modules. A new draft
kind is a new module here plus its line in registry.BUILTIN."""

from gate.drafts.interface import Draft, Proposal

__all__ = ["Draft", "Proposal"]
