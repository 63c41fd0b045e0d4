"""A JSONL file of prompts, one JSON object a line:

    {"prompt": "text", "category": "qa", "id": "q1"}
    {"messages": [{"role": "user", "content": "..."}], "category": "chat"}

`category` defaults to "default" and `id` to "<file stem>-<line>". Errors name the line."""

from __future__ import annotations

import json
from pathlib import Path

from gate.errors import PolicyValueError
from gate.workloads.interface import Prompt, WorkloadSource


class JsonlPrompts(WorkloadSource):
    """Prompts from the user's own JSONL file."""

    def __init__(self, path: Path, yaml_path: str = "workload.path"):
        self.path = path
        self.yaml_path = yaml_path

    def _bad(self, line: int, message: str) -> PolicyValueError:
        return PolicyValueError(self.yaml_path, f"{self.path}:{line}: {message}")

    def load(self) -> list[Prompt]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PolicyValueError(self.yaml_path, f"prompt file not found: {self.path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise PolicyValueError(self.yaml_path, f"cannot read prompt file {self.path}: {e}") from None
        prompts = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise self._bad(n, f"not valid JSON: {e.msg}") from None
            if not isinstance(row, dict):
                raise self._bad(n, "each line must be a JSON object with 'prompt' or 'messages'")
            if isinstance(row.get("prompt"), str) and row["prompt"]:
                messages = [{"role": "user", "content": row["prompt"]}]
            elif isinstance(row.get("messages"), list) and row["messages"] and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in row["messages"]
            ):
                messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
            else:
                raise self._bad(n, "needs a non-empty 'prompt' string or a 'messages' list of {role, content}")
            prompts.append(Prompt(str(row.get("id", f"{self.path.stem}-{n}")), str(row.get("category", "default")), messages))
        if not prompts:
            raise PolicyValueError(self.yaml_path, f"prompt file {self.path} holds no prompts")
        return prompts
