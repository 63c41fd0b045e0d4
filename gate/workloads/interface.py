"""Where prompts come from. Each source is one module with a `load()` returning Prompts."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Prompt:
    """One request's input: chat messages ([{"role", "content"}]) and its category."""

    id: str
    category: str
    messages: list[dict[str, str]] = field(default_factory=list)


class WorkloadSource(ABC):
    """A prompt source. Raises PolicyValueError (at the policy's workload path) for missing
    packages or files, naming the install command or the file and line."""

    @abstractmethod
    def load(self) -> list[Prompt]:
        """Every prompt the source has, in its own order."""


def select(prompts: list[Prompt], seed: int, per_category: int | None, num_prompts: int | None,
           categories: list[str] | None) -> list[Prompt]:
    """A seeded, reproducible choice: shuffle with `seed`, keep `categories`, take up to
    `per_category` of each category (in category order of first appearance), then up to
    `num_prompts` in all."""
    pool = [p for p in prompts if categories is None or p.category in categories]
    rng = random.Random(seed)
    order = list(range(len(pool)))
    rng.shuffle(order)
    shuffled = [pool[i] for i in order]
    if per_category is not None:
        taken: dict[str, list[Prompt]] = {}
        for p in shuffled:
            bucket = taken.setdefault(p.category, [])
            if len(bucket) < per_category:
                bucket.append(p)
        cats = list(dict.fromkeys(p.category for p in pool))
        shuffled = [p for c in cats for p in taken.get(c, [])]
    return shuffled[:num_prompts] if num_prompts is not None else shuffled
