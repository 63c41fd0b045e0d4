"""The resident resource bill: its lines, the budget, one bill per runner."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BillLine:
    """One allocation of the resident resource bill."""

    name: str
    formula: str  # the formula with the numbers filled in
    bytes: int
    coexists_at_peak: bool = True
    # Measured against predicted where gate can measure the line (the target KV cache: the
    # bytes of the real cache tensors at the end of the longest request, one sequence, and the
    # formula for one sequence at that length). Not filled when resources.kv_dtype overrides
    # the dtype the model really caches in.
    measured_bytes: int | None = None
    measured_at_tokens: int | None = None
    predicted_at_measured_bytes: int | None = None


@dataclass
class Budget:
    """The capacity-planning answer: what is left on the device and what it buys.

    headroom_bytes = capacity - bill total (negative: the bill does not fit);
    extra_sequences: more sequences of the same context that fit in the headroom;
    extra_context_tokens: more tokens per sequence (for every sequence) that fit."""

    capacity_bytes: int
    headroom_bytes: int
    bytes_per_extra_sequence: int
    extra_sequences: int
    bytes_per_extra_context_token: int
    extra_context_tokens: int


@dataclass
class BillRecord:
    """Predicted resident bytes for one draft (or the fallback) at `sequences` sequences of
    `context_tokens` tokens, with the budget statement when a capacity is declared."""

    draft: str
    sequences: int
    context_tokens: int
    lines: list[BillLine]
    budget: Budget | None = None

    @property
    def total_bytes(self) -> int:
        return sum(line.bytes for line in self.lines if line.coexists_at_peak)
