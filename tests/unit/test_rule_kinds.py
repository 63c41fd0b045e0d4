"""Rule kinds come from gate.rules.kinds.registry: the policy's `kind:` values and schema
enum, each kind's spec checks and its evaluation; a toy kind registered from this file is
parsed by the policy and evaluated by gate.rules.evaluate like a built-in one."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import write_policy

from gate.core.errors import InputError
from gate.policy.reader import load_policy
from gate.policy.model import RuleSpec
from gate.policy.schema import policy_schema
from gate.records import DraftInfo, Environment, Measurements, RequestRecord
from gate.rules.evaluate import Settings, evaluate
from gate.rules.kinds import registry as rule_kinds
from gate.rules.kinds.interface import RuleKind
from gate.rules.outcome import Outcome
from gate.rules.status import Status

BASE = "version: 1\ndrafts:\n  lookup: {kind: prompt_lookup}\nrules:\n"


class MinRequests(RuleKind):
    """Toy kind: passes when the draft finished at least `threshold` requests under the law."""

    name = "min_requests"
    keys = ("kind", "threshold", "scope", "level")

    def spec_problem(self, rule: Any) -> tuple[str, str] | None:
        if rule.threshold is None:
            return "threshold", "a min_requests rule needs a threshold (a number of requests)"
        return None

    def evaluate(self, rule: Any, m: Measurements, drafts: list[str], laws: list[str], settings: Settings) -> list[Outcome]:
        out = []
        for d in drafts:
            for law in laws:
                n = sum(1 for r in m.requests if r.draft == d and r.law == law)
                status = Status.PASS if n >= rule.threshold_value else Status.FAIL
                out.append(Outcome(rule.id, f"{d}/{law}", d, law, "requests", "count", ">=", rule.threshold_value, None,
                                   rule.level, status, float(n), n, None, f"{n} requests vs >= {rule.threshold_value:g}: {status}"))
        return out


@pytest.fixture
def toy():
    kind = rule_kinds.register(MinRequests())
    yield kind
    rule_kinds.unregister(kind.name)


def _measurements(requests: int) -> Measurements:
    m = Measurements(environment=Environment("3.11", "2.x", "5.x", "0.1.0", "linux", "cpu", "cpu", 0), laws=["greedy"])
    m.drafts = {"lookup": DraftInfo("prompt_lookup")}
    m.requests = [RequestRecord("lookup", "greedy", f"p{i}", "qa", 1, 0, 1, [0], [1.0], [1], [0], [0], "length", 1.0, 1, 1, 1, 1)
                  for i in range(requests)]
    return m


def test_the_builtin_kinds_are_registered_in_schema_order():
    assert rule_kinds.names() == ["metric", "exactness", "envelope", "best_num_draft_tokens"]
    assert rule_kinds.get("metric").reads_metric and not rule_kinds.get("metric").needs_exactness
    assert rule_kinds.get("exactness").needs_exactness and not rule_kinds.get("exactness").reads_metric
    assert not rule_kinds.get("envelope").needs_exactness and not rule_kinds.get("envelope").reads_metric
    assert policy_schema()["$defs"]["RuleSpec"]["properties"]["kind"]["enum"] == rule_kinds.names()
    with pytest.raises(KeyError, match="unknown rule kind 'exactnes'; known: metric, exactness, envelope, best_num_draft_tokens .did you mean 'exactness'"):
        rule_kinds.get("exactnes")


def test_an_unknown_kind_reads_like_a_literal_error(tmp_path):
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, BASE + "  - {id: r, kind: exactnes}\n"))
    problem = info.value.problems[0]
    assert problem.path == "rules[0].kind"
    assert problem.message == "Input should be 'metric', 'exactness', 'envelope' or 'best_num_draft_tokens', got 'exactnes' (did you mean 'exactness'?)"


def test_a_registered_kind_is_parsed_checked_and_evaluated(tmp_path, toy):
    loaded = load_policy(write_policy(tmp_path, BASE + "  - {id: enough, kind: min_requests, threshold: 3}\n"))
    (rule,) = loaded.policy.rules
    assert rule.kind == "min_requests"
    assert "min_requests" in policy_schema()["$defs"]["RuleSpec"]["properties"]["kind"]["enum"]
    assert [o.status for o in evaluate([rule], _measurements(3), Settings())] == [Status.PASS]
    (short,) = evaluate([rule], _measurements(2), Settings())
    assert short.status == Status.FAIL and short.scope == "lookup/greedy" and short.message == "2 requests vs >= 3: fail"
    with pytest.raises(InputError) as info:
        load_policy(write_policy(tmp_path, BASE + "  - {id: enough, kind: min_requests}\n"))
    assert info.value.problems[0].path == "rules[0].threshold"
    assert "needs a threshold" in info.value.problems[0].message


def test_a_kind_name_is_registered_once(toy):
    with pytest.raises(ValueError, match="rule kind 'min_requests' is already registered"):
        rule_kinds.register(MinRequests())
    assert RuleSpec(id="x", kind="exactness").kind == "exactness"
