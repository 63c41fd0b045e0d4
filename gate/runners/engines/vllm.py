"""vLLM: its OpenAI-compatible API and its spec-decode counters.

The law (vllm/entrypoints/openai/completion/protocol.py, CompletionRequest): top_k (0:
off), top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty, logit_bias
{"<id>": bias}, every field explicit, off values included, so no server default (its
generation_config.json) applies. Order (vllm/v1/sample/sampler.py, Sampler.forward): logit
bias, penalties, greedy argmax, or temperature, min-p, top-k, top-p: gate's "vllm"
convention (gate.core.law). Constraints: response_format {"type": "json_schema", "json_schema":
{"name", "schema"}}; structured_outputs {"regex": ...} / {"choice": [...]}
(docs/features/structured_outputs.md).

Counters (vllm/v1/spec_decode/metrics.py; labels model_name, engine are summed over):
vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total,
vllm:spec_decode_num_accepted_tokens_total,
vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}.
num_committed_tokens = num_accepted_tokens + num_drafts (each step commits its accepted
proposals plus one token: vLLM's mean acceptance length 1 + accepted/drafts).
"""

from __future__ import annotations

from typing import Any

from gate.records import SpecDecodeCounters
from gate.runners.engines.interface import (
    Engine,
    ServerLatency,
    ServerSnapshot,
    histogram_means,
    openai_logit_bias,
    value_or,
)
from gate.runners.engines.registry import register

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a logit bias; vLLM before 0.7 clamped to it


def spec_decode_counters(before: ServerSnapshot, after: ServerSnapshot, prefix: str) -> SpecDecodeCounters | None:
    """vLLM's four spec-decode counters under `prefix` ("vllm:"; llama.cpp exposes the same
    names under "llamacpp:"), accrued between two scrapes; None when none of the three
    totals is exposed. Raises ValueError when a counter went down (a restarted server)."""
    drafts = after.increase(before, f"{prefix}spec_decode_num_drafts_total")
    proposed = after.increase(before, f"{prefix}spec_decode_num_draft_tokens_total")
    accepted = after.increase(before, f"{prefix}spec_decode_num_accepted_tokens_total")
    if drafts is None and proposed is None and accepted is None:
        return None
    per_pos_name = f"{prefix}spec_decode_num_accepted_tokens_per_pos_total"
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
    return SpecDecodeCounters(
        num_drafts=drafts,
        num_draft_tokens=proposed or 0,
        num_accepted_tokens=accepted,
        num_accepted_tokens_per_pos=per_pos,
        num_committed_tokens=accepted + drafts,
    )


@register
class VLLM(Engine):
    """vLLM (see the module docstring): verified; the law in vLLM's names, every field explicit."""

    name = "vllm"
    verified = True
    marker = "vllm:spec_decode_num_drafts_total"

    def spec_counters(self, before: ServerSnapshot, after: ServerSnapshot) -> SpecDecodeCounters | None:
        return spec_decode_counters(before, after, "vllm:")

    def server_latency(self, before: ServerSnapshot, after: ServerSnapshot) -> ServerLatency | None:
        """vLLM's request histograms (docs/design/metrics.md): vllm:time_to_first_token_seconds
        (arrival to first token, the server's queue included) and vllm:inter_token_latency_seconds
        (vllm:time_per_output_token_seconds before v0.11); and `cached_tokens`, the prompt
        tokens it took from its prefix cache (vllm:prefix_cache_hits, a counter of tokens, v1)."""
        means = histogram_means(
            before,
            after,
            {
                "ttft": ("vllm:time_to_first_token_seconds",),
                "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
            },
        )
        hits = after.total("vllm:prefix_cache_hits_total")
        cached = hits - (before.total("vllm:prefix_cache_hits_total") or 0.0) if hits is not None else None
        if not means and cached is None:
            return None
        ttft, itl = means.get("ttft", (None, None)), means.get("itl", (None, None))
        return ServerLatency(ttft[0], ttft[1], itl[0], itl[1], cached)

    def sampling_fields(self, law: Any, penalty_window: int | None = None) -> dict[str, Any]:
        """Every field explicit (greedy: temperature 0, top_k 1); logit_bias only when set.
        `penalty_window` is not sent (vLLM's penalties see the whole prompt and output)."""
        greedy = law.greedy
        out: dict[str, Any] = {"temperature": 0.0 if greedy else float(law.temperature)}
        out.update(
            top_k=1 if greedy else int(law.top_k or 0),
            top_p=1.0 if greedy else value_or(law.top_p, 1.0),
            min_p=0.0 if greedy else value_or(law.min_p, 0.0),
            repetition_penalty=value_or(law.repetition_penalty, 1.0),
            presence_penalty=value_or(law.presence_penalty, 0.0),
            frequency_penalty=value_or(law.frequency_penalty, 0.0),
        )
        if law.logit_bias:
            out["logit_bias"] = openai_logit_bias(law.logit_bias)
        return out

    def law_refusals(self, law: Any, fmt: Any = None) -> list[tuple[str, str]]:
        """A "transformers" law with min-p and top-k or top-p (sampled) differs (min-p comes
        last there); logit biases beyond +-LOGIT_BIAS_LIMIT (OpenAI's range; vLLM before 0.7
        clamped). Every constraint kind is taken."""
        out: list[tuple[str, str]] = []
        if (
            law.convention == "transformers"
            and law.min_p
            and not law.greedy
            and (law.top_k is not None or law.top_p is not None)
        ):
            out.append(
                (
                    "convention",
                    "vLLM applies min-p before top-k and top-p (vllm/v1/sample/sampler.py), the "
                    "transformers convention after them: the law differs; use convention vllm",
                )
            )
        big = [b for _, b in law.logit_bias if abs(b) > LOGIT_BIAS_LIMIT]
        if big:
            out.append(
                (
                    "logit_bias",
                    f"bias {big[0]:g} is outside OpenAI's range +-{LOGIT_BIAS_LIMIT:g} (vLLM before 0.7 clamps to it)",
                )
            )
        return out
