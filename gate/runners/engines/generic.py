"""An engine gate has not verified: an OpenAI-compatible server whose sampler order and
penalty definitions gate has not checked in its source. Only the fields the law sets go on
the wire; what gate cannot vouch for (min-p, penalties, logit bias, a convention other than
vLLM's with truncation, constraints) is refused. SGLang and TensorRT-LLM are such engines
with their own counters (gate.runners.engines.sglang, trtllm); "generic" finds its counters
from the names present (gate.runners.engines.registry.detect_engine)."""

from __future__ import annotations

from typing import Any

from gate.records import SpecDecodeCounters
from gate.runners.engines.interface import Engine, ServerLatency, ServerSnapshot, openai_logit_bias
from gate.runners.engines.registry import detect_engine, engine, engines, register


class UnverifiedEngine(Engine):
    """The law as OpenAI's completions API names it, each field only where the law sets it
    (greedy: temperature 0, top_k 1); refusals name the engine and the verified ones."""

    def sampling_fields(self, law: Any, penalty_window: int | None = None) -> dict[str, Any]:
        """temperature always; top_k, top_p, min_p, the three penalties and logit_bias
        ({"<id>": bias}) where the law sets them. `penalty_window` is not sent."""
        greedy = law.greedy
        out: dict[str, Any] = {"temperature": 0.0 if greedy else float(law.temperature)}
        if greedy:
            out["top_k"] = 1
        elif law.top_k is not None:
            out["top_k"] = int(law.top_k)
        if law.top_p is not None and not greedy:
            out["top_p"] = float(law.top_p)
        if law.min_p is not None and not greedy:
            out["min_p"] = float(law.min_p)
        for name, value in (
            ("repetition_penalty", law.repetition_penalty),
            ("presence_penalty", law.presence_penalty),
            ("frequency_penalty", law.frequency_penalty),
        ):
            if value is not None:
                out[name] = float(value)
        if law.logit_bias:
            out["logit_bias"] = openai_logit_bias(law.logit_bias)
        return out

    def law_refusals(self, law: Any, fmt: Any = None) -> list[tuple[str, str]]:
        """min-p, presence and frequency penalties, a repetition penalty other than 1, a
        logit bias, a "transformers" convention with top-k or top-p (sampled), and any
        constraint: unverified, refused."""
        verified = ", ".join(e.name for e in engines() if e.verified)
        why = (
            f"engine {self.name!r}: gate has not verified how it applies this (engines verified: "
            f"{verified}); name the endpoint's engine, or drop the field"
        )
        out: list[tuple[str, str]] = []
        for name in ("min_p", "presence_penalty", "frequency_penalty"):
            if getattr(law, name, None):
                out.append((name, why))
        if law.repetition_penalty not in (None, 1.0):
            out.append(("repetition_penalty", why))
        if law.logit_bias:
            out.append(("logit_bias", why))
        if law.convention != "vllm" and not law.greedy and (law.top_k is not None or law.top_p is not None):
            out.append(("convention", why))
        if fmt is not None:
            out.append(("constraint", why))
        return out


@register
class Generic(UnverifiedEngine):
    """An engine not named: the counters of whichever engine's marker counter appears."""

    name = "generic"

    def spec_counters(self, before: ServerSnapshot, after: ServerSnapshot) -> SpecDecodeCounters | None:
        """The detected engine's counters (detect_engine on `after`); None when none is detected."""
        found = detect_engine(after)
        return engine(found).spec_counters(before, after) if found is not None else None

    def server_latency(self, before: ServerSnapshot, after: ServerSnapshot) -> ServerLatency | None:
        """The detected engine's latency histograms (detect_engine on `after`)."""
        found = detect_engine(after)
        return engine(found).server_latency(before, after) if found is not None else None
