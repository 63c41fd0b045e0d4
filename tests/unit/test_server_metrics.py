"""Server-side spec-decode counters (issue 15): Prometheus text from vLLM, llama.cpp, SGLang
and TensorRT-LLM (tests/data/served/<engine>_metrics_{before,after}.txt, written from each
engine's documented or source format) parsed and differenced into SpecDecodeCounters."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.records import SpecDecodeCounters
from gate.runners.server_metrics import ServerSnapshot, counter_delta, detect_engine, parse_metrics

DATA = Path(__file__).resolve().parents[1] / "data" / "served"


def snapshots(engine: str, as_engine: str | None = None) -> tuple[ServerSnapshot, ServerSnapshot]:
    read = lambda which: (DATA / f"{engine}_metrics_{which}.txt").read_text()  # noqa: E731
    return parse_metrics(read("before"), as_engine or engine), parse_metrics(read("after"), as_engine or engine)


def test_vllm_counters_sum_over_engines_and_split_by_position() -> None:
    before, after = snapshots("vllm")
    # labels are folded, sorted by key
    assert after.values['vllm:spec_decode_num_drafts_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'] == 1250
    assert after.total("vllm:spec_decode_num_drafts_total") == 1850
    d = counter_delta(before, after)
    # engine 0: +250 drafts, +750 proposals, +450 accepted (200/150/100); engine 1: +100, +300, +180 (80/60/40)
    assert d == SpecDecodeCounters(num_drafts=350, num_draft_tokens=1050, num_accepted_tokens=630,
                                   num_accepted_tokens_per_pos=[280, 210, 140], num_committed_tokens=980)
    # vLLM's identity: mean acceptance length = 1 + accepted/drafts = 1 + sum(per-position rates)
    per_pos_rates = [p / d.num_drafts for p in d.num_accepted_tokens_per_pos]
    assert 1 + d.num_accepted_tokens / d.num_drafts == pytest.approx(1 + sum(per_pos_rates))
    assert all(isinstance(v, int) for v in (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens, d.num_committed_tokens))


def test_llama_cpp_counters_use_the_server_names_and_its_number_format() -> None:
    before, after = snapshots("llama_cpp")
    d = counter_delta(before, after)
    assert d == SpecDecodeCounters(num_drafts=100, num_draft_tokens=400, num_accepted_tokens=250,
                                   num_accepted_tokens_per_pos=[90, 70, 50, 40], num_committed_tokens=350)
    # llama-server prints doubles with 6 significant digits: 1.00012e+06 parses (and is that coarse)
    assert after.total("llamacpp:tokens_predicted_total") == 1000120.0
    assert sum(d.num_accepted_tokens_per_pos) == d.num_accepted_tokens


def test_sglang_counts_verify_calls_and_generated_tokens_not_gauges() -> None:
    before, after = snapshots("sglang")
    d = counter_delta(before, after)
    assert d.num_drafts == 400 and d.num_committed_tokens == 1500 and d.num_accepted_tokens == 1100
    assert d.num_draft_tokens == 0 and d.num_accepted_tokens_per_pos == []
    # the gauge moved (3.4 -> 3.75) but is never differenced
    assert after.total("sglang:spec_accept_length") == 3.75


def test_trtllm_counts_proposals_and_acceptances() -> None:
    before, after = snapshots("trtllm")
    d = counter_delta(before, after)
    assert (d.num_draft_tokens, d.num_accepted_tokens, d.num_drafts, d.num_committed_tokens) == (900, 600, 0, 0)


@pytest.mark.parametrize("engine", ["vllm", "llama_cpp", "sglang", "trtllm"])
def test_generic_detects_the_engine_from_the_names(engine: str) -> None:
    before, after = snapshots(engine)
    gb, ga = snapshots(engine, as_engine="generic")
    assert detect_engine(ga) == engine
    assert counter_delta(gb, ga) == counter_delta(before, after)


def test_no_spec_counters_gives_none_and_a_restart_is_refused() -> None:
    plain = parse_metrics("# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 5.0\n", "vllm")
    assert counter_delta(plain, plain) is None
    assert counter_delta(plain, parse_metrics("up 1\n", "generic")) is None
    before, after = snapshots("llama_cpp")
    with pytest.raises(ValueError, match="went down.*restarted"):
        counter_delta(after, before)
    # a counter missing before the window counts from 0
    d = counter_delta(ServerSnapshot("llama_cpp"), before)
    assert d is not None and d.num_drafts == 1200 and d.num_accepted_tokens_per_pos == [1000, 800, 600, 500]


def test_bad_text_and_unknown_engines_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        parse_metrics("up 1\n", "tgi")
    with pytest.raises(ValueError, match="not Prometheus"):
        parse_metrics("<html>502 Bad Gateway</html>\n", "vllm")
