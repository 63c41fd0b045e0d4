"""Stream chunks of each protocol parsed into Events: OpenAI's completions chunks (vLLM,
SGLang, TensorRT-LLM, llama.cpp's OpenAI-compatible endpoint) and llama.cpp's native
/completion events (tools/server/server-common.cpp, server_slot_stats). A chunk that breaks
its protocol raises TypeError, ValueError, KeyError or AttributeError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Event:
    """One parsed SSE data event: arrival (ms from send), ids carried (None: not in the
    stream), text carried, and what a final event says."""

    t_ms: float
    ids: list[int] | None
    text: str
    final: bool = False
    finish: str | None = None  # OpenAI finish_reason / llama.cpp stop_type
    stop_string: str | None = None  # vLLM stop_reason (str) / llama.cpp stopping_word
    stop_token: bool = False  # vLLM stop_reason is a token id
    usage_tokens: int | None = None  # usage.completion_tokens / tokens_predicted
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    prefill_ms: float | None = None  # llama.cpp timings.prompt_ms: the server's own prefill time
    tpot_ms: float | None = None  # llama.cpp timings.predicted_per_token_ms
    cached_tokens: int | None = None  # llama.cpp timings.cache_n: prompt tokens taken from the prefix cache
    # vLLM's per-request spec-decode metrics (--per-request-spec-decode-metrics detailed): each verification
    # step's proposals and accepted proposals, in order
    step_drafted: list[int] | None = None
    step_accepted: list[int] | None = None


def _ids(value: Any) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ValueError("token ids are not a list of ints")
    return list(value)


def _drafts(ev: Event, timings: dict[str, Any]) -> None:
    """llama.cpp's timings (draft_n / draft_n_accepted, prompt_ms, predicted_per_token_ms,
    cache_n), where present, into `ev`."""
    prompt_ms, per_token_ms = timings.get("prompt_ms"), timings.get("predicted_per_token_ms")
    if isinstance(prompt_ms, (int, float)) and not isinstance(prompt_ms, bool):
        ev.prefill_ms = float(prompt_ms)
    if isinstance(per_token_ms, (int, float)) and not isinstance(per_token_ms, bool):
        ev.tpot_ms = float(per_token_ms)
    if isinstance(timings.get("cache_n"), int) and not isinstance(timings.get("cache_n"), bool):
        ev.cached_tokens = timings["cache_n"]
    if isinstance(timings.get("draft_n"), int):
        ev.draft_n = timings["draft_n"]
        ev.draft_n_accepted = int(timings.get("draft_n_accepted") or 0)


def parse_llama_cpp(obj: dict[str, Any], t_ms: float) -> Event:
    """llama.cpp native /completion event: content, tokens, stop; the final one (stop true)
    has stop_type ("eos", "word", "limit"), stopping_word, tokens_predicted and timings."""
    ev = Event(t_ms, _ids(obj.get("tokens")), str(obj.get("content") or ""))
    if obj.get("stop"):
        ev.final = True
        ev.finish = str(obj.get("stop_type") or "")
        ev.stop_string = obj.get("stopping_word") or None
        if isinstance(obj.get("tokens_predicted"), int):
            ev.usage_tokens = obj["tokens_predicted"]
        _drafts(ev, obj.get("timings") or {})
    return ev


def parse_completions(obj: dict[str, Any], t_ms: float) -> Event:
    """OpenAI completions stream chunk: choices[0] (text, token_ids, finish_reason, vLLM's
    stop_reason, SGLang's matched_stop) and usage (with include_usage)."""
    ev = Event(t_ms, None, "")
    choices = obj.get("choices") or []
    if choices:
        choice = choices[0]
        ev.ids = _ids(choice.get("token_ids"))
        ev.text = str(choice.get("text") or "")
        if choice.get("finish_reason"):
            ev.final = True
            ev.finish = str(choice["finish_reason"])
            # vLLM: stop_reason; SGLang: matched_stop (a stop string, or a stop token id)
            stop = choice.get("stop_reason", choice.get("matched_stop"))
            if isinstance(stop, str):
                ev.stop_string = stop
            elif isinstance(stop, int):
                ev.stop_token = True
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        ev.usage_tokens = usage["completion_tokens"]
    timings = obj.get("timings")  # llama.cpp's OpenAI-compatible endpoints add timings to the last chunk
    if isinstance(timings, dict):
        _drafts(ev, timings)
    metrics = obj.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
        _spec_decoding(ev, metrics["speculative_decoding"])
    return ev


def _spec_decoding(ev: Event, sd: dict[str, Any]) -> None:
    """vLLM's per-request spec-decode metrics (the final usage chunk's metrics.speculative_decoding,
    vllm/entrypoints/generate/base/protocol.py SpeculativeDecodingMetrics; experimental there):
    num_draft_tokens and num_accepted_draft_tokens (summary) into draft_n, draft_n_accepted;
    per_step_drafted and per_step_accepted (detailed) into step_drafted, step_accepted. Raises
    ValueError when the step arrays are not lists of ints of one length."""
    drafted, accepted = sd.get("num_draft_tokens"), sd.get("num_accepted_draft_tokens")
    if isinstance(drafted, int) and isinstance(accepted, int):
        ev.draft_n, ev.draft_n_accepted = drafted, accepted
    steps = _ids(sd.get("per_step_drafted")), _ids(sd.get("per_step_accepted"))
    if steps[0] is not None and steps[1] is not None:
        if len(steps[0]) != len(steps[1]):
            raise ValueError("per_step_drafted and per_step_accepted differ in length")
        ev.step_drafted, ev.step_accepted = steps
