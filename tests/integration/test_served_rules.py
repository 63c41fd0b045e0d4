"""The tests of tests/unit/test_served_rules.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations


import pytest

from conftest import write_policy
from gate.core.errors import InputError
from gate.policy.reader import load_policy
from unit.test_served_rules import served  # noqa: F401 - shared with that tier
from unit.test_served_rules import POLICY, SPEEDUP


@pytest.mark.parametrize("extra, rules, where, says", [
    ("", SPEEDUP, "rules[0].per", "per: concurrency needs load.concurrency"),
    ("load: {concurrency: [1, 2]}", SPEEDUP, "load", "load points apply to served runners"),
    ("runner: {kind: openai, endpoints: {fallback: {base_url: 'http://127.0.0.1:1'}}}", SPEEDUP, "runner.endpoints",
     "no endpoint for runner 'lookup'"),
    ("runner: {kind: llama_server}\nload: {concurrency: [1, 2]}",
     "  - {id: g, metric: goodput, aggregation: pooled, comparison: '>=', threshold: 1 requests/s}", "rules[0].metric",
     "goodput needs load.goodput"),
    ("runner: {kind: llama_server}", "  - {id: o, metric: overlap, comparison: '>=', threshold: 0.5}", "rules[0].metric",
     "needs gate's in-process loop"),
    ("runner: {kind: llama_server}\nload: {concurrency: [1, 2]}",
     "  - {id: s, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 1.0x, scope: {concurrency: [8]}}",
     "rules[0].scope.concurrency[0]", "8 is not a load point"),
])
def test_runner_and_load_sections_are_checked_at_their_yaml_path(tmp_path, tiny_model_dir, extra, rules, where, says):
    path = write_policy(tmp_path, POLICY.format(model=tiny_model_dir, extra=extra, rules=rules))
    with pytest.raises(InputError) as e:
        load_policy(path)
    text = str(e.value)
    assert where in text and says in text


def test_validate_warns_that_one_repetition_leaves_the_drift_between_windows_out(tmp_path, tiny_model_dir):
    from gate.rules.power import underpowered

    def warnings(extra: str) -> list[tuple[str, str]]:
        rules = SPEEDUP.replace(", per: concurrency", "")
        path = write_policy(tmp_path, POLICY.format(model=tiny_model_dir, extra=extra, rules=rules))
        return underpowered(load_policy(path).policy, ["qa"] * 16)

    served = "runner: {kind: llama_server}\nload: {concurrency: [1, 2]}\n"
    (w,) = [w for w in warnings(served + "measurement: {repetitions: 1}") if "drift" in w[1]]
    assert w[0] == "rules[0].metric" and "measurement.repetitions >= 2" in w[1]
    extreme = "  - {id: m, metric: tpot_ms, aggregation: max, relative_to: fallback, comparison: '<=', threshold: 1.0x}"
    path = write_policy(tmp_path, POLICY.format(model=tiny_model_dir, extra=served + "measurement: {repetitions: 1}",
                                                rules=extreme))
    assert not [w for w in underpowered(load_policy(path).policy, ["qa"] * 16) if "drift" in w[1]]  # no interval to leave it out of
    assert not [w for w in warnings(served + "measurement: {repetitions: 2}") if "drift" in w[1]]
    assert not [w for w in warnings("measurement: {repetitions: 1}") if "drift" in w[1]]  # in-process: cell by cell


