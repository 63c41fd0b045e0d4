"""Mistakes `gate validate` catches before anything runs (exit 2 with file, YAML path and
line), and robustness fixes found by using the product as a new user."""

from __future__ import annotations


import pytest
import torch
from click.testing import CliRunner

from gate.cli import cli


def test_greedy_check_judges_every_token_by_its_distance_from_the_top():
    from gate.exactness.collect import greedy_divergences

    logits = torch.tensor([[5.0, 4.999, 0.0, -3.0],   # near-tie at the top, but token 3 is 8 logits below it
                           [0.0, 2.0, 1.0, 0.0],      # correct (argmax 1)
                           [1.0, 0.0, 0.9995, 0.0]])  # a genuine near-tie: token 2 is 0.0005 below
    found = greedy_divergences(logits, [3, 1, 2], "p")
    assert [(d.position, d.target_token, d.draft_token) for d in found] == [(0, 0, 3), (2, 0, 2)]
    assert found[0].gap_logits == pytest.approx(8.0) and found[1].gap_logits == pytest.approx(0.0005, abs=1e-6)


def test_bill_of_a_config_that_is_not_a_causal_lm_is_a_usage_error(tmp_path):
    from transformers import T5Config

    T5Config().save_pretrained(tmp_path / "t5")
    result = CliRunner().invoke(cli, ["bill", "--target", str(tmp_path / "t5")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
