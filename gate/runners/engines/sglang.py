"""SGLang: an engine gate has not verified (gate.runners.engines.generic), with its own
counters: sglang:spec_verify_calls_total (verification steps) and
sglang:generation_tokens_total (every output token, so committed tokens include each
request's first token from prefill); proposals are not counted (0). Gauges such as
spec_accept_rate describe the last batch and cannot be differenced."""

from __future__ import annotations

from gate.records import SpecDecodeCounters
from gate.runners.engines.generic import UnverifiedEngine
from gate.runners.engines.interface import ServerSnapshot
from gate.runners.engines.registry import register


@register
class SGLang(UnverifiedEngine):
    """SGLang (see the module docstring): unverified, its own counters."""

    name = "sglang"
    marker = "sglang:spec_verify_calls_total"

    def spec_counters(self, before: ServerSnapshot, after: ServerSnapshot) -> SpecDecodeCounters | None:
        """Steps from spec_verify_calls_total, committed tokens from generation_tokens_total,
        accepted = committed - steps, proposals 0; None without spec_verify_calls_total."""
        verify = after.increase(before, "sglang:spec_verify_calls_total")
        if verify is None:
            return None
        generated = after.increase(before, "sglang:generation_tokens_total") or 0
        return SpecDecodeCounters(
            num_drafts=verify,
            num_draft_tokens=0,
            num_accepted_tokens=max(0, generated - verify),
            num_committed_tokens=generated,
        )
