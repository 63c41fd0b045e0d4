"""Whether a draft runner speculated: one record per draft runner, law and load point."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gate.records.run import at_load_point


class SpeculationStatus(str, Enum):
    """Whether a draft runner speculated in one cell (gate.measure.speculation)."""

    SPECULATED = "speculated"  # it proposed about as often as its outputs imply
    OFF = "off"  # no proposal at all where its outputs imply some: speculation did not run
    FEW = "few"  # far fewer proposals than its outputs imply: speculation barely ran
    SOME_OFF = "some_off"  # requests that imply proposals made none: speculation off for some requests
    NOTHING_TO_PROPOSE = "nothing_to_propose"  # no proposal, and its outputs imply none (lookup: nothing to copy)
    NOT_COUNTED = "not_counted"  # neither per-request counts nor server counters: cannot be told

    def __str__(self) -> str:
        return self.value


# The statuses under which a runner's verdicts at that cell say nothing about its draft.
DID_NOT_SPECULATE = (SpeculationStatus.OFF, SpeculationStatus.FEW, SpeculationStatus.SOME_OFF)


@dataclass
class SpeculationRecord:
    """Whether draft runner `runner` speculated under `law` at one load point (`concurrency`
    / `request_rate`; both None in-process): over its `requests` timed requests and their
    `output_tokens`, it proposed `draft_tokens` (from `source`: "per-request counts" or
    "server counters"; None: not counted), where its outputs imply at least `floor_steps`
    verification steps with a proposal by `rule` (gate.measure.speculation; None: the output's
    token ids did not come back, so it cannot be told). With per-request counts,
    `silent_requests` of the `eligible_requests` whose own floor is 2 steps or more made no
    proposal."""

    runner: str
    law: str
    status: SpeculationStatus
    requests: int
    output_tokens: int
    draft_tokens: int | None
    floor_steps: int | None
    rule: str
    source: str
    silent_requests: int | None = None
    eligible_requests: int | None = None
    concurrency: int | None = None
    request_rate: float | None = None

    def __post_init__(self) -> None:
        self.status = SpeculationStatus(self.status)

    @property
    def where(self) -> str:
        """'under greedy at concurrency 2' (in-process: 'under greedy')."""
        return f"under {self.law}{at_load_point(self.concurrency, self.request_rate)}"

    def describe(self) -> str:
        """What was seen and why it is (or is not) speculation, in one sentence."""
        made = (
            f"{self.draft_tokens} draft tokens ({self.source})"
            if self.draft_tokens is not None
            else "an uncounted number of draft tokens"
        )
        seen = (
            f"draft {self.runner} made {made} over {self.requests} requests ({self.output_tokens} output tokens) "
            f"{self.where}"
        )
        implied = f"its outputs imply at least {self.floor_steps} proposing steps ({self.rule})"
        if self.status == SpeculationStatus.OFF:
            return f"speculation did not run: {seen}, where {implied}"
        if self.status == SpeculationStatus.FEW:
            return f"speculation barely ran: {seen}, where {implied}"
        if self.status == SpeculationStatus.SOME_OFF:
            return (
                f"speculation was off for some requests: {self.silent_requests} of the {self.eligible_requests} "
                f"requests whose outputs imply 2 or more proposing steps made no proposal ({seen}; {self.rule})"
            )
        if self.status == SpeculationStatus.NOTHING_TO_PROPOSE:
            return (
                f"nothing to propose: {seen}, and its outputs imply {self.floor_steps} proposing steps ({self.rule}): "
                "the draft found nothing to propose on these prompts; its verdicts stand as measured"
            )
        if self.status == SpeculationStatus.NOT_COUNTED and self.draft_tokens is None:
            return (
                f"speculation not verified: draft {self.runner} {self.where}: neither per-request draft counts nor "
                "server spec-decode counters were recorded (give the endpoint a metrics_url)"
            )
        if self.status == SpeculationStatus.NOT_COUNTED:
            return (
                f"speculation not verified: {seen}, and its output token ids did not come back, so what they imply "
                "cannot be told (an api that returns token ids, such as llama_cpp, lets gate tell)"
            )
        return f"speculated: {seen} ({implied})"
