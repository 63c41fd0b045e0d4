"""Proposal mechanisms, one module each: model.py, early_exit.py, prompt_lookup.py."""

from gate.drafts.interface import Draft, Proposal

__all__ = ["Draft", "Proposal"]
