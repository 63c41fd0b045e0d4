"""Issue 11 item 1 and 3: the runner seam (capabilities, registry, sequential load, results
per request), the target oracle, records a runner without step counters can fill, the
measured window (RunRecord) and its throughput, and failure stages as an enum."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import TypeAdapter

from gate.core.law import Law
from gate.load.sequential import SEQUENTIAL
from gate.core.requests import PlannedPrompt
from gate.records import (Environment, Failure, FailureStage, Measurements, OfferedLoad, RequestRecord,
                          RunRecord, busy_seconds)
from gate.runners.registry import register, runner_class, runner_kinds
from gate.runners.transformers import TransformersRunner

CPU = torch.device("cpu")
GREEDY = Law("greedy", 0.0)
PROMPT = PlannedPrompt("p", "c", (1, 5, 7, 9, 5, 7, 9, 11))


def test_the_transformers_runner_is_registered_with_its_capabilities() -> None:
    assert "transformers" in runner_kinds() and runner_class("transformers") is TransformersRunner
    assert TransformersRunner.kind == "transformers"
    caps = TransformersRunner.capabilities
    assert caps.token_ids and caps.step_counters and caps.seeding and caps.first_steps and caps.cpu_accounting
    assert caps.max_concurrency == 1 and not caps.server_counters
    with pytest.raises(KeyError, match="known: .*transformers"):
        runner_class("no_such_runner")
    with pytest.raises(ValueError, match="already registered"):
        register("transformers")(type("Other", (TransformersRunner,), {}))


def _record(tokens: int, e2el_ms: float) -> RequestRecord:
    return RequestRecord("d", "greedy", "p", "c", tokens, 0, 5, list(range(tokens)), [e2el_ms] * tokens, [tokens], [0], [0],
                         "length", e2el_ms, 3, 10, 100, 0)


def test_window_throughput_equals_the_pooled_figure_under_sequential_load_only() -> None:
    recs = [_record(10, 1000.0), _record(30, 2000.0)]
    sequential = RunRecord.of("d", "greedy", SEQUENTIAL.offered(), [(0.0, recs[0]), (5.0, recs[1])])
    pooled = sum(r.output_tokens for r in recs) / (sum(r.e2el_ms for r in recs) / 1e3)
    assert sequential.committed_tokens_per_s() == pytest.approx(pooled)  # busy time = sum of E2E latencies
    assert (sequential.start_s, sequential.end_s, sequential.busy_s) == (0.0, 7.0, pytest.approx(3.0))
    assert sequential.counters is not None and sequential.counters.num_committed_tokens == 0  # no proposal steps
    overlapping = RunRecord.of("d", "greedy", OfferedLoad("concurrency", 2), [(0.0, recs[0]), (0.5, recs[1])])
    assert overlapping.busy_s == pytest.approx(2.5) and overlapping.committed_tokens_per_s() == pytest.approx(16.0)
    assert busy_seconds([(0, 1), (2, 3), (2.5, 4), (0.5, 0.8)]) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        RunRecord.of("d", "greedy", SEQUENTIAL.offered(), [])


def test_failure_stages_are_an_enum_equal_to_todays_strings() -> None:
    assert [s.value for s in FailureStage] == ["request", "warm-up", "overlap", "exactness", "bill", "run", "target identity",
                                              "target drift", "verification", "device memory"]
    f = Failure("request", "d", "greedy", "request p", "boom")
    assert f.stage is FailureStage.REQUEST and f.stage == "request" and f"{f.stage}" == "request" and str(f.stage) == "request"
    assert f.stage in ("exactness", "run", "request")
    assert json.loads(TypeAdapter(Failure).dump_json(f))["stage"] == "request"
    assert TypeAdapter(Failure).validate_python({"stage": "warm-up", "draft": "d", "law": "*", "what": "w", "message": "m"}).stage \
        is FailureStage.WARM_UP
    with pytest.raises(ValueError):
        Failure("nowhere", "d", "greedy", "x", "y")


def test_pooled_throughput_binds_to_the_windows() -> None:
    from gate.rules.samples import pooled
    from gate.rules.selection import Selection

    recs = [_record(10, 1000.0), _record(30, 2000.0)]
    m = Measurements(environment=Environment("3", "t", "tf", "g", "linux", "cpu", "cpu", 0), requests=list(recs))
    whole = Selection("d", "greedy", None)
    m.runs = [RunRecord.of("d", "greedy", SEQUENTIAL.offered(), [(0.0, recs[0]), (5.0, recs[1])])]
    assert pooled("committed_tokens_per_s", m, whole) == (pytest.approx(40 / 3.0), 2)  # = the window's figure
    assert pooled("committed_tokens_per_s", m, whole)[0] == pytest.approx(m.runs[0].committed_tokens_per_s())
    # Two requests in flight at once: the sum of latencies (3 s) overcounts the window's 2.5 s.
    m.runs = [RunRecord.of("d", "greedy", OfferedLoad("concurrency", 2), [(0.0, recs[0]), (0.5, recs[1])])]
    assert pooled("committed_tokens_per_s", m, whole) == (pytest.approx(16.0), 2)
    rate, n = pooled("committed_tokens_per_s", m, Selection("d", "greedy", ("c",)))
    assert rate != rate and n == 2  # a category is not a window: no throughput, never the latency sum
    recs[0].step_committed = recs[0].step_proposed = recs[0].step_accepted = None  # a runner without step counters
    rate, n = pooled("acceptance_rate", m, whole)
    assert rate != rate and n == 2
