"""Rule kind 'exactness': speculative output follows the target's declared law (greedy:
token equality with the fallback; sampling: PIT and next-token tests with Holm correction
and a stated power). The tests themselves are gate.exactness.verdict."""

from __future__ import annotations

from typing import Any

from gate.exactness.verdict import evaluate_exactness
from gate.records import Measurements
from gate.rules.kinds.interface import RuleKind, Settings
from gate.rules.outcome import Outcome


class ExactnessRules(RuleKind):
    """An exactness rule takes the tests' settings and a scope of drafts and laws, no metric."""

    name = "exactness"
    keys = (
        "kind",
        "significance",
        "power",
        "detect_tv",
        "tie_tolerance",
        "reference_tolerance",
        "next_token_samples",
        "next_token_prompts",
        "scope",
        "level",
    )
    needs_exactness = True

    def spec_problem(self, rule: Any) -> tuple[str, str] | None:
        for key in ("metric", "comparison", "threshold", "relative_to", "line", "position"):
            if getattr(rule, key) is not None:
                return key, f"an exactness rule takes no {key}: it tests the declared law itself"
        if "aggregation" in rule.model_fields_set:
            return "aggregation", "an exactness rule takes no aggregation: it decides on its statistical tests"
        if rule.scope.categories or rule.scope.constraints or rule.per:
            return (
                "per" if rule.per else "scope"
            ), "an exactness rule covers every prompt; scope it by drafts and laws only"
        return None

    def evaluate(
        self, rule: Any, m: Measurements, drafts: list[str], laws: list[str], settings: Settings
    ) -> list[Outcome]:
        return evaluate_exactness(rule, m, drafts, laws)


KIND = ExactnessRules()
