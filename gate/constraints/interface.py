"""What a grammar constraint is and what an engine gives: the response format of a request
(JSON schema, regex or a choice of strings), checked and compiled by a GrammarEngine into a
per-request Matcher that says which tokens may follow an output prefix."""

from __future__ import annotations

import difflib
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

FormatKind = Literal["json_schema", "regex", "choice"]
FORMAT_KINDS: tuple[str, ...] = ("json_schema", "regex", "choice")
FORMAT_KEYS = {"json_schema": {"schema", "json_schema"}, "regex": {"pattern"}, "choice": {"choices"}}


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
        schema: dict[str, Any] = json.loads(self.value)
        return schema

    @property
    def choices(self) -> list[str]:
        """The allowed strings (kind choice only). Raises ValueError for another kind."""
        if self.kind != "choice":
            raise ValueError(f"a {self.kind} format has no choices")
        choices: list[str] = json.loads(self.value)
        return choices

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


def parse_response_format(value: object) -> ResponseFormat:
    """A request's `response_format` as OpenAI and vLLM take it, as a ResponseFormat:
    {"type": "json_schema", "schema": {...}} or OpenAI's {"type": "json_schema", "json_schema":
    {"name": ..., "schema": {...}}}, {"type": "regex", "pattern": "..."}, {"type": "choice",
    "choices": [...]}. Checks the form only (whether the grammar engine compiles it is
    GrammarEngine.check). Raises ValueError saying what is wrong."""
    kinds = ", ".join(FORMAT_KEYS)
    if not isinstance(value, dict) or "type" not in value:
        raise ValueError(f"expected an object with a 'type' ({kinds})")
    kind = value["type"]
    if kind not in FORMAT_KEYS:
        close = difflib.get_close_matches(str(kind), list(FORMAT_KEYS), n=1)
        raise ValueError(
            f"unknown type {kind!r}" + (f"; did you mean {close[0]!r}?" if close else "") + f" (types: {kinds})"
        )
    unknown = sorted(set(value) - FORMAT_KEYS[kind] - {"type"})
    if unknown:
        raise ValueError(
            f"unknown key {unknown[0]!r} for type {kind!r} (it takes {' or '.join(sorted(FORMAT_KEYS[kind]))})"
        )
    if kind == "json_schema":
        if ("schema" in value) == ("json_schema" in value):
            raise ValueError(
                "type json_schema takes exactly one of 'schema' (the schema) or 'json_schema' (OpenAI's "
                '{"name": ..., "schema": {...}})'
            )
        schema = value.get("schema")
        if "json_schema" in value:
            wrapper = value["json_schema"]
            if not isinstance(wrapper, dict) or not isinstance(wrapper.get("schema"), dict):
                raise ValueError("'json_schema' must be an object with a 'schema' object (OpenAI's form)")
            schema = wrapper["schema"]
        if not isinstance(schema, dict):
            raise ValueError("'schema' must be a JSON object (a JSON schema)")
        return ResponseFormat.of_schema(schema)
    if kind == "regex":
        if not isinstance(value.get("pattern"), str) or not value["pattern"]:
            raise ValueError("type regex needs 'pattern', a non-empty string")
        return ResponseFormat("regex", value["pattern"])
    choices = value.get("choices")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("type choice needs 'choices', a non-empty list of non-empty strings")
    return ResponseFormat.of_choices(choices)
