"""What a serving engine is to gate: one scrape of its /metrics (ServerSnapshot), and the
Engine, one per dialect, that reads its spec-decode counters from two scrapes, puts the
declared law and a constraint on the wire in its own field names, and says what it cannot
apply as gate applies it. A new engine is one module with an Engine subclass under
`@register` (gate.runners.engines.registry) plus its line in that registry's BUILTIN."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gate.records import SpecDecodeCounters

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def histogram_means(
    before: ServerSnapshot, after: ServerSnapshot, names: dict[str, tuple[str, ...]]
) -> dict[str, tuple[float, float]]:
    """Means (ms) of Prometheus histograms over the time between two scrapes: for each key
    of `names` ("ttft", "itl"), the first histogram (base name, seconds) of its candidates
    whose _count grew: key -> (delta(_sum) / delta(_count) x 1000, delta(_count)); a key
    whose histograms did not grow is absent."""
    out: dict[str, tuple[float, float]] = {}
    for key, candidates in names.items():
        for base in candidates:
            n1, s1 = after.total(base + "_count"), after.total(base + "_sum")
            if n1 is None or s1 is None:
                continue
            dn = n1 - (before.total(base + "_count") or 0.0)
            ds = s1 - (before.total(base + "_sum") or 0.0)
            if dn > 0:
                out[key] = (1e3 * ds / dn, dn)
                break
    return out


@dataclass(frozen=True)
class ServerLatency:
    """The server's own timing of the requests between two scrapes (Engine.server_latency):
    mean TTFT and ITL (ms) from its latency histograms and the counts they are over, and the
    prompt tokens it took from its prefix cache; None where it keeps no such figure."""

    ttft_mean_ms: float | None = None
    ttft_n: float | None = None
    itl_mean_ms: float | None = None
    itl_n: float | None = None
    cached_tokens: float | None = None


@dataclass
class ServerSnapshot:
    """One scrape of a server's /metrics. `engine`: whose counter names to read (an
    engine name; "generic": found from the names present, gate.runners.server_metrics).
    `values`: sample name -> value, labels folded in as name{k="v",...} with the labels
    sorted by key."""

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

    def increase(self, before: ServerSnapshot, name: str) -> int | None:
        """How much counter `name` (summed over its label sets) rose since `before`, rounded
        to an int; None when this scrape has no such counter (missing from `before`: counts
        from 0). Raises ValueError when it went down (a restarted server)."""
        a = self.total(name)
        if a is None:
            return None
        b = before.total(name) or 0.0
        d = a - b
        if d < -0.5:
            raise ValueError(f"counter {name} went down ({b:g} -> {a:g}): was the server restarted in the window?")
        return max(0, int(round(d)))


def value_or(value: float | None, off: float) -> float:
    """`value` as a float, or `off` (the value that turns the field off) when it is None."""
    return off if value is None else float(value)


class Engine:
    """One serving engine's dialect; instances are stateless (one per registered name).

    `name`: the policy's `engine:` value; `verified`: gate has checked the engine's sampler
    order and penalty definitions in its source (others are refused what gate has not
    checked); `marker`: the /metrics counter whose presence says this engine serves (None:
    never detected). The defaults are OpenAI's (and vLLM's) names for a constraint, no
    extra request fields and no spec-decode counters."""

    name: ClassVar[str]
    verified: ClassVar[bool] = False
    marker: ClassVar[str | None] = None

    def spec_counters(self, before: ServerSnapshot, after: ServerSnapshot) -> SpecDecodeCounters | None:
        """The spec-decode counters accrued between two scrapes of one server (tokens and
        steps, ints), or None when the engine exposes none. Raises ValueError when a counter
        went down (a restarted server)."""
        return None

    def server_latency(self, before: ServerSnapshot, after: ServerSnapshot) -> ServerLatency | None:
        """The server's own timing of the requests between two scrapes, from its latency
        histograms (a ServerLatency; a figure is None where the server keeps no such
        histogram), or None when it keeps none."""
        return None

    def sampling_fields(self, law: Any, penalty_window: int | None = None) -> dict[str, Any]:
        """The request fields of `law` (a gate.core.law.Law). `penalty_window`: the tokens a
        repetition penalty looks back over where the engine takes a window (the slot
        context; None: gate does not know it)."""
        raise NotImplementedError

    def constraint_fields(self, fmt: Any) -> dict[str, Any]:
        """The request fields of constraint `fmt` (a gate.constraints.interface.ResponseFormat):
        response_format json_schema, structured_outputs regex / choice (vLLM >= 0.12,
        docs/features/structured_outputs.md: guided_regex / guided_choice were removed in
        v0.12.0). Raises ValueError for a kind the engine cannot take."""
        if fmt.kind == "json_schema":
            return {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "gate_constraint", "schema": fmt.schema},
                }
            }
        if fmt.kind == "regex":
            return {"structured_outputs": {"regex": fmt.value}}
        return {"structured_outputs": {"choice": list(fmt.choices)}}

    def law_refusals(self, law: Any, fmt: Any = None) -> list[tuple[str, str]]:
        """What the engine cannot apply as gate applies `law` (gate.core.law) to a request with
        constraint `fmt` (None: none): (field, why), field a Law attribute or "constraint";
        [] when it follows the whole law."""
        raise NotImplementedError

    def request_fields(self) -> dict[str, Any]:
        """Fields every request to this engine carries whatever its protocol ({}: none)."""
        return {}


def openai_logit_bias(bias: Any) -> dict[str, float]:
    """A law's logit bias ((token id, bias), ...) as OpenAI's {"<id>": bias}."""
    return {str(int(t)): float(b) for t, b in bias}
