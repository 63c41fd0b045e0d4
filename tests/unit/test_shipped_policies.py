"""Every shipped policy can decide: the reference policies under policies/ validate with no
warning, and every error-level rule of every example can reach a verdict on its plan (an
interval can be formed, a percentile can pass, enough windows are measured). Warn-level
rules of the examples may stay small where their description says why."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gate.cli import cli
from gate.plan.matrix import workload_source
from gate.policy.reader import load_policy
from gate.rules.power import underpowered
from gate.workloads.interface import choose

ROOT = Path(__file__).resolve().parents[2]
POLICIES = sorted((ROOT / "policies").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*/*.yaml"))


def test_there_are_policies_and_examples_to_check():
    assert len(POLICIES) >= 2 and len(EXAMPLES) >= 10


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.name)
def test_a_reference_policy_validates_without_a_warning(path: Path) -> None:
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output, result.output


def planned_categories(path: Path) -> list[str]:
    """The category of every prompt the example's workload selects (its seeded choice, as
    gate.plan.matrix.build_workload makes it; no tokenizer, so no ShareGPT length filter)."""
    loaded = load_policy(path)
    w = loaded.policy.workload
    chosen = choose(workload_source(loaded).load(), w.seed, w.per_category, w.num_prompts, w.categories)
    return [p.category for p in chosen.prompts]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_error_level_rule_of_an_example_can_reach_a_verdict(path: Path) -> None:
    policy = load_policy(path).policy
    shortfalls = [s for s in underpowered(policy, planned_categories(path)) if s.undecidable]
    stuck = [f"{s.path}: {s.message}" for s in shortfalls if policy.rules[s.rule].level == "error"]
    assert not stuck, stuck
    unexplained = [policy.rules[s.rule].id for s in shortfalls if not policy.rules[s.rule].description]
    assert not unexplained, f"warn-level rules that cannot decide on the plan must say why: {unexplained}"


def test_the_audit_policy_decides_overlap_in_every_category() -> None:
    """The reference audit's overlap-per-category rule had 2 continuations per category: every
    category was inconclusive, so a draft that met every rule still exited 3."""
    path = ROOT / "policies" / "quantized-draft-audit.yaml"
    categories = planned_categories(path)
    assert min(categories.count(c) for c in set(categories)) >= 10
    assert not underpowered(load_policy(path).policy, categories)
