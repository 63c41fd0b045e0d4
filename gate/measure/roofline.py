"""The roofline (for the resource distinction only) and the primer's speedup formula.

Attainable FLOP/s = min(peak, bandwidth x operational intensity) (Williams, Waterman &
Patterson 2009). A decode step of batch b that scores k tokens per sequence does about
2 x params x b x k FLOPs while reading the weights once and every sequence's cache, so
extra verified tokens are almost free while bandwidth-bound and compete with the compute
roof once b x k nears the ridge point (peak / bandwidth).
Expected speedup with i.i.d. acceptance alpha, gamma proposals and cost coefficient c
(draft step time / target step time): (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))
(Leviathan et al. 2023, Eq. 1 and Thm 3.8).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_PREFIX = {
    "": 1.0,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
}
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([kKMGTP]i?)?\s*(B/s|FLOP/s|FLOPS|FLOP)\s*$")


def parse_rate(text: str, unit: str) -> float:
    """'100GB/s' -> 1e11 (unit 'B/s'); '1000 GFLOP/s' -> 1e12 (unit 'FLOP/s'). Raises ValueError."""
    m = _RATE.match(text)
    found = {"B/s": "B/s", "FLOP/s": "FLOP/s", "FLOPS": "FLOP/s", "FLOP": "FLOP/s"}[m.group(3)] if m else None
    if not m or found != unit:
        raise ValueError(
            f"cannot read {text!r} as {unit} (a number, an optional prefix k M G T P or Ki Mi Gi Ti, "
            f"then {unit}; e.g. {'100GB/s' if unit == 'B/s' else '1000GFLOP/s'})"
        )
    return float(m.group(1)) * _PREFIX[m.group(2) or ""]


def attainable(peak_flops: float, bandwidth: float, intensity: float) -> float:
    """Attainable FLOP/s at `intensity` FLOP/byte: min(peak, bandwidth x intensity)."""
    return min(peak_flops, bandwidth * intensity)


@dataclass(frozen=True)
class Step:
    """One decode or verification step placed on the roofline."""

    name: str
    batch: int
    tokens_per_sequence: int
    flops: float
    bytes: float
    intensity: float  # FLOP/byte
    attainable_flops: float
    time_s: float
    bound: str  # "bandwidth" or "compute"


def step(
    name: str,
    params: int,
    weight_bytes: int,
    kv_bytes_per_token: int,
    context_tokens: int,
    batch: int,
    tokens_per_sequence: int,
    peak_flops: float,
    bandwidth: float,
    attention_width: int = 0,
) -> Step:
    """A step reading the weights once and every sequence's cache (context_tokens each),
    doing 2 x params x batch x tokens_per_sequence FLOPs for the matmuls plus
    4 x attention_width x context_tokens per token for attention (QK^T and AV), where
    attention_width = layers x query heads x head_dim."""
    flops = (2.0 * params + 4.0 * attention_width * context_tokens) * batch * tokens_per_sequence
    nbytes = float(weight_bytes + batch * context_tokens * kv_bytes_per_token)
    intensity = flops / nbytes
    att = attainable(peak_flops, bandwidth, intensity)
    bound = "bandwidth" if bandwidth * intensity < peak_flops else "compute"
    return Step(name, batch, tokens_per_sequence, flops, nbytes, intensity, att, flops / att, bound)


def ridge_batch(
    params: int,
    weight_bytes: int,
    kv_bytes_per_token: int,
    context_tokens: int,
    tokens_per_sequence: int,
    peak_flops: float,
    bandwidth: float,
    attention_width: int = 0,
) -> float:
    """The batch size at which a step's intensity reaches the ridge point (inf: never)."""
    ridge = peak_flops / bandwidth
    per_token = 2.0 * params + 4.0 * attention_width * context_tokens
    denominator = per_token * tokens_per_sequence - ridge * context_tokens * kv_bytes_per_token
    return ridge * weight_bytes / denominator if denominator > 0 else math.inf


def expected_committed(alpha: float, gamma: int) -> float:
    """Expected committed tokens per step (1 - alpha^(gamma+1)) / (1 - alpha)."""
    return gamma + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, cost_coefficient: float) -> float:
    """(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)): a diagnostic, never the verdict."""
    return expected_committed(alpha, gamma) / (gamma * cost_coefficient + 1.0)
