"""What exactness rules ask of the next-token samples, merged per draft and law
(gate.plan.matrix.Asked, samples_asked, plan_exactness): a number, 0 (no next-token test) or
auto (gate chooses), the same in process and served; every rule gets at least what it asked."""

from __future__ import annotations

from types import SimpleNamespace

from gate.plan.matrix import Asked, plan_exactness, samples_asked


def test_every_rule_gets_at_least_what_it_asked():
    assert samples_asked([Asked(300), Asked(1500)]) == Asked(1500)
    assert samples_asked([Asked(0), Asked.of("auto")]) == Asked(0, True)  # one rule needs a decisive test
    # a fixed number beside auto: the larger of the number and gate's plan (the auto rule keeps its power)
    both = samples_asked([Asked.of("auto"), Asked.of(800)])
    assert both == Asked(800, True) and both.draw(lambda: 460) == 800 and both.draw(lambda: 2015) == 2015
    assert samples_asked([Asked(0), Asked(0)]).none and not Asked.of("auto").none
    assert Asked(30).draw(lambda: 1 / 0) == 30  # a fixed count never plans


def test_the_plan_merges_the_rules_of_each_draft_and_law():
    def rule(samples, laws=None):
        return SimpleNamespace(kind="exactness", level="error", next_token_samples=samples, next_token_prompts=1,
                               detect_tv=0.1, power=0.9, significance=0.01,
                               scope=SimpleNamespace(drafts=None, laws=laws))

    plan = plan_exactness([rule("auto"), rule(0, ["t1"]), rule(200, ["t2"])], ["d"], ["t1", "t2", "t3"])
    assert plan.next_token_samples == {("d", "t1"): Asked(0, True), ("d", "t2"): Asked(200, True),
                                       ("d", "t3"): Asked(0, True)}
    assert plan_exactness([rule(0)], ["d"], ["t1"]).next_token_samples == {("d", "t1"): Asked(0)}
