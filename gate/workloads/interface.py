"""Where prompts come from. Each source is one module with a `load()` returning Prompts;
`choose` makes the seeded selection (with an optional lazy filter, e.g. ShareGPT's length
limits) and gate.workloads.context builds context-length sweeps from the same text."""

from __future__ import annotations

import importlib.util
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate.constraints.interface import ResponseFormat


@dataclass(frozen=True)
class Prompt:
    """One request's input: chat messages ([{"role", "content"}], ending with the turn to
    answer) and its category. `reply` is a real answer to it where the source has one
    (ShareGPT's gpt turn, MT-bench's reference answer, HumanEval's canonical solution):
    ShareGPT's output-length filter measures it, and context sweeps use it as the
    assistant turn when the prompt serves as history. `response_format`: the structured
    output the prompt asks for (a JSONL line's response_format), None for free text."""

    id: str
    category: str
    messages: list[dict[str, str]] = field(default_factory=list)
    reply: str | None = None
    response_format: ResponseFormat | None = None


def packaged_file(module: str, relative: Path) -> Path | None:
    """A data file an installed package ships (`relative` inside the package `module`), or
    None when the package or the file is not there. Nothing is downloaded."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / relative
        if candidate.is_file():
            return candidate
    return None


class WorkloadSource(ABC):
    """A prompt source. Raises PolicyValueError (at the policy's workload path) for missing
    packages or files, naming the install command or the file and line.

    `length_filtered`: True when the source supports workload.length_filter (vLLM's pruning
    of prompt and reference-output lengths, gate.workloads.sharegpt.length_filter)."""

    length_filtered: bool = False

    def acceptor(self, tokenizer: Any, limits: dict[str, int]) -> Callable[[Prompt], str | None] | None:
        """The candidate filter of workload.length_filter (`limits`: its fields, in target
        tokens) for a length-filtered source: prompt -> None to keep it, else the reason it
        is pruned. None for a source without one (the default)."""
        return None

    @abstractmethod
    def load(self) -> list[Prompt]:
        """Every prompt the source has, in its own order."""

    def skipped(self) -> dict[str, int]:
        """Records of the source's data that the last load() left out, by reason."""
        return {}

    def notes(self) -> list[str]:
        """What the last load() found worth reporting about the data itself."""
        return []

    def origin(self, prompt_id: str) -> str | None:
        """Where the last load() read a prompt ('file:line'), for messages about its own
        fields (a response_format the grammar engine refuses); None when the source cannot say."""
        return None


Accept = Callable[[Prompt], "str | None"]  # None keeps a candidate; else the reason it is pruned


@dataclass
class Selection:
    """The chosen prompts, and what a lazy filter did: `examined` candidates it ran on,
    `pruned` of them by reason."""

    prompts: list[Prompt]
    examined: int = 0
    pruned: dict[str, int] = field(default_factory=dict)


def choose(
    prompts: list[Prompt],
    seed: int,
    per_category: int | None,
    num_prompts: int | None,
    categories: list[str] | None,
    accept: Accept | None = None,
) -> Selection:
    """A seeded, reproducible choice: shuffle with `seed` (random.Random(seed).shuffle, as
    vLLM's benchmark shuffles its datasets), keep `categories`, take up to `per_category`
    of each category (in category order of first appearance), then up to `num_prompts`.

    `accept` runs on candidates in shuffled order only until the selection is full, so an
    expensive test (tokenizing) touches only the candidates needed."""
    pool = [p for p in prompts if categories is None or p.category in categories]
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    cats = list(dict.fromkeys(p.category for p in pool))
    taken: dict[str, list[Prompt]] = {c: [] for c in cats}
    chosen: list[Prompt] = []
    out = Selection([])
    for i in order:
        p = pool[i]
        if per_category is not None:
            if len(taken[p.category]) >= per_category:
                continue
        elif num_prompts is not None and len(chosen) >= num_prompts:
            break
        if accept is not None:
            out.examined += 1
            reason = accept(p)
            if reason is not None:
                out.pruned[reason] = out.pruned.get(reason, 0) + 1
                continue
        taken[p.category].append(p)
        chosen.append(p)
        if per_category is not None and all(len(v) >= per_category for v in taken.values()):
            break
    if per_category is not None:
        chosen = [p for c in cats for p in taken[c]]
    out.prompts = chosen[:num_prompts] if num_prompts is not None else chosen
    return out


def select(
    prompts: list[Prompt], seed: int, per_category: int | None, num_prompts: int | None, categories: list[str] | None
) -> list[Prompt]:
    """choose() without a filter: just the prompts."""
    return choose(prompts, seed, per_category, num_prompts, categories).prompts
