"""Quantities with units, as written in policies: "2 GiB", "120 ms", "25 tokens/s", "1.10x".

Every metric has a dimension; a threshold must be written in a unit of that dimension
(a bare number is accepted only for dimensionless metrics and ratios). Values are
normalised to one base unit per dimension: bytes, milliseconds, tokens/s, tokens, 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Dimension(str, Enum):
    """What a number measures; each has one base unit used everywhere inside gate."""

    BYTES = "bytes"
    TIME_MS = "ms"
    RATE = "tokens/s"
    REQUEST_RATE = "requests/s"
    TOKENS = "tokens"
    RATIO = "ratio"  # dimensionless: probabilities, rates in [0, 1], speedups


_UNITS: dict[str, tuple[Dimension, float]] = {
    "b": (Dimension.BYTES, 1.0),
    "byte": (Dimension.BYTES, 1.0),
    "bytes": (Dimension.BYTES, 1.0),
    "kb": (Dimension.BYTES, 1e3),
    "mb": (Dimension.BYTES, 1e6),
    "gb": (Dimension.BYTES, 1e9),
    "tb": (Dimension.BYTES, 1e12),
    "kib": (Dimension.BYTES, 2.0**10),
    "mib": (Dimension.BYTES, 2.0**20),
    "gib": (Dimension.BYTES, 2.0**30),
    "tib": (Dimension.BYTES, 2.0**40),
    "us": (Dimension.TIME_MS, 1e-3),
    "µs": (Dimension.TIME_MS, 1e-3),
    "ms": (Dimension.TIME_MS, 1.0),
    "s": (Dimension.TIME_MS, 1e3),
    "min": (Dimension.TIME_MS, 60e3),
    "h": (Dimension.TIME_MS, 3600e3),
    "tokens/s": (Dimension.RATE, 1.0),
    "tok/s": (Dimension.RATE, 1.0),
    "token/s": (Dimension.RATE, 1.0),
    "requests/s": (Dimension.REQUEST_RATE, 1.0),
    "request/s": (Dimension.REQUEST_RATE, 1.0),
    "req/s": (Dimension.REQUEST_RATE, 1.0),
    "tokens": (Dimension.TOKENS, 1.0),
    "token": (Dimension.TOKENS, 1.0),
    "tok": (Dimension.TOKENS, 1.0),
    "x": (Dimension.RATIO, 1.0),
    "%": (Dimension.RATIO, 0.01),
}

_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-zµ/%]*)\s*$")


class UnitError(ValueError):
    """A quantity that cannot be parsed, or whose unit does not fit the metric."""


@dataclass(frozen=True)
class Quantity:
    """A number in the base unit of its dimension (bytes, ms, tokens/s, tokens, 1)."""

    value: float
    dimension: Dimension | None  # None: written without a unit

    def __str__(self) -> str:
        return format_value(self.value, self.dimension or Dimension.RATIO)


def parse_quantity(text: str | int | float) -> Quantity:
    """Parse ``"2 GiB"``, ``"120 ms"``, ``"25 tokens/s"``, ``"1.1x"``, ``"90%"`` or a bare number.

    Returns the value converted to the dimension's base unit.
    Raises UnitError for text that is not a number followed by a known unit.
    """
    if isinstance(text, bool):
        raise UnitError(f"expected a quantity, got {text!r}")
    if isinstance(text, (int, float)):
        return Quantity(float(text), None)
    match = _QUANTITY.match(str(text))
    if not match:
        raise UnitError(
            f"cannot read {text!r} as a quantity (a number and a unit, e.g. '2 GiB', '120 ms', '25 tokens/s')"
        )
    number, unit = float(match.group(1)), match.group(2)
    if not unit:
        return Quantity(number, None)
    key = unit.lower() if unit != "µs" else unit
    if key not in _UNITS:
        known = ", ".join(sorted({u for u in _UNITS if u.isascii()}))
        raise UnitError(f"unknown unit {unit!r} in {text!r}; known units: {known}")
    dimension, scale = _UNITS[key]
    return Quantity(number * scale, dimension)


def format_value(value: float, dimension: Dimension) -> str:
    """Human text for a base-unit value: bytes in binary units, ms, tokens/s, ratios."""
    if value != value:  # NaN
        return "n/a"
    if dimension is Dimension.BYTES:
        for unit, scale in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
            if abs(value) >= scale:
                return f"{value / scale:.2f} {unit}"
        return f"{value:.0f} B"
    if dimension is Dimension.TIME_MS:
        return f"{value:.1f} ms"
    if dimension is Dimension.RATE:
        return f"{value:.2f} tokens/s"
    if dimension is Dimension.REQUEST_RATE:
        return f"{value:.3f} requests/s"
    if dimension is Dimension.TOKENS:
        return f"{value:.2f} tokens"
    return f"{value:.3f}"
