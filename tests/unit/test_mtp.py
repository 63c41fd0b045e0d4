"""The `mtp` draft kind (gate.drafts.mtp): the target's own multi-token-prediction layers, served
only. It maps to vLLM's method mtp, is refused for a target whose config declares no MTP layers
(in any of the fields models use), and is refused in gate's own loop, saying where it runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gate.core.errors import PolicyValueError
from gate.drafts import registry as draft_kinds
from gate.drafts.interface import VLLMContext
from gate.drafts.mtp import KIND, mtp_layers


def test_vllm_runs_it_as_method_mtp_with_k_proposals(tmp_path) -> None:
    spec = KIND.spec(kind="mtp", num_draft_tokens=2)
    assert KIND.vllm("m", spec, VLLMContext(None, tmp_path, tmp_path)).speculative_config == {
        "method": "mtp", "num_speculative_tokens": 2}
    assert draft_kinds.get("mtp") is KIND and KIND.probability_info == "distribution"


@pytest.mark.parametrize("config, layers", [
    (SimpleNamespace(num_nextn_predict_layers=1), 1),  # DeepSeek-V3, GLM-4.5
    (SimpleNamespace(mtp_num_hidden_layers=2), 2),  # Qwen3-Next
    (SimpleNamespace(text_config=SimpleNamespace(num_nextn_predict_layers=1)), 1),  # a multimodal wrapper
    (SimpleNamespace(num_nextn_predict_layers=0), 0),
    (SimpleNamespace(hidden_size=576), 0),  # SmolLM2: none
])
def test_the_mtp_layers_a_config_declares(config, layers) -> None:
    assert mtp_layers(config) == layers


def test_a_target_without_mtp_layers_and_gates_own_loop_are_refused_at_the_kind() -> None:
    spec = KIND.spec(kind="mtp")
    with pytest.raises(PolicyValueError) as e:
        KIND.check_target_config("m", spec, SimpleNamespace(hidden_size=576))
    assert e.value.path == "drafts.m.kind" and "declares none" in e.value.message
    KIND.check_target_config("m", spec, SimpleNamespace(num_nextn_predict_layers=1))
    path, why = KIND.not_in_process("m", spec)
    assert path == "drafts.m.kind" and "does not run a target's MTP layers" in why and "vllm" in why
