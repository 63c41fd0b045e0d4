"""Stop strings, matched on decoded text as vLLM matches them (vllm/v1/engine/detokenizer.py):
the output ids are decoded with special tokens skipped (vLLM's default), so a stop string
that spans several tokens is found once the token completing it is produced.

Where the output ends: at the token that completes the first stop string. That token is
the last output token: it is committed, timed and, when it was a draft proposal, counted
as accepted, like an EOS token; the tokens after it in the same verification step are
neither committed nor counted. The text a client receives stops before the stop string
(vLLM's default, include_stop_str_in_output false), so the last token's text can be cut.
vLLM itself keeps every token of a multi-token step in its output ids and counters and
only cuts the text; gate cuts the tokens too, so acceptance is never credited past a stop.
"""

from __future__ import annotations

from typing import Any


class StopStrings:
    """Finds the token that completes a stop string in a request's output.

    `tokenizer`: the target's (its decode is used); `stops`: non-empty strings."""

    def __init__(self, tokenizer: Any, stops: list[str]):
        if not stops or any(not s for s in stops):
            raise ValueError("stop strings must be a non-empty list of non-empty strings")
        self.tokenizer = tokenizer
        self.stops = list(stops)
        # Tokens decoded before the new ones: a stop string of c characters spans at most c
        # tokens that decode to text; the margin keeps its start away from the window's edge
        # (where some tokenizers drop a leading space), and keeps each check O(1) in the
        # output's length, so the fallback's extra steps pay no growing detokenization cost.
        self.window_tokens = max(len(s) for s in self.stops) + 16

    def text(self, output_ids: list[int]) -> str:
        """The output's text as the detector sees it (special tokens skipped)."""
        return self.tokenizer.decode(output_ids, skip_special_tokens=True)

    def _found(self, output_ids: list[int]) -> str | None:
        text = self.text(output_ids)
        hits = [(text.find(s), i, s) for i, s in enumerate(self.stops) if s in text]
        return min(hits)[2] if hits else None

    def first_stop(self, output_ids: list[int], new: int) -> tuple[int, str] | None:
        """With the last `new` ids of `output_ids` just produced and the text before them
        free of stop strings: (k, stop), where output_ids[:len(output_ids) - new + k] is
        the shortest output whose text holds a stop string (1 <= k <= new) and `stop` the
        one that starts first there; None when none occurs. Only the last `new` +
        window_tokens ids are decoded: once when there is no stop string, up to `new` more
        at the step that has one."""
        window = output_ids[max(0, len(output_ids) - new - self.window_tokens) :]
        if new <= 0 or self._found(window) is None:
            return None
        start = len(window) - new
        for k in range(1, new + 1):
            stop = self._found(window[: start + k])
            if stop is not None:
                return k, stop
        return None  # unreachable: the window holds a stop string

    def strip(self, output_ids: list[int], stop: str) -> str:
        """The text a client receives: the output's text cut before the stop string."""
        text = self.text(output_ids)
        return text[: text.find(stop)] if stop in text else text
