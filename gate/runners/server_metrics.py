"""Speculative-decoding counters scraped from a serving engine's Prometheus /metrics text,
and their difference over a measured window as gate's SpecDecodeCounters.

Which counters each engine exposes, and how they map to gate's, is the engine's own
(gate.runners.engines: vllm, llama_cpp, sglang, trtllm). Counters only: gauges such as
SGLang's spec_accept_rate or TRT-LLM's spec_decode_acceptance_length describe the last
batch and cannot be differenced. An endpoint of engine "generic" reads the counters of
whichever engine's marker counter appears (detect_engine).
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gate.records import SpecDecodeCounters
from gate.runners.engines.interface import ServerLatency, ServerSnapshot
from gate.runners.engines.registry import detect_engine, engine, engine_names

__all__ = ["ServerSnapshot", "counter_delta", "detect_engine", "latency_delta", "parse_metrics"]


def _fold(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def parse_metrics(text: str, engine_name: str) -> ServerSnapshot:
    """Parse Prometheus text exposition (prometheus_client.parser) into a ServerSnapshot of
    every sample. `engine_name`: a registered engine (gate.runners.engines.registry).
    Raises ValueError for an unknown engine or text that is not Prometheus exposition format."""
    known = engine_names()
    if engine_name not in known:
        raise ValueError(f"unknown engine {engine_name!r}; known: {', '.join(known)}")
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[_fold(sample.name, dict(sample.labels))] = float(sample.value)
    except Exception as e:  # the parser raises ValueError/IndexError/TypeError for bad lines
        raise ValueError(f"not Prometheus text exposition format: {e}") from e
    return ServerSnapshot(engine_name, values)


def counter_delta(before: ServerSnapshot, after: ServerSnapshot) -> SpecDecodeCounters | None:
    """The spec-decode counters accrued between two scrapes of the same server (tokens and
    steps, ints), or None when the engine exposes no spec-decode counters. The engine is
    `after.engine` ("generic": detected from the names in `after`). Counters missing from
    `before` count from 0. Raises ValueError when a counter went down (a restarted server)."""
    return engine(after.engine).spec_counters(before, after)


def latency_delta(before: ServerSnapshot, after: ServerSnapshot) -> ServerLatency | None:
    """The server's own mean TTFT and ITL (ms) over the requests between two scrapes, from
    its latency histograms (Engine.server_latency), or None when the engine keeps none."""
    return engine(after.engine).server_latency(before, after)
