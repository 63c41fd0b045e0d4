"""`gate bill` and `gate roofline`: the resident resource bill of a policy (or of model
configs given directly, gate.loop.bill) and its place on the roofline, without running a model.
`gate check` bills the weights it actually loaded instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.drafts import registry as draft_kinds
from gate.loop.bill import config_context, meta_of, policy_bills, weights_of
from gate.measure.bill import kv_format
from gate.measure.kv import cache_model
from gate.metrics.catalogue import SPEEDUP
from gate.models.loading import read_config
from gate.records import FALLBACK


@dataclass(frozen=True)
class RooflineRow:
    """The fallback's decode step and a draft's verification step at one batch size."""

    runner: str
    steps: list[Any]
    ridge_batch: float  # batch at which this runner's step reaches the compute roof
    cost_coefficient: float | None  # predicted draft step time / target step time (batch 1)
    by_law: dict[str, dict[str, float | None]]  # law -> alpha (mean overlap), predicted and measured speedup


def policy_roofline(
    loaded: Any, bandwidth: float, peak_flops: float, batches: list[int], report: dict[str, Any] | None = None
) -> list[RooflineRow]:
    """Place the fallback decode step and every model draft's verification step on the
    roofline, from the target's and drafts' parameter and cache bytes at the policy's
    context. With a gate check report, the predicted speedup from its measured acceptance
    rate and the roofline's cost coefficient stands beside the measured speedup."""
    from gate.measure.roofline import predicted_speedup, ridge_batch, step
    from gate.models.loading import resolve_source

    policy = loaded.policy
    source = resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
    config = read_config(source, "target.model")
    params = sum(p.numel() for p in meta_of(config, "target.model").parameters())
    bills = {b.draft: b for b in policy_bills(loaded)}
    context = bills[FALLBACK].context_tokens
    kv = cache_model(config, kv_format(policy.resources, policy.target.dtype)).bytes_per_token
    width = _attention_width(config)
    weights = next(x.bytes for x in bills[FALLBACK].lines if x.name == "target weights")
    summary = {(r["runner"], r["law"]): r for r in (report or {}).get("summary", [])}
    rows = [
        RooflineRow(
            FALLBACK,
            [step("decode", params, weights, kv, context, b, 1, peak_flops, bandwidth, width) for b in batches],
            ridge_batch(params, weights, kv, context, 1, peak_flops, bandwidth, width),
            None,
            {},
        )
    ]
    target_step = step("decode", params, weights, kv, context, 1, 1, peak_flops, bandwidth, width).time_s
    ctx = config_context(loaded, config)
    for name, d in policy.drafts.items():
        k = d.num_draft_tokens + 1
        steps = [step("verify", params, weights, kv, context, b, k, peak_flops, bandwidth, width) for b in batches]
        c = 0.0  # a draft that runs no model (prompt lookup): no draft step
        m = draft_kinds.model_config(name, d, ctx)
        if m is not None:
            at = f"drafts.{name}"
            dparams = sum(p.numel() for p in meta_of(m.config, at).parameters())
            dkv = cache_model(m.config, kv_format(policy.resources, m.cache_dtype)).bytes_per_token
            c = (
                step(
                    "draft",
                    dparams,
                    weights_of(m.config, m.dtype, m.quantization, at),
                    dkv,
                    context,
                    1,
                    1,
                    peak_flops,
                    bandwidth,
                    _attention_width(m.config),
                ).time_s
                / target_step
            )
        by_law: dict[str, dict[str, float | None]] = {}
        for (runner, law), r in summary.items():
            # alpha in Leviathan et al.'s formula is the per-proposal acceptance probability:
            # the mean overlap (PRIMER), not vLLM's accepted / proposed, which also counts
            # proposals made after the first rejection
            if runner == name and r.get("overlap_mean") is not None:
                alpha = r["overlap_mean"]
                by_law[law] = {
                    "alpha": alpha,
                    "predicted_speedup": predicted_speedup(alpha, d.num_draft_tokens, c),
                    "measured_speedup": r.get(SPEEDUP.name),
                }
        rows.append(
            RooflineRow(
                name, steps, ridge_batch(params, weights, kv, context, k, peak_flops, bandwidth, width), c, by_law
            )
        )
    return rows


def _attention_width(config: Any) -> int:
    """layers x query heads x head_dim: attention FLOPs per token and context position / 4."""
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else 0)
    return int(config.num_hidden_layers) * heads * int(head_dim)
