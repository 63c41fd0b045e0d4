"""Speculative-decoding counters scraped from a serving engine's Prometheus /metrics text,
and their difference over a measured window as gate's SpecDecodeCounters.

Counter names per engine (counters only: gauges such as SGLang's spec_accept_rate or
TRT-LLM's spec_decode_acceptance_length describe the last batch and cannot be differenced):

  vllm      vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total,
            vllm:spec_decode_num_accepted_tokens_total,
            vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
            (vllm/v1/spec_decode/metrics.py; labels model_name, engine are summed over)
  llama_cpp llamacpp:spec_decode_num_drafts_total (verification steps),
            llamacpp:spec_decode_num_draft_tokens_total, llamacpp:spec_decode_num_accepted_tokens_total,
            llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
            (tools/server/server-task.cpp, server_task_result_metrics::to_metrics; the server
            adds a request's counts when the request ends)
  sglang    sglang:spec_verify_calls_total (verification steps) and
            sglang:generation_tokens_total (every output token, so committed tokens include
            each request's first token from prefill); proposals are not counted (0)
  trtllm    trtllm_spec_decode_num_draft_tokens_total, trtllm_spec_decode_num_accepted_tokens_total;
            verification steps are not counted (num_drafts 0, num_committed_tokens 0)

num_committed_tokens = num_accepted_tokens + num_drafts (each step commits its accepted
proposals plus one token: vLLM's mean acceptance length 1 + accepted/drafts).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gate.records import SpecDecodeCounters

ENGINES = ("generic", "vllm", "llama_cpp", "sglang", "trtllm")
_PREFIX = {"vllm": "vllm:", "llama_cpp": "llamacpp:", "sglang": "sglang:", "trtllm": "trtllm_"}
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class ServerSnapshot:
    """One scrape of a server's /metrics. `engine`: whose counter names to read (see the
    module docstring; "generic": found from the names present). `values`: sample name ->
    value, labels folded in as name{k="v",...} with the labels sorted by key."""

    engine: str
    values: dict[str, float] = field(default_factory=dict)

    def total(self, name: str) -> float | None:
        """Sum of every sample named `name` over all its label sets; None when none exists."""
        found = [v for k, v in self.values.items() if k.split("{", 1)[0] == name]
        return math.fsum(found) if found else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Samples named `name` summed per value of `label` (samples without it are left out)."""
        out: dict[str, float] = {}
        for key, value in self.values.items():
            base, _, rest = key.partition("{")
            if base != name:
                continue
            labels = dict(_LABEL.findall(rest))
            if label in labels:
                out[labels[label]] = out.get(labels[label], 0.0) + value
        return out


def _fold(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def parse_metrics(text: str, engine: str) -> ServerSnapshot:
    """Parse Prometheus text exposition (prometheus_client.parser) into a ServerSnapshot of
    every sample. `engine`: one of ENGINES. Raises ValueError for an unknown engine or text
    that is not Prometheus exposition format."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[_fold(sample.name, dict(sample.labels))] = float(sample.value)
    except Exception as e:  # the parser raises ValueError/IndexError/TypeError for bad lines
        raise ValueError(f"not Prometheus text exposition format: {e}") from e
    return ServerSnapshot(engine, values)


def detect_engine(snapshot: ServerSnapshot) -> str | None:
    """The engine whose spec-decode counters appear in `snapshot`, or None."""
    names = {k.split("{", 1)[0] for k in snapshot.values}
    for engine, wanted in (("vllm", "vllm:spec_decode_num_drafts_total"),
                           ("llama_cpp", "llamacpp:spec_decode_num_drafts_total"),
                           ("sglang", "sglang:spec_verify_calls_total"),
                           ("trtllm", "trtllm_spec_decode_num_draft_tokens_total")):
        if wanted in names:
            return engine
    return None


def _delta(before: ServerSnapshot, after: ServerSnapshot, name: str) -> int | None:
    a = after.total(name)
    if a is None:
        return None
    b = before.total(name) or 0.0
    d = a - b
    if d < -0.5:
        raise ValueError(f"counter {name} went down ({b:g} -> {a:g}): was the server restarted in the window?")
    return max(0, int(round(d)))


def counter_delta(before: ServerSnapshot, after: ServerSnapshot) -> SpecDecodeCounters | None:
    """The spec-decode counters accrued between two scrapes of the same server (tokens and
    steps, ints), or None when the engine exposes no spec-decode counters. The engine is
    `after.engine` ("generic": detected from the names in `after`). Counters missing from
    `before` count from 0. Raises ValueError when a counter went down (a restarted server)."""
    engine = after.engine if after.engine != "generic" else detect_engine(after)
    if engine is None or engine == "generic":
        return None
    p = _PREFIX[engine]
    if engine in ("vllm", "llama_cpp"):
        drafts = _delta(before, after, f"{p}spec_decode_num_drafts_total")
        proposed = _delta(before, after, f"{p}spec_decode_num_draft_tokens_total")
        accepted = _delta(before, after, f"{p}spec_decode_num_accepted_tokens_total")
        if drafts is None and proposed is None and accepted is None:
            return None
        per_pos_name = f"{p}spec_decode_num_accepted_tokens_per_pos_total"
        pos_after = after.by_label(per_pos_name, "position")
        pos_before = before.by_label(per_pos_name, "position")
        per_pos: list[int] = []
        if pos_after:
            size = max(int(k) for k in pos_after) + 1
            per_pos = [0] * size
            for k, v in pos_after.items():
                d = v - pos_before.get(k, 0.0)
                if d < -0.5:
                    raise ValueError(f"counter {per_pos_name}{{position={k}}} went down: was the server restarted?")
                per_pos[int(k)] = max(0, int(round(d)))
        drafts, accepted = drafts or 0, accepted or 0
        return SpecDecodeCounters(num_drafts=drafts, num_draft_tokens=proposed or 0, num_accepted_tokens=accepted,
                                  num_accepted_tokens_per_pos=per_pos, num_committed_tokens=accepted + drafts)
    if engine == "sglang":
        verify = _delta(before, after, "sglang:spec_verify_calls_total")
        if verify is None:
            return None
        generated = _delta(before, after, "sglang:generation_tokens_total") or 0
        return SpecDecodeCounters(num_drafts=verify, num_draft_tokens=0, num_accepted_tokens=max(0, generated - verify),
                                  num_committed_tokens=generated)
    proposed = _delta(before, after, "trtllm_spec_decode_num_draft_tokens_total")
    accepted = _delta(before, after, "trtllm_spec_decode_num_accepted_tokens_total")
    if proposed is None and accepted is None:
        return None
    return SpecDecodeCounters(num_drafts=0, num_draft_tokens=proposed or 0, num_accepted_tokens=accepted or 0)
