"""What a grammar constraint is and what an engine gives: the response format of a request
(JSON schema, regex or a choice of strings), checked and compiled by a GrammarEngine into a
per-request Matcher that says which tokens may follow an output prefix."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import torch

FormatKind = Literal["json_schema", "regex", "choice"]
FORMAT_KINDS: tuple[str, ...] = ("json_schema", "regex", "choice")


@dataclass(frozen=True)
class ResponseFormat:
    """A structured-output constraint on a request's output (hashable, so engines cache by it).

    `kind` "json_schema": `value` is the schema as compact JSON text, keys in their order (ResponseFormat.of_schema);
    "regex": the pattern the whole output matches; "choice": JSON array text of the strings
    the output must be one of."""

    kind: FormatKind
    value: str

    @staticmethod
    def of_schema(schema: dict[str, Any]) -> ResponseFormat:
        """The json_schema format of `schema` (a JSON-schema mapping) as compact JSON text. Keys keep
        their order: grammar engines emit properties in the order the schema lists them."""
        return ResponseFormat("json_schema", json.dumps(schema, separators=(",", ":")))

    @staticmethod
    def of_choices(choices: Sequence[str]) -> ResponseFormat:
        """The choice format of `choices` (order kept)."""
        return ResponseFormat("choice", json.dumps(list(choices), separators=(",", ":")))

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON schema (kind json_schema only). Raises ValueError for another kind."""
        if self.kind != "json_schema":
            raise ValueError(f"a {self.kind} format has no schema")
        return json.loads(self.value)

    @property
    def choices(self) -> list[str]:
        """The allowed strings (kind choice only). Raises ValueError for another kind."""
        if self.kind != "choice":
            raise ValueError(f"a {self.kind} format has no choices")
        return json.loads(self.value)

    def describe(self) -> str:
        """A short human description, e.g. "json_schema (3 properties)"."""
        if self.kind == "json_schema":
            props = self.schema.get("properties")
            return f"json_schema ({len(props)} properties)" if isinstance(props, dict) else "json_schema"
        if self.kind == "choice":
            return f"choice of {len(self.choices)}"
        return f"regex {self.value!r}"


class Matcher(ABC):
    """One request's grammar state. Cheap to ask about any output prefix: it keeps the prefix
    it last consumed and rolls back to the common part."""

    @abstractmethod
    def allowed(self, output_ids: Sequence[int]) -> torch.Tensor | None:
        """bool [V] (V: the engine's vocab_size): the tokens the grammar allows after the output
        `output_ids` (tokens after the prompt); EOS only once the output is complete. None
        when `output_ids` itself breaks the grammar."""

    @property
    def mask_ms(self) -> list[float]:
        """Wall time (ms) of every uncached allowed() call so far: rolling back, consuming the
        new tokens and computing the mask (the engine's per-position cost)."""
        return []


class GrammarEngine(ABC):
    """Compiles response formats against one tokenizer; `vocab_size` is the width of the
    target's logits (masks are padded with False beyond the tokenizer's vocabulary)."""

    name: str

    @abstractmethod
    def check(self, fmt: ResponseFormat) -> str | None:
        """None when `fmt` compiles, else the engine's error message."""

    @abstractmethod
    def matcher(self, fmt: ResponseFormat) -> Matcher:
        """A fresh Matcher for one request. Raises ValueError when `fmt` does not compile."""
