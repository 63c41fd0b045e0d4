"""`gate exactness` on recorded samples: correct samples are not failed, corrupted ones are,
too few samples are inconclusive, bad files are exit 2 with file and line."""

from __future__ import annotations

import json
from pathlib import Path

import torch


CPU = torch.device("cpu")
# tiny random models have near-flat logits (top-2 gaps ~1e-3): no tie tolerance here
RULE = "  - id: exact\n    kind: exactness\n    detect_tv: 0.1\n    tie_tolerance: 0.0\n"


def test_samples_schema_is_checked_in():
    from gate.commands.exactness import samples_schema

    root = Path(__file__).resolve().parents[2]
    assert json.loads((root / "schemas" / "samples.schema.json").read_text()) == samples_schema()
