"""Per-position acceptance (position_acceptance_rate, conditional_acceptance_rate at
rules[].position): the step counts they rest on, their value on gate's own per-request
counters and on a server's window counters, and the policy errors around `position`. The
collapsed-position draft run through gate check is in tests/integration/test_position_acceptance.py."""

from __future__ import annotations

import pytest

from gate.policy.model import RuleSpec
from gate.records import DraftInfo, Environment, Measurements, OfferedLoad, RequestRecord, RunRecord, SpecDecodeCounters
from gate.rules.evaluate import Settings, evaluate
from gate.rules.status import Status


def env() -> Environment:
    return Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0)


def rule(metric: str, position: int, threshold: float) -> RuleSpec:
    return RuleSpec(id="r", metric=metric, position=position, aggregation="pooled", comparison=">=",
                    threshold=threshold)


def test_the_step_counts_know_each_steps_k_where_vllms_rate_does_not() -> None:
    # four steps proposing 3, 3, 2 and 1 tokens (K varies: the end of an output, an adaptive draft)
    c = SpecDecodeCounters.from_steps([3, 3, 2, 1], [3, 1, 2, 0])
    assert c.num_accepted_tokens_per_pos == [3, 2, 1]
    assert c.num_draft_tokens_per_pos == [4, 3, 2]  # steps that proposed position i
    assert c.num_verified_per_pos == [4, 3, 1]  # steps whose position i was reached (every earlier one committed)
    assert c.acceptance_rate_per_pos == [0.75, 0.5, 0.25]  # vLLM's: over every step, low where K varies
    both = c + c
    assert both.num_draft_tokens_per_pos == [8, 6, 4] and both.num_verified_per_pos == [8, 6, 2]


def requests(accepted: list[list[int]], proposed: int = 3) -> Measurements:
    """One request per entry of `accepted` (its steps' accepted counts, each step proposing `proposed`)."""
    m = Measurements(environment=env(), laws=["greedy"], drafts={"d": DraftInfo("model", proposed, "distribution")})
    for i, steps in enumerate(accepted):
        n = sum(a + 1 for a in steps)
        m.requests.append(RequestRecord("d", "greedy", f"p{i}", "qa", n, 0, 10, list(range(n)),
                                        [float(t + 1) for t in range(n)], [a + 1 for a in steps],
                                        [proposed] * len(steps), steps, "length", float(n), 4, 20, 1000, 500))
    return m


def test_in_process_each_request_is_a_unit_and_the_conditional_rate_reads_past_earlier_losses() -> None:
    # position 1 always accepted; position 2 in one step of four; position 3 whenever position 2 was
    m = requests([[1, 1, 1, 3], [1, 3, 1, 1], [3, 1, 1, 1], [1, 1, 3, 1], [1, 1, 1, 3]])
    (p1,) = evaluate([rule("position_acceptance_rate", 1, 0.4)], m, Settings())
    (p2,) = evaluate([rule("position_acceptance_rate", 2, 0.5)], m, Settings())
    (c3,) = evaluate([rule("conditional_acceptance_rate", 3, 0.4)], m, Settings())
    # every request at 1: no bootstrap spread, Clopper-Pearson over 5 requests as trials, 0.025^(1/5) = 0.478 at 95%
    assert p1.measured == 1.0 and p1.status == Status.PASS and p1.interval.low == pytest.approx(0.025 ** 0.2)
    assert p2.measured == pytest.approx(0.25) and p2.status == Status.FAIL and p2.interval.units == 5
    assert "position_acceptance_rate at position 2 (pooled)" in p2.message
    # position 3 is committed in every step that reached it: 1.0 given position 2, 0.25 unconditionally
    assert c3.measured == 1.0 and c3.status == Status.PASS
    (p3,) = evaluate([rule("position_acceptance_rate", 3, 0.5)], m, Settings())
    assert p3.measured == pytest.approx(0.25)


def served(per_pos: list[list[int]], drafts: int = 40) -> Measurements:
    """A served draft at concurrency 4: five requests without per-step counts and one window per
    entry of `per_pos`, whose vLLM counter deltas accepted per position those counts of `drafts` steps."""
    m = Measurements(environment=env(), laws=["greedy"], drafts={"d": DraftInfo("model", 3, "distribution")})
    for i in range(5):
        m.requests.append(RequestRecord("d", "greedy", f"p{i}", "qa", 4, 0, 5, [10, 11, 12, 13], [5.0, 6.0, 7.0, 8.0],
                                        None, None, None, "length", 8.0, 3, None, None, None, concurrency=4))
    for rep, pos in enumerate(per_pos):
        counters = SpecDecodeCounters(num_drafts=drafts, num_draft_tokens=3 * drafts, num_accepted_tokens=sum(pos),
                                      num_accepted_tokens_per_pos=pos)
        m.runs.append(RunRecord("d", "greedy", 0.0, 1.0, OfferedLoad("concurrency", 4), 5, 0.5, 20,
                                counters=counters, repetition=rep))
    return m


def test_served_the_windows_counters_are_the_units_and_their_denominator_is_vllms() -> None:
    m = served([[38, 8, 2], [36, 9, 3], [39, 10, 1], [37, 7, 2], [38, 8, 2]])
    (p1,) = evaluate([rule("position_acceptance_rate", 1, 0.8)], m, Settings())
    (p2,) = evaluate([rule("position_acceptance_rate", 2, 0.5)], m, Settings())
    (c2,) = evaluate([rule("conditional_acceptance_rate", 2, 0.5)], m, Settings())
    assert p1.measured == pytest.approx(188 / 200) and p1.status == Status.PASS and p1.interval.units == 5
    assert p2.measured == pytest.approx(42 / 200) and p2.status == Status.FAIL
    # given position 1, from the server's counters: committed at 2 over committed at 1
    assert c2.measured == pytest.approx(42 / 188) and c2.status == Status.FAIL


@pytest.mark.parametrize(
    ("text", "path", "says"),
    [
        ("metric: position_acceptance_rate, aggregation: pooled", "rules[0].position", "need a position"),
        ("metric: acceptance_rate, position: 2, aggregation: pooled", "rules[0].position", "only they take one"),
        ("metric: position_acceptance_rate, position: 5, aggregation: pooled", "rules[0].position",
         "beyond what d (num_draft_tokens 4) proposes per step"),
    ],
)
def test_a_position_where_it_does_not_belong_is_one_error_at_its_yaml_path(tmp_path, text: str, path: str,
                                                                          says: str) -> None:
    from gate.core.errors import InputError
    from gate.policy.reader import load_policy

    policy = tmp_path / "p.yaml"
    policy.write_text(f"""\
version: 1
target: {{model: target-dir}}
drafts:
  d: {{kind: prompt_lookup, num_draft_tokens: 4}}
workload: {{source: jsonl, path: prompts.jsonl}}
rules:
  - {{id: r, {text}, comparison: '>=', threshold: 0.5}}
""")
    with pytest.raises(InputError) as e:
        load_policy(policy)
    shown = str(e.value)
    assert path in shown and says in shown, shown


def test_vllms_per_request_metrics_are_read_from_the_final_usage_chunk() -> None:
    from gate.runners.client.parse import parse_completions

    sd = {"num_spec_steps": 3, "num_draft_tokens": 9, "num_accepted_draft_tokens": 4, "acceptance_histogram": [1, 0, 1, 1],
          "mean_acceptance_length": 2.33, "draft_acceptance_rate": 0.44, "num_spec_tokens": 3}
    ev = parse_completions({"choices": [], "usage": {"completion_tokens": 7}, "metrics": {"speculative_decoding": sd}}, 5.0)
    assert (ev.draft_n, ev.draft_n_accepted, ev.step_drafted) == (9, 4, None)  # summary: the totals only
    detailed = {**sd, "per_step_drafted": [3, 3, 3], "per_step_accepted": [3, 0, 1]}
    ev = parse_completions({"choices": [], "metrics": {"speculative_decoding": detailed}}, 5.0)
    assert ev.step_drafted == [3, 3, 3] and ev.step_accepted == [3, 0, 1]
    # the request's counters then come from the server's steps (each commits its accepted proposals plus one)
    r = RequestRecord("d", "greedy", "p", "qa", 7, 0, 5, list(range(7)), [1.0] * 7, None, None, None, "length", 7.0,
                      3, None, None, None, server_step_proposed=[3, 3, 3], server_step_accepted=[3, 0, 1])
    assert r.counters.num_accepted_tokens_per_pos == [2, 1, 1] and r.counters.num_committed_tokens == 7
    with pytest.raises(ValueError, match="differ in length"):
        parse_completions({"choices": [], "metrics": {"speculative_decoding": {
            "per_step_drafted": [3, 3], "per_step_accepted": [1]}}}, 5.0)


def test_a_position_no_step_reached_is_an_error_saying_so() -> None:
    m = requests([[1, 0, 1, 0], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 1], [1, 1, 1, 1]])  # never past position 2
    (o,) = evaluate([rule("conditional_acceptance_rate", 3, 0.5)], m, Settings())
    assert o.status == Status.ERROR
    assert "position not reached: no step of 5 requests committed every proposal before position 3" in o.message
