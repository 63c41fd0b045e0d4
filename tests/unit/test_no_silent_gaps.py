"""No silent gaps (issue 23): every declared load point gets a verdict or says why not, and a
missing acceptance measurement says why it is missing.

- A rule with `per: concurrency` on a policy that also declares request rates gives those
  points a skipped outcome saying it does not apply there, and `gate validate` warns at the
  rule's YAML path and line (and `per: request_rate` at concurrencies, the same way).
- A prompt-lookup runner whose server never proposed (counters that never move, draft_n 0)
  reads "no proposal: the server made no draft proposal at ...", not "measurement missing".
Against the stub server (tests/served_stub.py), as tests/integration/test_served_check.py does.
"""

from __future__ import annotations



from gate.records import DraftInfo, Environment, Measurements, RequestRecord, RunRecord, OfferedLoad, SpecDecodeCounters
from gate.rules.evaluate import Settings, evaluate
from gate.rules.status import Status

STATIC_METRICS = """\
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 7
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 28
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 20
"""


PER_CONCURRENCY = "  - {id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 1.0x, per: concurrency}\n"
PER_RATE = "  - {id: ttft, metric: ttft_ms, aggregation: mean, comparison: '<=', threshold: 10 s, per: request_rate}\n"
ACCEPTANCE = ("  - {id: acceptance, metric: acceptance_rate, aggregation: pooled, comparison: '>=', threshold: 0.1, "
              "per: concurrency}\n")


def _env() -> Environment:
    return Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0, cpu_count=2)


def _served(draft_tokens: int | None, window_tokens: int | None) -> Measurements:
    """Five served requests of a lookup draft at concurrency 2, with the server's per-response
    draft count `draft_tokens` and a window whose counter delta is `window_tokens` (None: not recorded)."""
    m = Measurements(environment=_env(), laws=["greedy"], drafts={"lookup": DraftInfo("prompt_lookup", 3, "point_mass")})
    for i in range(5):
        m.requests.append(RequestRecord("lookup", "greedy", f"p{i}", "qa", 4, 0, 5, [10, 11, 12, 13], [5.0, 6.0, 7.0, 8.0],
                                        None, None, None, "length", 8.0, 3, None, None, None, concurrency=2,
                                        server_draft_tokens=draft_tokens,
                                        server_accepted_tokens=None if draft_tokens is None else 0))
    w = RunRecord("lookup", "greedy", 0.0, 1.0, OfferedLoad("concurrency", 2), 5, 0.04, 20, repetition=0)
    if window_tokens is not None:
        w.counters = SpecDecodeCounters(num_drafts=0, num_draft_tokens=window_tokens, num_accepted_tokens=0,
                                        num_accepted_tokens_per_pos=[], num_committed_tokens=0)
    m.runs.append(w)
    return m


def test_missing_stays_missing_where_nothing_was_counted():
    from gate.policy.model import RuleSpec

    rule = RuleSpec(id="a", metric="acceptance_rate", aggregation="pooled", comparison=">=", threshold=0.1)
    (o,) = evaluate([rule], _served(None, None), Settings())
    assert o.status == Status.ERROR and "measurement missing (no sample was measured for this scope)" in o.message
    (o,) = evaluate([rule], _served(None, 0), Settings())  # the window's counters moved by 0
    assert o.status == Status.ERROR and "no proposal: the server made no draft proposal at concurrency 2 (0 draft " \
        "tokens over 5 requests" in o.message
    (o,) = evaluate([rule], _served(0, None), Settings())  # the per-response counts say 0
    assert "no proposal" in o.message
    mean = RuleSpec(id="m", metric="mean_acceptance_length", aggregation="pooled", comparison=">=", threshold="1.5 tokens")
    (o,) = evaluate([mean], _served(None, 0), Settings())
    assert "no proposal: the server made no draft proposal at concurrency 2" in o.message


def test_an_engine_that_counts_only_steps_is_not_called_silent():
    """SGLang's counters give verification steps, not proposed tokens (num_draft_tokens 0): steps
    that moved mean the server proposed, so its undefined acceptance rate is missing, not 'no proposal'."""
    from gate.policy.model import RuleSpec

    m = _served(None, 0)
    m.runs[0].counters.num_drafts = 7
    rule = RuleSpec(id="a", metric="acceptance_rate", aggregation="pooled", comparison=">=", threshold=0.1)
    (o,) = evaluate([rule], m, Settings())
    assert "no proposal" not in o.message and "measurement missing" in o.message


def test_an_in_process_lookup_draft_without_proposals_says_so():
    from gate.policy.model import RuleSpec

    m = Measurements(environment=_env(), laws=["greedy"], drafts={"lookup": DraftInfo("prompt_lookup", 3, "point_mass")})
    for i in range(5):
        m.requests.append(RequestRecord("lookup", "greedy", f"p{i}", "qa", 4, 0, 5, [10, 11, 12, 13], [5.0, 6.0, 7.0, 8.0],
                                        [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0], "length", 8.0, 3, None, None, None))
    rule = RuleSpec(id="a", metric="acceptance_rate", aggregation="pooled", comparison=">=", threshold=0.1)
    (o,) = evaluate([rule], m, Settings())
    assert o.status == Status.ERROR
    assert o.message == ("acceptance_rate (pooled): no proposal: draft lookup made no proposal (0 draft tokens over 5 "
                         "requests: prompt lookup found no n-gram to copy) vs threshold >= 0.100")
