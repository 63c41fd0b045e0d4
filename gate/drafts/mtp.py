"""Multi-token prediction: the target's own MTP layers as the draft (`kind: mtp`).

Models that ship MTP layers (DeepSeek-V3, GLM-4.5, MiMo, Qwen3-Next and others) predict
further tokens from the target's own hidden state with extra layers trained with it. The
draft is part of the target's checkpoint: nothing to point at but the number of proposals.
It gives a distribution q per proposal (the layers' softmax), so rejection sampling keeps
the output law exactly p (Leviathan et al. 2023, Thm 1).

Served only: gate's own loop does not run MTP layers. vLLM serves it as
`{"method": "mtp", "num_speculative_tokens": K}`; SGLang as `--speculative-algorithm NEXTN`
(or EAGLE on the MTP layers); TensorRT-LLM as `speculative_config: {decoding_type: MTP,
num_nextn_predict_layers: K}`. `gate validate` refuses it for a target whose config declares
no MTP layers (num_nextn_predict_layers, mtp_num_hidden_layers, num_mtp_layers).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict

from gate.core.errors import PolicyValueError
from gate.drafts.interface import BuildContext, BuiltDraft, DraftKind, DraftSpecBase, VLLMContext, VLLMDraft

# the config fields in which models declare their MTP layers (top level, or the text config's)
MTP_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")


class MTPDraftSpec(DraftSpecBase):
    """The target's own multi-token-prediction layers (gate.drafts.mtp). Served engines only:
    vLLM {"method": "mtp"}, SGLang --speculative-algorithm NEXTN, TensorRT-LLM decoding_type MTP.
    Gives a full distribution q: exact under rejection sampling (Leviathan et al. 2023, Thm 1)."""

    model_config = ConfigDict(title="MTPDraft")

    kind: Literal["mtp"]


def mtp_layers(config: Any) -> int:
    """How many MTP layers a transformers config declares (0: none)."""
    for c in (config, getattr(config, "text_config", None)):
        for field in MTP_FIELDS:
            n = getattr(c, field, None) if c is not None else None
            if isinstance(n, int) and n > 0:
                return n
    return 0


def _check_target_config(name: str, spec: MTPDraftSpec, config: Any) -> None:
    if not mtp_layers(config):
        raise PolicyValueError(
            f"drafts.{name}.kind",
            f"an mtp draft is the target's own multi-token-prediction layers, and the target's config declares "
            f"none ({', '.join(MTP_FIELDS)}): name a target that ships them, or another draft kind",
        )


def _not_in_process(name: str, spec: MTPDraftSpec) -> tuple[str, str]:
    return (
        f"drafts.{name}.kind",
        "gate's own loop does not run a target's MTP layers: serve the target with an engine that does "
        "(runner.kind vllm, or openai against vLLM, SGLang or TensorRT-LLM)",
    )


def _build(name: str, spec: MTPDraftSpec, ctx: BuildContext) -> BuiltDraft:
    raise PolicyValueError(*_not_in_process(name, spec))


def _vllm(name: str, spec: MTPDraftSpec, ctx: VLLMContext) -> VLLMDraft:
    return VLLMDraft({"method": "mtp", "num_speculative_tokens": spec.num_draft_tokens})


KIND = DraftKind(
    name="mtp",
    spec=MTPDraftSpec,
    probability_info="distribution",
    build=_build,
    check_target_config=_check_target_config,
    vllm=_vllm,
    not_in_process=_not_in_process,
)
