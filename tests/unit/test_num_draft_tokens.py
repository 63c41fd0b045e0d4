"""num_draft_tokens per load (num_draft_tokens_sweep, gate.analysis.schedule, rule kind
best_num_draft_tokens): the sweep's runners in the policy, the best K of stub servers whose
speed at each K is known, the schedule and the rule through `gate check`, and the in-process
runner sweeping K of a model draft."""

from __future__ import annotations


import pytest

from gate.analysis.schedule import schedule

# A stub per K: one event every itl_s carrying tokens_per_event tokens, 12 tokens per request, 20 ms to the first.
# E2E: fallback 20 + 11 x 8 = 108 ms; K=1 20 + 5 x 10 = 70 ms (1.54x); K=3 20 + 3 x 12 = 56 ms (1.93x);
# K=6 20 + 2 x 30 = 80 ms (1.35x). So the best K is 3, the declared one is 6. (K=6 was 2 x 20 ms, 1.80x: a
# stalled repetition of K=3 on a busy machine read 1.76x and made K=6 the best, 2026-12-06.)
SPEEDS = {"fallback": (1, 0.008), "fast.k1": (2, 0.010), "fast.k3": (3, 0.012), "fast": (4, 0.030)}
DRAFT = "{kind: prompt_lookup, max_ngram_size: 2, num_draft_tokens: 6, num_draft_tokens_sweep: [0, 1, 3, 6]}"


# 1.5x leaves K=3 (1.93x) a margin that one stalled request of 10 on a busy CI runner cannot close (at 1.7x, K=3 at
# concurrency 1 was left inconclusive by the project's CI on 2026-12-06); K=6 (1.35x) does not meet it; K=1 (1.54x)
# is no candidate
BEST_RULES = """\
  - {id: pays, kind: best_num_draft_tokens, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 1.5x,
     per: concurrency}
  - {id: pays-2.5x, kind: best_num_draft_tokens, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 2.5x,
     scope: {concurrency: [2]}}
"""


def test_ks_that_all_lose_to_the_fallback_schedule_speculation_off() -> None:
    """Records as gate.loop.run writes them (tests/{unit,integration}/test_served_rules.py): the draft d (K=4) at 0.7x at
    concurrency 1 and 1.3x at 4, and its sweep runner d.k2 the same requests at the same speed."""
    from dataclasses import replace

    from gate.records import DraftInfo
    from unit.test_served_rules import run

    m = run({1: 0.7, 4: 1.3})
    m.drafts["d.k2"] = DraftInfo("model", 2, "distribution", sweep_of="d")
    m.requests += [replace(r, draft="d.k2") for r in m.requests if r.draft == "d"]
    by_load = {c.value: c for c in schedule(m, max_spread=0.5)}
    assert by_load[1.0].best_k == 0 and "best K=0 (speculation off)" in by_load[1.0].message
    assert by_load[4.0].best_k in (2, 4) and by_load[4.0].cell(4).score == pytest.approx(1.3, rel=0.1)

    # a rule per request rate on a closed loop only: every K is "does not apply", so the rule is skipped there
    from gate.policy.model import RuleSpec
    from gate.rules.evaluate import Settings, evaluate

    rule = RuleSpec(id="best", kind="best_num_draft_tokens", metric="speedup", aggregation="pooled", comparison=">=",
                    threshold="1.0x", per="concurrency", scope={"drafts": ["d"]})
    m.drafts["d"] = replace(m.drafts["d"], swept=True)
    by_scope = {o.scope: o for o in evaluate([rule], m, Settings(load_points={"concurrency": (1, 4), "request_rate": (2.0,)}))}
    assert by_scope["d/greedy/concurrency=4"].status == "pass" and by_scope["d/greedy/concurrency=1"].status == "fail"
    assert by_scope["d/greedy/request_rate=2"].status == "skipped"


def test_a_problem_of_a_sweep_runner_is_placed_at_the_sweep() -> None:
    """A K llama.cpp's ngram-simple can never propose with (below max_ngram_size) is refused, and
    an error raised on a sweep runner's path names the sweep and the K."""
    from gate.drafts.prompt_lookup import PromptLookupDraftSpec, _llama_server
    from gate.core.errors import PolicyValueError
    from gate.policy.model import Policy, placed, sweep_path

    with pytest.raises(PolicyValueError, match="num_draft_tokens 2 would never propose") as e:
        _llama_server("lookup.k2", PromptLookupDraftSpec(kind="prompt_lookup", max_ngram_size=3, num_draft_tokens=2), None)
    policy = Policy.model_validate({"version": 1, "drafts": {"lookup": {"kind": "prompt_lookup", "num_draft_tokens": 4,
                                                                          "num_draft_tokens_sweep": [2, 8]}},
                                    "measurement": {"repetitions": 2},
                                    "rules": [{"id": "r", "metric": "speedup", "aggregation": "pooled", "comparison": ">=",
                                               "threshold": "1x"}]})
    assert sweep_path(policy, e.value.path, e.value.message) == (
        "drafts.lookup.num_draft_tokens_sweep", f"K=2 (runner lookup.k2): {e.value.message}")
    assert sweep_path(policy, "drafts.lookup.kind", "x") == ("drafts.lookup.kind", "x")
    # a problem of the draft that every K shares is reported once, at the draft
    assert placed(policy, [("drafts.lookup", "same"), ("drafts.lookup.k2", "same"), ("drafts.lookup.k8.kind", "other")]) == [
        ("drafts.lookup", "same"), ("drafts.lookup.num_draft_tokens_sweep", "K=8 (runner lookup.k8): other")]
