"""Did a draft runner speculate (gate.measure.speculation)? The floor each draft kind's outputs
imply, the status of a cell, and what rules make of it: a draft endpoint that serves without
speculation decides nothing (every outcome of it there is an error naming the cause), while
prompt lookup with nothing to copy keeps its measured verdicts and says so."""

from __future__ import annotations


import pytest

from gate.measure import speculation
from gate.measure.speculation import copyable_positions, every_step, lookup_floor
from gate.policy.model import RuleSpec
from gate.records import (DID_NOT_SPECULATE, DraftInfo, Environment, Measurements, OfferedLoad, RequestRecord, RunRecord,
                          SpecDecodeCounters, SpeculationStatus)
from gate.rules.evaluate import evaluate
from gate.rules.kinds.interface import Settings

CYCLE = [10, 11, 12] * 4  # a lookup of 2-grams copies from position 5 on (12, 10, 11 follow the first 10, 11)


def test_copyable_positions_count_only_matches_with_the_continuation_inside_the_output():
    assert copyable_positions(list(range(20)), 2, 3) == 0
    # (10, 11) at 0 has 3 tokens after it inside output[:5]: positions 5..11 each end an earlier 2-gram with 3 to copy
    assert copyable_positions(CYCLE, 2, 3) == 7
    assert copyable_positions(CYCLE, 2, 1) == 7  # the first repeated 2-gram ends at 5 either way
    assert copyable_positions(CYCLE, 4, 3) == 5  # (10, 11, 12, 10) at 0, 3 tokens after it by position 7
    assert copyable_positions([5, 5, 5, 5, 5], 1, 1) == 3  # (5) at 0, 1 token after it, from position 2 on


def test_a_short_loop_is_not_copyable_for_an_engine_that_copies_from_the_nearest_match():
    """llama.cpp's ngram-simple copies from the nearest earlier match and proposes nothing when
    fewer than n tokens follow it: on a loop of period <= n it never drafts. The floor counts a
    position only where the nearest match leaves max(K, n) tokens to copy (a helper's false
    alarm on a server that did speculate: outputs like 'yes, yes, yes, ...')."""
    period2 = [7, 8] * 16
    assert copyable_positions(period2, 3, 4) == 0 and lookup_floor(3, 4).steps(period2) == 0
    period5 = [1, 2, 3, 4, 5] * 6
    assert copyable_positions(period5, 3, 4) == len(period5) - 8  # from position 8: (1, 2, 3) at 0, 5 tokens after it
    assert copyable_positions(period5, 3, 6) == 0  # the nearest match has only 5 tokens after it


def test_without_token_ids_the_lookup_floor_is_unknown_and_nothing_is_claimed():
    from gate.records import UNKNOWN_ID

    unknown = [UNKNOWN_ID] * 12  # an api that returns counts only: a constant sequence would look copyable
    assert lookup_floor(2, 3).steps(unknown) is None
    assert every_step(3).steps(unknown) == 1  # a model draft's floor needs only the length
    m = _cell([unknown] * 5, [0] * 5)
    (rec,) = speculation.check(m, {"lookup": lookup_floor(2, 3)})
    assert rec.status == SpeculationStatus.NOT_COUNTED and rec.floor_steps is None
    assert "its output token ids did not come back" in rec.describe()


def test_each_kind_states_its_floor():
    assert every_step(3).steps([1] * 12) == 11 // 4 - 1
    assert every_step(3).steps([1]) == 0
    assert lookup_floor(2, 3).steps(CYCLE) == 2  # 7 positions, a step covers at most 4
    assert lookup_floor(2, 3).steps(list(range(12))) == 0
    from gate.drafts import registry as draft_kinds
    from gate.drafts.prompt_lookup import PromptLookupDraftSpec

    floor = draft_kinds.proposal_floor(PromptLookupDraftSpec(kind="prompt_lookup", max_ngram_size=2, num_draft_tokens=3))
    assert floor.steps(CYCLE) == 2 and "prompt lookup" in floor.rule


def _env() -> Environment:
    return Environment("3.11", "2.x", "5.x", "0", "linux", "cpu", "cpu", 0, cpu_count=2)


def _req(draft: str, i: int, output: list[int], proposed: int | None, concurrency: int | None = 2) -> RequestRecord:
    return RequestRecord(draft, "greedy", f"p{i}", "qa", len(output), 0, 5, output, [float(t) for t in range(len(output))],
                         None, None, None, "length", float(len(output)), 3, None, None, None, concurrency=concurrency,
                         server_draft_tokens=proposed, server_accepted_tokens=None if proposed is None else 0)


def _cell(outputs: list[list[int]], proposed: list[int | None], window: int | None = None) -> Measurements:
    m = Measurements(environment=_env(), laws=["greedy"], drafts={"lookup": DraftInfo("prompt_lookup", 3, "point_mass")})
    m.requests = [_req("lookup", i, o, p) for i, (o, p) in enumerate(zip(outputs, proposed))]
    if window is not None:
        m.runs = [RunRecord("lookup", "greedy", 0.0, 1.0, OfferedLoad("concurrency", 2), len(outputs), 0.04, 20,
                            SpecDecodeCounters(num_drafts=window, num_draft_tokens=window), repetition=0)]
    return m


@pytest.mark.parametrize("outputs, proposed, window, status", [
    ([CYCLE] * 5, [0] * 5, None, SpeculationStatus.OFF),  # copyable outputs, no proposal: off
    ([list(range(12))] * 5, [0] * 5, None, SpeculationStatus.NOTHING_TO_PROPOSE),  # nothing to copy
    ([CYCLE] * 5, [8] * 5, None, SpeculationStatus.SPECULATED),
    ([CYCLE] * 5, [0, 0, 8, 8, 8], None, SpeculationStatus.SOME_OFF),  # 2 of 5 requests dropped
    ([CYCLE] * 5, [0, 8, 8, 8, 8], None, SpeculationStatus.SPECULATED),  # one silent request is not enough
    ([CYCLE] * 5, [None] * 5, 0, SpeculationStatus.OFF),  # no per-request count: the window's counters
    ([CYCLE] * 5, [None] * 5, 12, SpeculationStatus.SPECULATED),
    ([CYCLE] * 5, [None] * 5, None, SpeculationStatus.NOT_COUNTED),
    ([CYCLE * 10] * 5, [1, 0, 0, 0, 0], None, SpeculationStatus.FEW),  # 1 draft token where 80 steps are implied
])
def test_the_status_of_a_cell(outputs, proposed, window, status):
    m = _cell(outputs, proposed, window)
    (rec,) = speculation.check(m, {"lookup": lookup_floor(2, 3)})
    assert rec.status == status, rec
    assert (rec.concurrency, rec.requests) == (2, 5)


def test_a_silent_cell_makes_every_outcome_of_that_runner_there_an_error_and_no_other():
    m = _cell([CYCLE] * 5, [0] * 5)
    m.requests += [_req("lookup", i, CYCLE, 8, concurrency=1) for i in range(5)]  # speculated at concurrency 1
    m.requests += [_req("fallback", i, CYCLE, None, c) for c in (1, 2) for i in range(5)]
    for r in m.requests:
        if r.draft == "lookup":
            r.e2el_ms *= 0.5  # twice as fast as the fallback
    m.speculation = speculation.check(m, {"lookup": lookup_floor(2, 3)})
    assert {(s.concurrency, s.status) for s in m.speculation} == {(1, "speculated"), (2, "off")}
    rule = RuleSpec(id="speedup", metric="speedup", aggregation="pooled", comparison=">=", threshold="0.9x",
                    per="concurrency")
    out = {o.scope: o for o in evaluate([rule], m, Settings(resamples=200))}
    assert out["lookup/greedy/concurrency=1"].status == "pass"
    silent = out["lookup/greedy/concurrency=2"]
    assert silent.status == "error" and silent.message.startswith(
        "speculation did not run: draft lookup made 0 draft tokens (per-request counts) over 5 requests (60 output tokens) "
        "under greedy at concurrency 2, where its outputs imply at least 10 proposing steps (prompt lookup proposes")
    assert "measured otherwise: speedup (pooled): measured 2" in silent.message  # what it measured is kept, decides nothing
    pooled = RuleSpec(id="pooled", metric="speedup", aggregation="pooled", comparison=">=", threshold="0.9x")
    (o,) = evaluate([pooled], m, Settings(resamples=200))
    assert o.status == "error"  # pooled over both load points: one of them did not speculate


def test_the_statuses_that_decide_nothing():
    assert set(DID_NOT_SPECULATE) == {SpeculationStatus.OFF, SpeculationStatus.FEW, SpeculationStatus.SOME_OFF}


# --- end to end on stub servers (tests/served_stub.py) ---------------------------------------

LOOKUP = "{kind: prompt_lookup, max_ngram_size: 2, num_draft_tokens: 3}"
RULES = ("  - {id: speedup, metric: speedup, aggregation: pooled, comparison: '>=', threshold: 0.9x, per: concurrency}\n"
         "  - {id: exact, kind: exactness}\n")


