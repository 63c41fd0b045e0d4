"""The tests of tests/unit/test_runners.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar, Sequence

import pytest
import torch
from conftest import tiny_llama
from pydantic import TypeAdapter

from gate.loop import run as gate_run
from gate.drafts.model import ModelDraft
from gate.core.law import Law
from gate.load.interface import LoadStrategy
from gate.load.sequential import SEQUENTIAL, Sequential
from gate.exactness.oracle import TargetOracle
from gate.core.requests import Request
from gate.records import (FALLBACK, DraftInfo, Environment, Measurements, OfferedLoad)
from gate.runners.interface import Capabilities, Done, Ended, RequestResult, Runner, StreamResult
from gate.runners.transformers import TransformersRunner
from unit.test_runners import CPU, GREEDY, PROMPT


@pytest.fixture(scope="module")
def runner() -> TransformersRunner:
    target = tiny_llama(0)
    return TransformersRunner(target, set(), CPU, drafts={"d": ModelDraft("d", "model", tiny_llama(1), 3, CPU)})


def test_run_returns_a_result_per_request_and_a_failure_does_not_stop_the_others(runner: TransformersRunner) -> None:
    requests = [Request(FALLBACK, GREEDY, PROMPT, 6, 0, 1), Request("missing", GREEDY, PROMPT, 6, 0, 1),
                Request("d", GREEDY, PROMPT, 6, 0, 1)]
    seen: list[int] = []
    with runner:
        results = runner.run(requests, SEQUENTIAL, lambda i, _: seen.append(i))
    assert seen == [0, 1, 2]
    fallback, failed, spec = results
    assert isinstance(failed, KeyError)
    assert isinstance(fallback, StreamResult) and isinstance(spec, StreamResult)
    assert spec.output_ids == fallback.output_ids and len(spec.output_ids) == 6  # greedy: the draft changes nothing
    assert spec.step_committed is not None and sum(spec.step_committed) == 6
    assert spec.cpu_time_ms is not None and spec.threads == torch.get_num_threads()  # cpu_accounting
    assert spec.started_s >= fallback.started_s + fallback.e2el_ms / 1e3 - 1e-3  # one at a time


def test_first_steps_and_the_oracle(runner: TransformersRunner) -> None:
    law = Law("t", 0.9, top_k=8)
    steps = runner.first_steps(list(PROMPT.token_ids), "d", law, 5, seed=3)
    assert steps == runner.first_steps(list(PROMPT.token_ids), "d", law, 5, seed=3)  # seeded
    assert len(steps) == 5 and all(1 <= len(s) <= 4 for s in steps)
    oracle = TargetOracle(runner.model, CPU)
    assert oracle.vocab_size == runner.model.config.vocab_size
    ids = list(PROMPT.token_ids)
    assert oracle.target_logits(ids, 3).shape == (len(ids) - 3, oracle.vocab_size)
    p = oracle.target_probs(ids, 3, GREEDY)
    assert torch.allclose(p.sum(-1), torch.ones(len(ids) - 3))
    with pytest.raises(ValueError, match="start >= 1"):
        oracle.target_logits(ids, 0)


@dataclass(frozen=True)
class Concurrent(LoadStrategy):
    kind: ClassVar[str] = "concurrency"
    concurrency: int | None = 4


def test_a_load_beyond_the_capabilities_is_refused(runner: TransformersRunner) -> None:
    assert SEQUENTIAL.offered() == OfferedLoad("sequential", 1, None)
    with pytest.raises(ValueError, match="at most 1"):
        runner.run([], Concurrent())
    with pytest.raises(ValueError):
        Sequential(concurrency=2)


class StreamOnly(Runner):
    """A runner that sees only a timed stream of token ids (as a served engine would)."""

    kind = "stream-only"
    capabilities = Capabilities(token_ids=True)
    sent = 0

    def run(self, requests: Sequence[Request], load: LoadStrategy, done: Done | None = None, ended: Ended | None = None) -> list[RequestResult]:
        self.check_load(load)
        out: list[RequestResult] = []
        for i, req in enumerate(requests):
            start = 1000.0 + 10 * self.sent  # 10 s apart, each 2 s long
            self.sent += 1
            result = StreamResult([7, 8, 9, 10], [100.0, 100.0, 250.0, 400.0], "length", 2000.0, started_s=start)
            out.append(result)
            if done:
                done(i, result)
            if ended:
                ended(i)
        return out


def test_a_runner_without_step_counters_gives_records_and_windows_that_serialise() -> None:
    session = SimpleNamespace(runner=StreamOnly(), prompts=[PROMPT], local=False)  # a served session (Session.local)
    m = Measurements(environment=Environment("3", "t", "tf", "g", "linux", "cpu", "cpu", 0), drafts={"d": DraftInfo("model", 3)})
    loop = gate_run.Loop(session, m, gate_run.Settings([4], 2, 0, warmup=0), lambda *_: None)  # type: ignore[arg-type]
    loop.requests([FALLBACK, "d"], [GREEDY], range(2))
    assert len(m.requests) == 4 and not m.failures
    r = m.requests[0]
    assert r.step_committed is None and r.kv_cache_bytes is None and r.cpu_time_ms is None
    assert r.counters is None
    assert r.itl_chunk_ms == [150.0, 150.0]  # chunks: tokens that arrived together
    assert json.loads(json.dumps(r.to_json()))["derived"]["counters"] is None
    assert [(w.runner, w.law, w.requests) for w in m.runs] == [(FALLBACK, "greedy", 2), ("d", "greedy", 2)]
    w = m.runs[1]
    assert w.counters is None and w.load == OfferedLoad("sequential", 1, None) and w.server is None
    assert w.busy_s == pytest.approx(4.0) and w.committed_tokens == 8 and w.committed_tokens_per_s() == pytest.approx(2.0)
    data = json.loads(TypeAdapter(Measurements).dump_json(m))
    assert data["runs"][1]["load"] == {"kind": "sequential", "concurrency": 1, "request_rate": None,
                                        "burstiness": None}
    assert data["requests"][0]["step_committed"] is None
    back = TypeAdapter(Measurements).validate_python(data)
    assert back.runs == m.runs
    del data["runs"]  # a report from before run records
    assert TypeAdapter(Measurements).validate_python(data).runs == []




def test_the_in_process_runner_fits_its_threads_to_the_cpus_left_free(runner, monkeypatch) -> None:
    """measurement.threads auto: at most the threads the process was given, less the CPUs other
    runnable tasks keep busy, said in a note; a fixed count is set and never changed."""
    import gate.runners.transformers as tr

    given = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(tr, "cpu_count", lambda: 2)
        monkeypatch.setattr(tr, "runnable_elsewhere", lambda: 1.0)  # one steady neighbour
        fitted = TransformersRunner(runner.model, set(), CPU, threads="auto")
        assert torch.get_num_threads() == 1
        (note,) = fitted.observed().notes
        assert note.startswith("compute threads 2 -> 1 at the start: 1 other runnable task(s) on 2 CPU(s)")
        monkeypatch.setattr(tr, "runnable_elsewhere", lambda: 0.0)  # the neighbour left
        fitted.fit_threads("before a contended cell's rerun")
        assert torch.get_num_threads() == 2
        assert fitted.observed().notes[0].startswith("compute threads 1 -> 2 before a contended cell's rerun: 0 other")
        fixed = TransformersRunner(runner.model, set(), CPU, threads=1)
        fixed.fit_threads("before a contended cell's rerun")
        assert torch.get_num_threads() == 1 and fixed.observed().notes == []
    finally:
        torch.set_num_threads(given)


def test_a_sliding_window_target_speculates_past_its_window_and_keeps_greedy_outputs() -> None:
    """transformers' sliding-window layers cannot be cropped once the window is reached unless they
    record their past (gate.models.cache.record_past, after the prefill): gate's loop on such a target
    with a context beyond the window rolls rejected proposals back and commits the target's own greedy
    tokens (found by benchmarks/gpu_bill.py's GQA target, which failed with `crop` raising)."""
    from transformers import MistralConfig, MistralForCausalLM
    from gate.drafts.early_exit import early_exit_draft

    config = MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=64, sliding_window=6, max_position_embeddings=128)
    torch.manual_seed(0)
    target, other = MistralForCausalLM(config).eval(), MistralForCausalLM(config).eval()
    drafts = {"exit": early_exit_draft("exit", target, 1, 4, CPU, "drafts.exit"),
              "other": ModelDraft("other", "model", other, 3, CPU)}
    runner = TransformersRunner(target, set(), CPU, drafts=drafts)
    prompt = PROMPT.__class__("long", "c", tuple(range(3, 23)))  # 20 tokens: past the window of 6
    with runner:
        results = runner.run([Request(name, GREEDY, prompt, 16, 0, 1) for name in (FALLBACK, "exit", "other")],
                             SEQUENTIAL)
    fallback, exit_, other_ = results
    assert all(isinstance(r, StreamResult) for r in results), results
    reference = target.generate(torch.tensor([prompt.token_ids]), max_new_tokens=16, do_sample=False, pad_token_id=0,
                                eos_token_id=None)[0, len(prompt.token_ids):].tolist()
    assert fallback.output_ids == exit_.output_ids == other_.output_ids == reference
    assert sum(exit_.step_proposed) > sum(exit_.step_accepted)  # some proposals were rolled back
