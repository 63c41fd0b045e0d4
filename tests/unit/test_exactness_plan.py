"""What exactness rules ask of the next-token samples, merged per draft and law
(gate.plan.matrix.samples_asked, plan_exactness): a number, 0 (no next-token test) or auto
(gate chooses), the same in process and served."""

from __future__ import annotations

from types import SimpleNamespace

from gate.plan.matrix import AUTO, plan_exactness, samples_asked


def test_the_largest_number_wins_and_auto_outweighs_asking_for_none():
    assert samples_asked([300, 1500]) == 1500
    assert samples_asked([0, AUTO]) is AUTO  # one rule needs a decisive test: gate chooses
    assert samples_asked([AUTO, 800]) == 800  # a number asked is what is drawn
    assert samples_asked([0, 0]) == 0 and samples_asked([AUTO]) is AUTO


def test_the_plan_merges_the_rules_of_each_draft_and_law():
    def rule(samples, laws=None):
        return SimpleNamespace(kind="exactness", level="error", next_token_samples=samples, next_token_prompts=1,
                               detect_tv=0.1, power=0.9, significance=0.01,
                               scope=SimpleNamespace(drafts=None, laws=laws))

    plan = plan_exactness([rule("auto"), rule(0, ["t1"]), rule(200, ["t2"])], ["d"], ["t1", "t2", "t3"])
    assert plan.next_token_samples == {("d", "t1"): AUTO, ("d", "t2"): 200, ("d", "t3"): AUTO}
    assert plan_exactness([rule(0)], ["d"], ["t1"]).next_token_samples == {("d", "t1"): 0}
