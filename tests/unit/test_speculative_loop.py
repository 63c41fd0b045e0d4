"""gate's speculative loop on tiny random Llamas: greedy output equals the fallback token for
token, counters add up, EOS or a stop string inside an accepted block ends the output and
its counters, very short outputs work with a draft, cache bytes match the bill."""

from __future__ import annotations

import torch
from conftest import WORDS, tiny_tokenizer

from gate.drafts.prompt_lookup import lookup
from gate.runners.stop import StopStrings
from gate.core.law import Law

CPU = torch.device("cpu")
GREEDY = Law("greedy", 0.0)
PROMPT = [1, 5, 7, 9, 5, 7, 9, 11, 3, 5, 7]


def test_prompt_lookup_matches_transformers_rule():
    # suffix [5, 7] first occurs at index 1 -> proposes what followed it
    assert lookup([1, 5, 7, 9, 4, 5, 7], 3, 2) == [9, 4]
    assert lookup([1, 2, 3], 3, 4) == []
    assert lookup([4, 4], 2, 3) == [4]


# --- stop strings and very short outputs ----------------------------------------------------


def test_a_stop_string_is_found_across_token_boundaries():
    stops = StopStrings(tiny_tokenizer(), ["2 w3", "w9"])
    w = {word: i + 4 for i, word in enumerate(WORDS)}  # tiny ids: w0 is 4
    assert stops.first_stop([w["w1"], w["w2"]], 1) is None
    # "2 w3" spans w2 and w3: it completes at w3, the second of the three new tokens
    assert stops.first_stop([w["w1"], w["w2"], w["w3"], w["w4"]], 3) == (2, "2 w3")
    assert stops.first_stop([w["w1"], w["w2"], w["w3"]], 1) == (1, "2 w3")
    assert stops.first_stop([w["w1"], 2, w["w9"]], 2) == (2, "w9")  # special tokens are skipped, as vLLM decodes
    assert stops.strip([w["w1"], w["w2"], w["w3"]], "2 w3") == "w1 w"  # the client's text stops before it
    # a long output: only a window before the new tokens is decoded, and it still finds it
    long = [w["w5"]] * 500 + [w["w2"], w["w3"]]
    assert stops.first_stop(long, 1) == (1, "2 w3") and stops.first_stop(long[:-1], 1) is None


