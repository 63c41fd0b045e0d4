"""A JSONL file of prompts, one JSON object a line:

    {"prompt": "text", "category": "qa", "id": "q1"}
    {"messages": [{"role": "user", "content": "..."}], "category": "chat"}

`category` defaults to "default" and `id` to "<file stem>-<line>"; ids are unique; roles are
system, user or assistant, and the last message is the user turn the model answers (earlier
turns are the conversation so far, sent through the chat template as they are).

A line may carry the structured output it asks for, `response_format` (OpenAI's and vLLM's
field), enforced as a grammar mask on p and q alike (workload.constraints decides which
prompts run under it):

    {"type": "json_schema", "schema": {...}}                         (also OpenAI's form:
    {"type": "json_schema", "json_schema": {"name": "...", "schema": {...}}})
    {"type": "regex", "pattern": "..."}
    {"type": "choice", "choices": ["yes", "no"]}

Errors name the file and the line."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from gate.constraints.interface import ResponseFormat, parse_response_format
from gate.core.errors import PolicyValueError
from gate.workloads.interface import Prompt, WorkloadSource
from gate.workloads.registry import SourceKind, register

KEYS = {"id", "category", "prompt", "messages", "response_format"}
ROLES = ("system", "user", "assistant")


class JsonlPrompts(WorkloadSource):
    """Prompts from the user's own JSONL file."""

    def __init__(self, path: Path, yaml_path: str = "workload.path"):
        self.path = path
        self.yaml_path = yaml_path
        self.lines: dict[str, int] = {}  # prompt id -> its line in the file (the last load)

    def _bad(self, line: int, message: str) -> PolicyValueError:
        return PolicyValueError(self.yaml_path, f"{self.path}:{line}: {message}")

    def load(self) -> list[Prompt]:
        try:
            text = self.path.read_text(encoding="utf-8-sig")  # a leading byte-order mark is fine
        except FileNotFoundError:
            raise PolicyValueError(self.yaml_path, f"prompt file not found: {self.path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise PolicyValueError(self.yaml_path, f"cannot read prompt file {self.path}: {e}") from None
        prompts = []
        seen: dict[str, int] = {}
        self.lines = {}
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise self._bad(n, f"not valid JSON: {e.msg}") from None
            if not isinstance(row, dict):
                raise self._bad(n, "each line must be a JSON object with 'prompt' or 'messages'")
            unknown = sorted(set(row) - KEYS)
            if unknown:
                close = difflib.get_close_matches(unknown[0], sorted(KEYS), n=1)
                raise self._bad(
                    n,
                    f"unknown key {unknown[0]!r}"
                    + (f"; did you mean {close[0]!r}?" if close else "")
                    + f" (keys: {', '.join(sorted(KEYS))})",
                )
            if ("prompt" in row) == ("messages" in row):
                raise self._bad(n, "give exactly one of 'prompt' (a string) or 'messages' (a list of {role, content})")
            if "prompt" in row:
                if not isinstance(row["prompt"], str) or not row["prompt"]:
                    raise self._bad(n, "'prompt' must be a non-empty string")
                messages = [{"role": "user", "content": row["prompt"]}]
            else:
                msgs = row["messages"]
                if (
                    not isinstance(msgs, list)
                    or not msgs
                    or not all(
                        isinstance(m, dict)
                        and set(m) == {"role", "content"}
                        and m["role"] in ROLES
                        and isinstance(m["content"], str)
                        for m in msgs
                    )
                ):
                    raise self._bad(
                        n,
                        f"'messages' must be a non-empty list of {{role, content}} with role one of {', '.join(ROLES)}",
                    )
                if msgs[-1]["role"] != "user":
                    raise self._bad(
                        n, f"the last message is the {msgs[-1]['role']}'s; it must be the user turn the model answers"
                    )
                messages = [{"role": m["role"], "content": m["content"]} for m in msgs]
            ident = str(row.get("id", f"{self.path.stem}-{n}"))
            if ident in seen:
                raise self._bad(n, f"id {ident!r} is used twice (first on line {seen[ident]})")
            seen[ident] = n
            fmt = self._format(n, row["response_format"]) if row.get("response_format") is not None else None
            prompts.append(Prompt(ident, str(row.get("category", "default")), messages, response_format=fmt))
        if not prompts:
            raise PolicyValueError(self.yaml_path, f"prompt file {self.path} holds no prompts")
        self.lines = dict(seen)
        return prompts

    def origin(self, prompt_id: str) -> str | None:
        """'file:line' of a prompt of the last load()."""
        n = self.lines.get(prompt_id)
        return f"{self.path}:{n}" if n is not None else None

    def _format(self, n: int, value: object) -> ResponseFormat:
        """Line `n`'s response_format as a ResponseFormat (its form, not whether the grammar
        engine compiles it: gate validate asks the engine). Raises PolicyValueError naming
        the file and line."""
        try:
            return parse_response_format(value)
        except ValueError as e:
            raise self._bad(n, f"response_format: {e}") from None


register(SourceKind("jsonl", JsonlPrompts, "your file", path="a JSONL file, relative to the policy file"))
