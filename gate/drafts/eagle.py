"""EAGLE drafts: one decoder layer over the target's own features (Li et al. 2024, "EAGLE:
Speculative Sampling Requires Rethinking Feature Uncertainty", Sec. 4): the `eagle` kind.

The draft. The target's feature f_i at position i is its last-layer hidden state after the final
norm (the input of its lm_head). The draft's input at position i is the pair (e(x_{i+1}), f_i),
the embedding of the token that followed and the feature that predicted it, mapped by
`fc` (a [H, 2H] linear, no bias) and passed through one Llama decoder layer (its input norm
dropped, no final norm: the layout of EAGLE's reference code and of vLLM's EagleLlamaForCausalLM)
with its own KV cache over the positions before it. Its output predicts f_{i+1}; the target's
own lm_head turns that into logits for x_{i+2}. Autoregression: after proposing t_1 from the
last true pair, the next input is (e(t_1), the predicted feature), and so on for K proposals.
Embeddings and lm_head are the target's, shared and frozen: billed once, to the target; the
draft's own weights are fc and its layer; its KV cache is one layer's.

q. Proposal j is drawn from q_j = law(lm_head(predicted feature)), the declared law applied
exactly as to the target's logits (gate.core.law.law_probs); q_j depends on the committed
context and the proposals before it, so Leviathan et al.'s rejection rule (2023, Alg. 1,
Thm 1) keeps the output law exactly p, as for any draft with a full distribution.

The runner passes the target's features of every committed position (Draft.target_hidden_history:
after the prefill every prompt position, after a step the accepted proposals' and the next
token's), from the forwards it runs anyway: no extra target forward. A rejected step's
speculative entries of the draft's cache are rolled back at the next proposal.

Checkpoint: vLLM's EAGLE-1 format for Llama targets, a folder with `config.json` (a LlamaConfig
with num_hidden_layers 1, architectures ["LlamaForCausalLM"], which vLLM's EAGLEConfig renames
EagleLlamaForCausalLM) and `model.safetensors`
(`fc.weight` [H, 2H] and `layers.0.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
post_attention_layernorm}.weight`; no embeddings and no lm_head: vLLM then shares the target's; no
input norm and no fc bias: vLLM refuses the one and silently drops the other),
which `{"method": "eagle", "model": DIR}` serves; gate's provenance (the base's fingerprint, the
training) in `gate-eagle.json` beside them. gate runs method eagle in its own loop; method eagle3
(EAGLE-3: features from three target layers, a draft vocabulary) is declared for served engines
only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field

from gate.core.errors import PolicyValueError
from gate.core.law import Law, law_probs
from gate.core.speculative import sample
from gate.drafts.heads import checkpoint_folder, fit_vocab, output_head
from gate.drafts.interface import (
    BuildContext,
    BuiltDraft,
    ConfigContext,
    Draft,
    DraftKind,
    DraftModelConfig,
    DraftSpecBase,
    Proposal,
    VLLMContext,
    VLLMDraft,
    model_info,
)
from gate.measure.bill import DraftBill
from gate.models.cache import cache_kwarg, crop_to, forward, new_cache

CONFIG = "config.json"
TENSORS = "model.safetensors"
PROVENANCE = "gate-eagle.json"
ARCHITECTURE = "LlamaForCausalLM"  # vLLM's EAGLEConfig renames it EagleLlamaForCausalLM
LAYER_KEYS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_attention_layernorm.weight",
)


class EagleModule(torch.nn.Module):
    """fc and one Llama decoder layer (module docstring). `config`: the draft's LlamaConfig
    (num_hidden_layers 1); `embed`: the target's input embeddings (shared, not owned).
    forward(tokens [1, n], features [1, n, H], cache) -> predicted features [1, n, H]."""

    def __init__(self, config: Any, embed: torch.nn.Module):
        super().__init__()
        from transformers import LlamaModel

        self.config = config
        self.fc = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        body = LlamaModel(config)
        body.embed_tokens = embed  # the target's: inputs come as embeddings, shared with the target
        body.layers[0].input_layernorm = torch.nn.Identity()  # EAGLE's layer 0 has no input norm
        body.norm = torch.nn.Identity()  # and the draft no final norm
        self.body = body

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, cache: Any = None) -> torch.Tensor:
        embeds = self.body.embed_tokens(tokens).to(self.fc.weight.dtype)
        x = self.fc(torch.cat([embeds, features.to(self.fc.weight.dtype)], dim=-1))
        kwargs: dict[str, Any] = {"use_cache": cache is not None}
        if cache is not None:
            kwargs[cache_kwarg(type(self.body))] = cache
        return self.body(inputs_embeds=x, **kwargs).last_hidden_state

    def eagle_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights in vLLM's EAGLE-1 names (fc.weight, layers.0.*), without the shared embeddings."""
        out = {"fc.weight": self.fc.weight}
        for key in LAYER_KEYS:
            out[f"layers.0.{key}"] = self.body.layers[0].get_submodule(key.rsplit(".", 1)[0]).weight
        return {k: v.detach().contiguous() for k, v in out.items()}

    def load_eagle_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load weights in vLLM's EAGLE-1 names. Raises KeyError naming a missing tensor and
        ValueError for a shape that does not fit."""
        for name, param in self.eagle_state_dict().items():
            if name not in tensors:
                raise KeyError(name)
            if tuple(tensors[name].shape) != tuple(param.shape):
                raise ValueError(f"{name}: shape {tuple(tensors[name].shape)}, expected {tuple(param.shape)}")
        with torch.no_grad():
            self.fc.weight.copy_(tensors["fc.weight"])
            for key in LAYER_KEYS:
                self.body.layers[0].get_submodule(key.rsplit(".", 1)[0]).weight.copy_(tensors[f"layers.0.{key}"])


def eagle_config(target_config: Any, dtype: str = "float32") -> Any:
    """The draft's LlamaConfig for `target_config` (a Llama-family config): one layer of the
    target's width, heads and vocabulary, and vLLM's EAGLE architecture name."""
    from transformers import LlamaConfig

    fields = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "rms_norm_eps",
        "rope_theta",
        "max_position_embeddings",
        "hidden_act",
        "head_dim",
    )
    kwargs = {f: getattr(target_config, f) for f in fields if getattr(target_config, f, None) is not None}
    rope = getattr(target_config, "rope_scaling", None) or getattr(target_config, "rope_parameters", None)
    if rope is not None:
        kwargs["rope_scaling" if hasattr(target_config, "rope_scaling") else "rope_parameters"] = rope
    config = LlamaConfig(num_hidden_layers=1, tie_word_embeddings=False, torch_dtype=dtype, **kwargs)
    config.architectures = [ARCHITECTURE]
    return config


class EagleDraft(Draft):
    """Proposals from an EAGLE module on the target's features (module docstring). `target`:
    the loaded target (embeddings and lm_head shared; teacher_forced runs its forward);
    `vocab_size`: the width of the target's logits the verifier uses."""

    probability_info = "distribution"
    uses_target_hidden = True
    target_hidden_history = True

    def __init__(
        self,
        name: str,
        target: torch.nn.Module,
        module: EagleModule,
        num_draft_tokens: int,
        device: torch.device,
        vocab_size: int | None = None,
    ):
        self.name = name
        self.kind = "eagle"
        self.target = target
        self.module = module
        self.lm_head = output_head(target)
        self.num_draft_tokens = num_draft_tokens
        self.device = device
        self.vocab_size = vocab_size
        self._states: list[torch.Tensor] = []  # the target's features, one [n, H] block per observation
        self._known = 0  # positions whose features are known
        self._fed = 0  # true pairs in the draft's cache (beyond them: a step's speculative entries)
        self._tail: torch.Tensor | None = None  # the predicted feature after the last true pair [H]
        self._cache: Any = None

    def start(self) -> None:
        self._states, self._known, self._fed, self._tail = [], 0, 0, None
        self._cache = new_cache(self.module.config)

    def observe_target_states(self, states: torch.Tensor) -> None:
        self._states.append(states.reshape(-1, states.shape[-1]))
        self._known += self._states[-1].shape[0]

    def observe_target_hidden(self, hidden: torch.Tensor) -> None:
        self.observe_target_states(hidden)

    @torch.inference_mode()
    def propose(self, context: list[int], n: int, law: Law, generator: torch.Generator | None) -> Proposal:
        """Up to n proposals after `context`: the true pairs not yet in the draft's cache are fed
        (one forward), then one forward per further proposal. None until the features of every
        position but the last are known (the runner passes them)."""
        if self._cache is None:
            self.start()
        empty = Proposal(torch.empty(0, dtype=torch.long, device=self.device), torch.empty(0))
        pairs = len(context) - 1  # pair i: (x_{i+1}, f_i), for i < len(context) - 1
        if n <= 0 or pairs <= 0 or self._known < pairs:
            return empty
        crop_to(self._cache, self._fed)  # the last step's speculative entries
        if pairs > self._fed:
            features = torch.cat(self._states)[self._fed : pairs]
            tokens = torch.tensor([context[self._fed + 1 : pairs + 1]], device=self.device)
            self._tail = self.module(tokens, features.unsqueeze(0), self._cache)[0, -1]
            self._fed = pairs
        assert self._tail is not None
        feature, proposed, qs = self._tail, [], []
        for j in range(n):
            logits = self._aligned(self.lm_head(feature.to(self.lm_head.weight.dtype)))
            qs.append(law_probs(logits, law, context + proposed))
            proposed.append(sample(qs[-1], generator))
            if j + 1 < n:
                step = torch.tensor([[proposed[-1]]], device=self.device)
                feature = self.module(step, feature.reshape(1, 1, -1), self._cache)[0, -1]
        return Proposal(torch.tensor(proposed, device=self.device, dtype=torch.long), torch.stack(qs))

    @torch.inference_mode()
    def teacher_forced(self, ids: list[int], start: int, law: Law, vocab_size: int) -> torch.Tensor:
        """q at every position i >= start of `ids`: the law of the first proposal after
        committing ids[:i], i.e. the draft's output at pair i - 2 over the true pairs 0..i-2 (the
        target's features along ids, one target forward). float32 [len(ids) - start, V]; rows
        with i < 2 are all zeros (no pair yet: no proposal)."""
        width = len(ids) - start
        out = torch.zeros(width, vocab_size, dtype=torch.float32)
        if width <= 0 or len(ids) < 3:
            return out
        _, features = forward(self.target, torch.tensor([ids[:-2]], device=self.device), None, 1, hidden="all")
        tokens = torch.tensor([ids[1:-1]], device=self.device)  # pair r: (ids[r + 1], f_r)
        predicted = self.module(tokens, features, None)[0]  # row r predicts the feature giving ids[r + 2]
        first = max(start, 2)
        logits = self.lm_head(predicted[first - 2 :].to(self.lm_head.weight.dtype))
        out[first - start :] = law_probs(fit_vocab(logits, vocab_size), law, ids, first).float().cpu()
        return out

    def _aligned(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.vocab_size is None else fit_vocab(logits, self.vocab_size)

    def cache_bytes(self) -> int:
        from gate.models.cache import cache_tensor_bytes

        return cache_tensor_bytes(self._cache)

    def modules(self) -> list[torch.nn.Module]:
        return [self.module]


# ---------------------------------------------------------------------------------------
# Training (EAGLE, Li et al. 2024, Sec. 4.2): feature regression plus the target's next-token law


@dataclass
class EagleTraining:
    """A training run: `steps`, `sequences` per step, `positions` (pairs trained on), the mean
    loss over the first and the last 10% of steps (smooth L1 on features + 0.1 x soft
    cross-entropy, nats), the learning rate, the seed and the wall time (s)."""

    steps: int
    sequences: int
    positions: int
    first_loss: float
    last_loss: float
    lr: float
    seed: int
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def train_eagle(
    target: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    steps: int,
    batch: int = 4,
    lr: float = 3e-3,
    seed: int = 0,
    teacher_top_k: int = 32,
    cls_positions: int = 64,
    noise: float = 0.1,
    cls_weight: float = 0.1,
) -> tuple[EagleModule, EagleTraining]:
    """An EAGLE module for `target` (frozen) trained on token `sequences` (each at least 3
    tokens): one target forward per sequence gives its features f (after the final norm) and its
    top-`teacher_top_k` next-token probabilities; each step feeds `batch` sequences' true pairs
    (e(x_{r+1}), f_r + U(-noise, noise)) through the module and minimises EAGLE's loss
    (Li et al. 2024, Sec. 4.2): smooth L1 between the predicted and the true f_{r+1}, plus
    `cls_weight` (EAGLE's 0.1) x the soft cross-entropy of lm_head(predicted) against the target's law at r + 1 (on
    `cls_positions` random pairs per sequence: the lm_head is the costly part). AdamW, float32,
    seeded. Returns the module (eval, no grad) and its EagleTraining."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    lm_head = output_head(target)
    device = next(target.parameters()).device
    data = []
    with torch.no_grad():
        for seq in sequences:
            if len(seq) < 3:
                continue
            ids = torch.tensor([list(seq)], device=device)
            logits, features = forward(target, ids, hidden="all")
            top = logits[0].float().topk(teacher_top_k, dim=-1)
            data.append((ids[0], features[0].float(), top.indices, top.values.softmax(dim=-1)))
    if not data:
        raise ValueError("no sequence of at least 3 tokens to train on")
    module = EagleModule(eagle_config(target.config), target.get_input_embeddings()).float().to(device)
    params = [*module.fc.parameters(), *module.body.layers.parameters()]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    weight = lm_head.weight.detach().float()
    losses: list[float] = []
    for _ in range(steps):
        total = torch.zeros((), device=device)
        for i in torch.randint(0, len(data), (batch,), generator=generator).tolist():
            ids, f, top_ids, top_p = data[i]
            pairs = len(ids) - 2  # pair r: (ids[r + 1], f_r) predicts f_{r + 1}, the law of ids[r + 2]
            shaken = f[:pairs] + (torch.rand(f[:pairs].shape, generator=generator) * 2 - 1).to(device) * noise
            predicted = module(ids[1 : pairs + 1].unsqueeze(0), shaken.unsqueeze(0))[0]
            reg = torch.nn.functional.smooth_l1_loss(predicted, f[1 : pairs + 1])
            rows = torch.randperm(pairs, generator=generator)[:cls_positions].to(device)
            logq = torch.nn.functional.linear(predicted[rows], weight).log_softmax(dim=-1)
            cls = -(top_p[rows + 1] * logq.gather(-1, top_ids[rows + 1])).sum(-1).mean()
            total = total + reg + cls_weight * cls
        optimizer.zero_grad()
        (total / batch).backward()
        optimizer.step()
        losses.append(float(total.detach()) / batch)
    tenth = max(1, steps // 10)
    stats = EagleTraining(
        steps,
        batch,
        sum(len(d[0]) - 2 for d in data),
        sum(losses[:tenth]) / tenth,
        sum(losses[-tenth:]) / tenth,
        lr,
        seed,
        time.perf_counter() - started,
    )
    return module.eval().requires_grad_(False), stats


# ---------------------------------------------------------------------------------------
# The checkpoint (vLLM's EAGLE-1 format, module docstring)


def save_checkpoint(
    folder: str | Path, module: EagleModule, base: dict[str, Any], training: dict[str, Any] | None = None
) -> Path:
    """Write config.json, model.safetensors and gate-eagle.json into `folder` (created).
    `base`: gate.drafts.heads.base_identity of the target the draft was trained on."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    module.config.to_json_file(str(folder / CONFIG))
    save_file({k: v.cpu() for k, v in module.eagle_state_dict().items()}, str(folder / TENSORS))
    provenance = {"format": "gate-eagle", "version": 1, "method": "eagle", "base": base, "training": training or {}}
    (folder / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
    return folder


def read_config(folder: Path, yaml_path: str) -> Any:
    """The draft's config.json as a transformers config. Raises PolicyValueError at `yaml_path`."""
    from transformers import AutoConfig

    if not (folder / CONFIG).is_file():
        raise PolicyValueError(
            yaml_path, f"{folder} has no {CONFIG}: an EAGLE checkpoint is a folder in vLLM's format (gate.drafts.eagle)"
        )
    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds for a config it cannot read
        raise PolicyValueError(yaml_path, f"cannot read {folder / CONFIG}: {type(e).__name__}: {e}") from None


def check_config(config: Any, target_config: Any, yaml_path: str) -> None:
    """The draft's config fits the target's: one layer, the same width and vocabulary.
    Raises PolicyValueError naming what differs."""
    if getattr(config, "num_hidden_layers", None) != 1:
        raise PolicyValueError(yaml_path, f"an EAGLE-1 draft has 1 layer; its config says {config.num_hidden_layers}")
    for field in ("hidden_size", "vocab_size"):
        mine, theirs = getattr(config, field, None), getattr(target_config, field, None)
        if mine != theirs:
            raise PolicyValueError(yaml_path, f"the draft's {field} is {mine}, the target's {theirs}: not its draft")


def load_module(folder: Path, target: torch.nn.Module, yaml_path: str) -> EagleModule:
    """The EAGLE module of a checkpoint on the target's device and dtype, its embeddings the
    target's. Raises PolicyValueError at `yaml_path` for a checkpoint that does not fit."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = read_config(folder, yaml_path)
    check_config(config, target.config, yaml_path)
    try:
        tensors = load_file(str(folder / TENSORS))
    except (OSError, SafetensorError) as e:
        raise PolicyValueError(yaml_path, f"cannot read {folder / TENSORS}: {e}") from None
    param = next(target.parameters())
    module = EagleModule(config, target.get_input_embeddings())
    try:
        module.load_eagle_state_dict(tensors)
    except (KeyError, ValueError) as e:
        raise PolicyValueError(yaml_path, f"{folder / TENSORS}: {e}") from None
    return module.to(param.device, param.dtype).eval().requires_grad_(False)


# ---------------------------------------------------------------------------------------
# The draft kind


class EagleDraftSpec(DraftSpecBase):
    """An EAGLE draft: one decoder layer over the target's features (gate.drafts.eagle).

    Gives a full distribution q: exact under rejection sampling (Leviathan et al. 2023, Thm 1).
    Embeddings and lm_head are the target's (billed once); fc and the layer are the draft's
    weights; its KV cache is one layer's. gate's loop runs method eagle. Engines: vLLM
    {"method": "eagle" | "eagle3", "model": DIR}; SGLang --speculative-algorithm EAGLE | EAGLE3
    --speculative-draft-model-path DIR; TensorRT-LLM speculative_config {decoding_type: Eagle,
    speculative_model_dir: DIR, eagle3_one_model: false for eagle}."""

    model_config = ConfigDict(title="EagleDraft")

    kind: Literal["eagle"]
    checkpoint: str = Field(
        ..., description="Folder in vLLM's EAGLE format (config.json, model.safetensors); relative to the policy file."
    )
    method: Literal["eagle", "eagle3"] = Field(
        "eagle",
        description="How the checkpoint was trained: eagle (EAGLE-1/2, the last layer's features) or eagle3 "
        "(EAGLE-3: three layers' features, served engines only). Served as vLLM's --speculative-config method.",
    )


def _not_in_process(name: str, spec: EagleDraftSpec) -> tuple[str, str] | None:
    if spec.method == "eagle":
        return None
    return (
        f"drafts.{name}.method",
        f"gate's own loop runs EAGLE-1 drafts (method eagle); method {spec.method} is served by an engine "
        "(runner.kind vllm, or openai against one)",
    )


def _build(name: str, spec: EagleDraftSpec, ctx: BuildContext) -> BuiltDraft:
    at = f"drafts.{name}"
    refused = _not_in_process(name, spec)
    if refused is not None:
        raise PolicyValueError(*refused)
    try:
        output_head(ctx.target)
    except ValueError as e:
        raise PolicyValueError(at, str(e)) from None
    folder = checkpoint_folder(spec.checkpoint, ctx.policy_dir)
    _check_method(name, spec, folder, int(ctx.target.config.hidden_size))
    module = load_module(folder, ctx.target, f"{at}.checkpoint")
    draft = EagleDraft(name, ctx.target, module, spec.num_draft_tokens, ctx.device, vocab_size=ctx.vocab_size)
    from gate.models.loading import dtype_name

    return BuiltDraft(draft, model_info(name, str(folder), "eagle", dtype_name(module), module))


def _model_config(name: str, spec: EagleDraftSpec, ctx: ConfigContext) -> DraftModelConfig:
    """gate bill: the draft's config (its one layer's KV cache) and its own weights from the
    safetensors header (fc and the layer; embeddings and lm_head are the target's)."""
    return DraftModelConfig(
        _config(name, spec, ctx.policy_dir), ctx.target_dtype, own_weight_bytes=_file_bytes(name, spec, ctx.policy_dir)
    )


def _config(name: str, spec: EagleDraftSpec, policy_dir: Path) -> Any:
    return read_config(checkpoint_folder(spec.checkpoint, policy_dir), f"drafts.{name}.checkpoint")


def _file_bytes(name: str, spec: EagleDraftSpec, policy_dir: Path) -> int:
    """Bytes of the checkpoint's tensors, from the safetensors header (no tensor read)."""
    from safetensors import SafetensorError, safe_open

    file = checkpoint_folder(spec.checkpoint, policy_dir) / TENSORS
    try:
        with safe_open(str(file), framework="pt") as f:
            total = 0
            for key in f.keys():
                shape = f.get_slice(key).get_shape()
                numel = 1
                for d in shape:
                    numel *= d
                total += numel * _itemsize(f.get_slice(key).get_dtype())
            return total
    except (OSError, SafetensorError) as e:
        raise PolicyValueError(f"drafts.{name}.checkpoint", f"cannot read {file}: {e}") from None


def _itemsize(dtype: str) -> int:
    return {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I8": 1, "U8": 1, "F8_E4M3": 1, "F8_E5M2": 1}.get(dtype, 4)


def checkpoint_method(folder: Path, hidden_size: int, yaml_path: str) -> tuple[str, str] | None:
    """The method a checkpoint's tensors imply, read from its safetensors header (no tensor
    read), and the evidence: EAGLE-3's layout (`midlayer.*`, the `d2t` vocabulary map, or an fc
    over three or more layers' features: fc.weight [H, kH], k >= 3) or EAGLE-1's (fc.weight
    [H, 2H], the token's embedding and one feature). None when the tensors say neither. Raises
    PolicyValueError at `yaml_path` when the file cannot be read."""
    from safetensors import SafetensorError, safe_open

    file = folder / TENSORS
    try:
        with safe_open(str(file), framework="pt") as f:
            shapes = {key: list(f.get_slice(key).get_shape()) for key in f.keys()}
    except (OSError, SafetensorError) as e:
        raise PolicyValueError(yaml_path, f"cannot read {file}: {e}") from None
    if "d2t" in shapes or any(k.startswith("midlayer.") for k in shapes):
        return "eagle3", "its tensors have EAGLE-3's layout (midlayer.*, d2t)"
    fc = shapes.get("fc.weight")
    if fc is not None and len(fc) == 2 and fc[1] == 2 * hidden_size:
        return "eagle", f"fc.weight {fc}: the token's embedding and one layer's feature (EAGLE-1)"
    if fc is not None and len(fc) == 2 and fc[1] >= 3 * hidden_size and fc[1] % hidden_size == 0:
        return "eagle3", f"fc.weight {fc}: {fc[1] // hidden_size} layers' features (EAGLE-3)"
    return None


def _check_method(name: str, spec: EagleDraftSpec, folder: Path, hidden_size: int) -> None:
    """The declared method against the one the checkpoint's tensors imply: a mismatch is the
    SGLang #21272 case (an EAGLE-3 checkpoint served as EAGLE: acceptance length 1.0, no
    warning; vLLM refuses it at start). Raises PolicyValueError at drafts.<name>.method."""
    implied = checkpoint_method(folder, hidden_size, f"drafts.{name}.checkpoint")
    if implied is not None and implied[0] != spec.method:
        raise PolicyValueError(
            f"drafts.{name}.method",
            f"method {spec.method}, but the checkpoint is an {implied[0]} draft ({implied[1]}): served as "
            f"{spec.method} it proposes tokens the target rejects (SGLang #21272) or does not load (vLLM); "
            f"set method: {implied[0]}",
        )


def _check_files(name: str, spec: EagleDraftSpec, policy_dir: Path, config: Any) -> None:
    """gate validate: the declared method against the checkpoint's tensors, and config.json
    against the target's config, without reading tensors."""
    at = f"drafts.{name}.checkpoint"
    folder = checkpoint_folder(spec.checkpoint, policy_dir)
    draft_config = read_config(folder, at)
    _check_method(name, spec, folder, int(config.hidden_size))
    if spec.method == "eagle":
        check_config(draft_config, config, at)


def _loaded_bill(name: str, draft: Draft, target: torch.nn.Module, kv_format_of: Any) -> DraftBill:
    """fc and the layer (the checkpoint's tensors, as gate bill reads them from its header; the
    embeddings, lm_head and the rotary tables are the target's or recomputed); one layer's cache."""
    from gate.measure.kv import cache_model
    from gate.models.loading import dtype_name

    assert isinstance(draft, EagleDraft)
    own = sum(t.numel() * t.element_size() for t in draft.module.eagle_state_dict().values())
    cache = cache_model(draft.module.config, kv_format_of(dtype_name(draft.module)))
    return DraftBill(name, draft.num_draft_tokens, cache, own, True)


def _vllm(name: str, spec: EagleDraftSpec, ctx: VLLMContext) -> VLLMDraft:
    """vLLM's EAGLE proposers: `{"method": eagle|eagle3, "model": the checkpoint folder}`."""
    folder = checkpoint_folder(spec.checkpoint, Path(ctx.policy_dir))
    return VLLMDraft({"method": spec.method, "model": str(folder), "num_speculative_tokens": spec.num_draft_tokens})


def _low_acceptance_cause(spec: EagleDraftSpec) -> str:
    other = "eagle3" if spec.method == "eagle" else "eagle"
    return (
        f"the likely cause is the declared method ({spec.method}): a checkpoint trained as {other} and served as "
        f"{spec.method} proposes tokens the target rejects, slower than no speculation and without a warning "
        f"(SGLang #21272); check drafts.<name>.method against how the checkpoint was trained"
    )


KIND = DraftKind(
    name="eagle",
    spec=EagleDraftSpec,
    probability_info="distribution",
    build=_build,
    model_config=_model_config,
    loaded_bill=_loaded_bill,
    check_files=_check_files,
    vllm=_vllm,
    low_acceptance_cause=_low_acceptance_cause,
    not_in_process=_not_in_process,
)
