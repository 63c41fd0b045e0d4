"""TensorRT-LLM: an engine gate has not verified (gate.runners.engines.generic), with its
own counters trtllm_spec_decode_num_draft_tokens_total and
trtllm_spec_decode_num_accepted_tokens_total; verification steps are not counted
(num_drafts 0, num_committed_tokens 0). The gauge spec_decode_acceptance_length describes
the last batch and cannot be differenced."""

from __future__ import annotations

from gate.records import SpecDecodeCounters
from gate.runners.engines.generic import UnverifiedEngine
from gate.runners.engines.interface import ServerSnapshot
from gate.runners.engines.registry import register


@register
class TensorRTLLM(UnverifiedEngine):
    """TensorRT-LLM (see the module docstring): unverified, its own counters."""

    name = "trtllm"
    marker = "trtllm_spec_decode_num_draft_tokens_total"

    def spec_counters(self, before: ServerSnapshot, after: ServerSnapshot) -> SpecDecodeCounters | None:
        """Proposed and accepted tokens; None when neither counter is exposed."""
        proposed = after.increase(before, "trtllm_spec_decode_num_draft_tokens_total")
        accepted = after.increase(before, "trtllm_spec_decode_num_accepted_tokens_total")
        if proposed is None and accepted is None:
            return None
        return SpecDecodeCounters(num_drafts=0, num_draft_tokens=proposed or 0, num_accepted_tokens=accepted or 0)
