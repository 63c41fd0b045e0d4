"""The protocols gate speaks to a server (Endpoint.api), each declared once:

completions  POST {base_url}/v1/completions, the prompt as token ids, stream with
             stream_options.include_usage, return_token_ids (vLLM: choices[].token_ids).
llama_cpp    POST {base_url}/completion (llama.cpp native), prompt as token ids,
             "return_tokens": true (each event's "tokens"); the final event ("stop":
             true) has stop_type and timings.draft_n / timings.draft_n_accepted
             (tools/server/server-common.cpp, server_slot_stats). Only llama.cpp speaks it,
             so its requests follow llama.cpp's dialect whatever the endpoint's engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.runners.client.parse import Event, parse_completions, parse_llama_cpp


@dataclass(frozen=True)
class Protocol:
    """One API. `name`: the Endpoint.api value; `path`: appended to the base URL;
    `parse`: (a stream chunk's JSON object, its arrival ms) -> Event; `request_fields`:
    (prompt ids, max new tokens, seed) -> the protocol's own body fields; `info_paths`: GET
    paths that say what serves it (OpenAIRunner.server_info); `engine`: the engine whose
    dialect every server of this protocol speaks (None: the endpoint's engine);
    `reports_drafts`: the final event always counts the proposals (absent: none made)."""

    name: str
    path: str
    parse: Callable[[dict[str, Any], float], Event]
    request_fields: Callable[[list[int], int, int], dict[str, Any]]
    info_paths: tuple[str, ...]
    engine: str | None = None
    reports_drafts: bool = False


def _completions_fields(ids: list[int], max_new_tokens: int, seed: int) -> dict[str, Any]:
    return {
        "max_tokens": int(max_new_tokens),
        "seed": int(seed),
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "prompt": ids,
    }


def _llama_cpp_fields(ids: list[int], max_new_tokens: int, seed: int) -> dict[str, Any]:
    # llama.cpp seeds are uint32 and 0xFFFFFFFF means "random": fold the 63-bit seed below it
    return {"prompt": ids, "n_predict": int(max_new_tokens), "seed": int(seed) % 0xFFFFFFFF, "return_tokens": True}


PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in (
        Protocol("completions", "/v1/completions", parse_completions, _completions_fields, ("/version", "/v1/models")),
        Protocol(
            "llama_cpp",
            "/completion",
            parse_llama_cpp,
            _llama_cpp_fields,
            ("/props",),
            engine="llama_cpp",
            reports_drafts=True,
        ),
    )
}


def protocol(api: str) -> Protocol:
    """The protocol of `api`. Raises ValueError naming the known ones."""
    try:
        return PROTOCOLS[api]
    except KeyError:
        raise ValueError(f"unknown api {api!r}; known: {', '.join(PROTOCOLS)}") from None
