"""Trained draft heads on the target's last hidden state (Medusa-1 style): the `heads` kind.

The draft runs no model of its own. Head k (k = 1..K) maps the target's last-layer hidden
state h (the input of its lm_head, after the final norm) to logits for the token k
positions after the token h's own logits give (Cai et al. 2024, "Medusa", Sec. 2.1.1):

    logits_k = lm_head(h + SiLU(W_k h + b_k))          W_k [H, H], b_k [H]

one residual block per head, with the target's own lm_head shared and frozen. Medusa gives
every head its own lm_head copy (H x V more parameters per head); sharing it keeps a head at
H*H + H parameters (0.33 M for SmolLM2's H = 576, against 28 M for an lm_head) and makes an
untrained head (W = 0, b = 0, Medusa's initialisation) predict exactly what the target's
next-token head predicts. The backbone and lm_head are the target's: billed once, to the
target; the heads' own bytes are the draft weights; there is no draft KV cache.

Proposals. After the runner commits a token, the draft holds h, the target's hidden state
at the position whose logits gave that token (the runner passes it, gate.drafts.interface
.Draft.observe_target_hidden, from the verification forward it runs anyway: no extra target
forward). Proposal j (j = 1..n <= K) is drawn from q_j = law(logits_j(h)), the declared law
applied exactly as to the target's logits (gate.core.law.law_probs). q_j depends on the committed
context only, not on proposals 1..j-1, so Leviathan et al.'s rejection rule (2023, Alg. 1,
Thm 1) keeps the output law exactly p. Probability information: "distribution" (one q per
head).

Checkpoint format (a folder; `save_checkpoint` writes it, `read_header`/`load_heads` read it):

- `heads.json`: {"format": "gate-heads", "version": 1, "head_type": "medusa1-resblock",
  "num_heads": K, "hidden_size": H, "vocab_size": V (the lm_head's output width),
  "lm_head": "target" (shared, frozen), "dtype": the tensors' dtype name,
  "base": {"fingerprint": gate.models.loading.fingerprint of the target the heads were trained
  on, "model_type", "num_hidden_layers", "hidden_size", "vocab_size", "dtype", "source"},
  "training": free-form provenance (data, tokens, steps, loss, seed, wall time, versions)}.
- `heads.safetensors`: "weight" [K, H, H] and "bias" [K, H] (safetensors).

`gate validate` reads heads.json only (format, version, sizes and the base's config fields
against the target's config); `gate check` also compares the base fingerprint with the
loaded target's and the tensors' shapes: heads trained on another backbone (another model,
another dtype of it) are a PolicyValueError at drafts.<name>.checkpoint.

Training (`train_heads`): self-distillation on the target's own distributions, Medusa-2's
KL loss (Cai et al. 2024, Sec. 2.3.2) applied to the heads alone (the backbone frozen, as in
Medusa-1, so the target being gated is unchanged): head k at position t is trained towards
the target's softmax at position t + k (the law of token t + k + 1 given the text up to it),
truncated to its top `teacher_top_k` tokens and renormalised.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field

from gate.core.dtypes import DTYPES
from gate.core.errors import PolicyValueError
from gate.core.law import Law, law_probs
from gate.core.speculative import sample
from gate.drafts.interface import (
    BuildContext,
    BuiltDraft,
    Draft,
    DraftKind,
    DraftSpecBase,
    Proposal,
    VLLMContext,
    VLLMDraft,
    model_info,
)
from gate.measure.bill import DraftBill
from gate.models.cache import forward

FORMAT = "gate-heads"
VERSION = 1
HEAD_TYPE = "medusa1-resblock"
HEADER = "heads.json"
TENSORS = "heads.safetensors"


class MedusaHeads(torch.nn.Module):
    """K residual blocks on a hidden state: state_k(h) = h + SiLU(W_k h + b_k) (Cai et al.
    2024, Sec. 2.1.1), to be followed by the target's lm_head. `weight` [K, H, H], `bias`
    [K, H], zero-initialised (an untrained head is the target's own next-token head)."""

    def __init__(self, num_heads: int, hidden_size: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(num_heads, hidden_size, hidden_size, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(num_heads, hidden_size, dtype=dtype))

    @property
    def num_heads(self) -> int:
        return int(self.weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.weight.shape[1])

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """Head states [k, N, H] for hidden states [N, H], heads 1..k (k = num_heads or K)."""
        k = self.num_heads if num_heads is None else num_heads
        h = hidden.to(self.weight.dtype)
        z = torch.einsum("nh,kgh->kng", h, self.weight[:k]) + self.bias[:k, None, :]
        return h.unsqueeze(0) + torch.nn.functional.silu(z)


def output_head(target: torch.nn.Module) -> torch.nn.Module:
    """The target's lm_head (its output embeddings). Raises ValueError when it has none."""
    head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
    if head is None:
        raise ValueError(f"{type(target).__name__} has no output embeddings (lm_head) to share")
    return head


def head_logits(
    heads: MedusaHeads, lm_head: torch.nn.Module, hidden: torch.Tensor, num_heads: int | None = None
) -> torch.Tensor:
    """Logits [k, N, V] of heads 1..k for hidden states [N, H], through the shared lm_head."""
    states = heads(hidden, num_heads)
    return lm_head(states.to(lm_head.weight.dtype))


class HeadsDraft(Draft):
    """Proposals from trained heads on the target's hidden state (module docstring).

    `target`: the loaded target (its lm_head is shared; teacher_forced runs its forward);
    `heads`: the MedusaHeads; `vocab_size`: the width of the target's logits the verifier
    uses (the lm_head's width may be larger; extra ids are dropped)."""

    probability_info = "distribution"
    uses_target_hidden = True

    def __init__(
        self,
        name: str,
        target: torch.nn.Module,
        heads: MedusaHeads,
        num_draft_tokens: int,
        device: torch.device,
        vocab_size: int | None = None,
    ):
        self.name = name
        self.kind = "heads"
        self.target = target
        self.heads = heads
        self.lm_head = output_head(target)
        self.num_draft_tokens = num_draft_tokens
        self.device = device
        self.vocab_size = vocab_size
        self._hidden: torch.Tensor | None = None

    def start(self) -> None:
        self._hidden = None

    def observe_target_hidden(self, hidden: torch.Tensor) -> None:
        self._hidden = hidden

    @torch.inference_mode()
    def propose(self, context: list[int], n: int, law: Law, generator: torch.Generator | None) -> Proposal:
        """min(n, K) proposals from heads 1..min(n, K) on the last observed hidden state; none
        before the runner has passed one (a one-token prompt in gate.runners' first steps)."""
        n = min(n, self.heads.num_heads)
        if self._hidden is None or n <= 0:
            return Proposal(torch.empty(0, dtype=torch.long, device=self.device), torch.empty(0))
        logits = self._aligned(head_logits(self.heads, self.lm_head, self._hidden.reshape(1, -1), n)[:, 0])
        tokens: list[int] = []
        qs = []
        for j in range(n):  # head j's law after the context and the proposals before it (penalties, grammar)
            qs.append(law_probs(logits[j], law, context + tokens))
            tokens.append(sample(qs[-1], generator))
        return Proposal(torch.tensor(tokens, device=self.device, dtype=torch.long), torch.stack(qs))

    @torch.inference_mode()
    def teacher_forced(self, ids: list[int], start: int, law: Law, vocab_size: int) -> torch.Tensor:
        """q at every position i >= start of `ids`: the law of the first proposal the draft
        makes after committing ids[:i], i.e. head 1 on the target's hidden state at position
        i - 2 (the state whose logits predict ids[i - 1]). float32 [len(ids) - start, V]; rows
        with i < 2 are all zeros (no hidden state yet: no proposal). One target forward.
        Heads 2..K propose further ahead: their own overlaps are `teacher_forced_heads`, and
        the speculative run's per-position acceptance counts (num_accepted_tokens_per_pos)
        measure them in the loop."""
        return self.teacher_forced_heads(ids, start, law, vocab_size, num_heads=1)[0]

    @torch.inference_mode()
    def teacher_forced_heads(
        self, ids: list[int], start: int, law: Law, vocab_size: int, num_heads: int | None = None
    ) -> torch.Tensor:
        """Per-head teacher-forced q: [k, len(ids) - start, V] float32, row j-1 giving at
        position i head j's q when the step started after ids[:i - j + 1], i.e. head j on the
        target's hidden state at position i - j - 1 (all zeros where that position is < 0).
        A diagnostic of how far ahead each head still agrees with the target."""
        k = self.heads.num_heads if num_heads is None else num_heads
        width = len(ids) - start
        out = torch.zeros(k, width, vocab_size, dtype=torch.float32)
        if width <= 0 or len(ids) < 3:
            return out
        _, hidden = forward(self.target, torch.tensor([ids[:-2]], device=self.device), hidden=True)
        hidden = hidden[0]  # [len(ids) - 2, H]: row r has seen ids[:r + 1]
        for j in range(1, k + 1):
            first = max(start, j + 1)  # position i needs row i - j - 1 >= 0
            if first >= len(ids):
                continue
            rows = hidden[first - j - 1 : len(ids) - j - 1]
            logits = head_logits(self.heads, self.lm_head, rows, j)[j - 1]
            q = law_probs(fit_vocab(logits, vocab_size), law, ids, first).cpu()
            out[j - 1, first - start :] = q
        return out

    def _aligned(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.vocab_size is None else fit_vocab(logits, self.vocab_size)

    def modules(self) -> list[torch.nn.Module]:
        return [self.heads]


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits [..., V'] on the verifier's vocabulary [..., vocab_size] (extra ids dropped,
    missing ones at -inf: q = 0)."""
    v = logits.shape[-1]
    if v == vocab_size:
        return logits
    if v > vocab_size:
        return logits[..., :vocab_size]
    pad = torch.full((*logits.shape[:-1], vocab_size - v), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=-1)


# ---------------------------------------------------------------------------------------
# The checkpoint format (module docstring)


def base_identity(target: torch.nn.Module, source: str) -> dict[str, Any]:
    """What heads.json records of the backbone: weight fingerprint, config fields, dtype, source."""
    from gate.models.loading import dtype_name, fingerprint

    config = target.config
    return {
        "fingerprint": fingerprint(target),
        "model_type": getattr(config, "model_type", None),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
        "hidden_size": int(config.hidden_size),
        "vocab_size": int(output_head(target).weight.shape[0]),
        "dtype": dtype_name(target),
        "source": source,
    }


def save_checkpoint(
    folder: str | Path, heads: MedusaHeads, base: dict[str, Any], training: dict[str, Any] | None = None
) -> Path:
    """Write heads.json and heads.safetensors into `folder` (created). `base`: base_identity
    of the target the heads were trained on. Returns the folder."""
    from safetensors.torch import save_file

    from gate.models.loading import dtype_name

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "head_type": HEAD_TYPE,
        "num_heads": heads.num_heads,
        "hidden_size": heads.hidden_size,
        "vocab_size": base["vocab_size"],
        "lm_head": "target",
        "dtype": dtype_name(heads),
        "base": base,
        "training": training or {},
    }
    save_file(
        {"weight": heads.weight.detach().contiguous().cpu(), "bias": heads.bias.detach().contiguous().cpu()},
        str(folder / TENSORS),
        metadata={"format": FORMAT},
    )
    (folder / HEADER).write_text(json.dumps(header, indent=2) + "\n")
    return folder


def checkpoint_folder(checkpoint: str, policy_dir: Path) -> Path:
    """The checkpoint folder a policy names: absolute, `~`-expanded, or relative to the policy file."""
    path = Path(checkpoint).expanduser()
    return path if path.is_absolute() else Path(policy_dir) / path


def read_header(folder: Path, yaml_path: str) -> dict[str, Any]:
    """heads.json of a checkpoint folder, its fields checked (no tensor read). Raises
    PolicyValueError at `yaml_path` for a missing folder or file, or a header that is not
    this format and version."""
    file = folder / HEADER
    if not folder.is_dir():
        raise PolicyValueError(
            yaml_path,
            f"no heads checkpoint folder at {folder} (it holds {HEADER} and {TENSORS}; "
            "examples/heads/train_heads.py writes one for SmolLM2)",
        )
    try:
        header = json.loads(file.read_text())
    except FileNotFoundError:
        raise PolicyValueError(yaml_path, f"{folder} has no {HEADER}: not a heads checkpoint") from None
    except (OSError, ValueError) as e:
        raise PolicyValueError(yaml_path, f"cannot read {file}: {e}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise PolicyValueError(
            yaml_path,
            f"{file} is not a {FORMAT} header (format: {header.get('format') if isinstance(header, dict) else None!r})",
        )
    if header.get("version") != VERSION or isinstance(header.get("version"), bool):
        raise PolicyValueError(
            yaml_path, f"{file} is {FORMAT} version {header.get('version')!r}; this gate reads version {VERSION}"
        )
    if header.get("head_type") != HEAD_TYPE or header.get("lm_head") != "target":
        raise PolicyValueError(
            yaml_path,
            f"{file}: head_type {header.get('head_type')!r} with lm_head {header.get('lm_head')!r}; "
            f"this gate runs {HEAD_TYPE!r} heads sharing the target's lm_head",
        )
    for key in ("num_heads", "hidden_size", "vocab_size"):
        if not isinstance(header.get(key), int) or isinstance(header.get(key), bool) or header[key] < 1:
            raise PolicyValueError(yaml_path, f"{file}: {key} must be a positive integer (got {header.get(key)!r})")
    if header.get("dtype") not in DTYPES or not isinstance(header.get("base"), dict):
        raise PolicyValueError(yaml_path, f"{file}: needs dtype (one of {', '.join(DTYPES)}) and a base object")
    return header


def check_header_config(header: dict[str, Any], config: Any, yaml_path: str) -> None:
    """The header against the target's transformers config (no weights): hidden size,
    lm_head width (vocab_size, when the config states it) and the base's model_type and layer
    count. Raises PolicyValueError at `yaml_path` naming the first difference."""
    base = header["base"]
    checks = [
        ("hidden_size", header["hidden_size"], getattr(config, "hidden_size", None)),
        ("vocab_size", header["vocab_size"], getattr(config, "vocab_size", None)),
        ("base.model_type", base.get("model_type"), getattr(config, "model_type", None)),
        ("base.num_hidden_layers", base.get("num_hidden_layers"), getattr(config, "num_hidden_layers", None)),
    ]
    for key, theirs, ours in checks:
        if theirs is not None and ours is not None and theirs != ours:
            raise PolicyValueError(
                yaml_path,
                f"the heads were trained on another backbone: {key} is {theirs!r} in "
                f"{HEADER}, {ours!r} in the target's config",
            )


def load_heads(
    folder: Path,
    target: torch.nn.Module,
    yaml_path: str,
    check_fingerprint: bool = True,
    target_fingerprint: str | None = None,
) -> tuple[MedusaHeads, dict[str, Any]]:
    """The heads of a checkpoint folder for `target`, on its device and at its lm_head's
    dtype, and their header. Checks the header (read_header, check_header_config), that the
    base fingerprint equals the target's (`target_fingerprint` when the caller has it, else
    gate.models.loading.fingerprint; heads are trained on
    one backbone's hidden states) and the tensors' shapes. Raises PolicyValueError at
    `yaml_path`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from gate.models.loading import fingerprint

    header = read_header(folder, yaml_path)
    check_header_config(header, target.config, yaml_path)
    if check_fingerprint:
        ours = target_fingerprint or fingerprint(target)  # the session's, when given: hashing the target is seconds
        if header["base"].get("fingerprint") != ours:
            raise PolicyValueError(
                yaml_path,
                f"the heads were trained on another backbone: base fingerprint "
                f"{header['base'].get('fingerprint')!r} in {HEADER} (dtype {header['base'].get('dtype')}), the "
                f"loaded target's is {ours!r}; retrain the heads on this target (and dtype)",
            )
    try:
        tensors = load_file(str(folder / TENSORS))
    except (OSError, SafetensorError) as e:
        raise PolicyValueError(yaml_path, f"cannot read {folder / TENSORS}: {e}") from None
    k, h = header["num_heads"], header["hidden_size"]
    want = {"weight": (k, h, h), "bias": (k, h)}
    for key, shape in want.items():
        if key not in tensors or tuple(tensors[key].shape) != shape:
            got = tuple(tensors[key].shape) if key in tensors else None
            raise PolicyValueError(
                yaml_path, f"{folder / TENSORS}: tensor {key!r} has shape {got}, {HEADER} says {shape}"
            )
    lm_head = output_head(target)
    heads = MedusaHeads(k, h, dtype=lm_head.weight.dtype)
    with torch.no_grad():
        heads.weight.copy_(tensors["weight"])
        heads.bias.copy_(tensors["bias"])
    heads.requires_grad_(False)
    return heads.to(lm_head.weight.device).eval(), header


# ---------------------------------------------------------------------------------------
# Training


@dataclass
class TeacherStates:
    """What training reads of the target, from one forward per sequence: `hidden` [N, H]
    (the lm_head's input, float32), `top_ids` [N, k] and `top_probs` [N, k] (the target's
    softmax at temperature 1 over its top k tokens, renormalised), and `seq_end` [N] (the
    index one past the last row of each row's sequence: a head may not read past it) and
    `trainable` [N] bool (rows a head is trained at: those at or after each sequence's start)."""

    hidden: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    seq_end: torch.Tensor
    trainable: torch.Tensor


@torch.no_grad()
def teacher_states(
    target: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    teacher_top_k: int = 32,
    device: torch.device | None = None,
    starts: Sequence[int] | None = None,
) -> TeacherStates:
    """One target forward per token sequence (each at least 2 tokens), keeping every position's
    hidden state and the target's top-`teacher_top_k` next-token probabilities. `starts`: per
    sequence, the first row heads are trained at (e.g. where the target's own continuation
    begins after a prompt; default 0: every row)."""
    device = device or next(target.parameters()).device
    hidden, ids, probs, ends, trainable = [], [], [], [], []
    total = 0
    for i, seq in enumerate(sequences):
        if len(seq) < 2:
            continue
        logits, h = forward(target, torch.tensor([list(seq)], device=device), hidden=True)
        top = logits[0].float().topk(teacher_top_k, dim=-1)
        hidden.append(h[0].float().cpu())
        ids.append(top.indices.cpu())
        probs.append(top.values.softmax(dim=-1).cpu())
        total += len(seq)
        ends.append(torch.full((len(seq),), total, dtype=torch.long))
        trainable.append(torch.arange(len(seq)) >= (starts[i] if starts is not None else 0))
    if not hidden:
        raise ValueError("no sequence of at least 2 tokens to train on")
    return TeacherStates(torch.cat(hidden), torch.cat(ids), torch.cat(probs), torch.cat(ends), torch.cat(trainable))


@dataclass
class TrainingStats:
    """A training run: `steps`, `batch_size`, `positions` (trainable rows of hidden states), the mean
    loss per head over the first and the last 10% of steps (soft cross-entropy, nats), the
    learning rate, the seed and the wall time (s)."""

    steps: int
    batch_size: int
    positions: int
    first_loss: list[float] = field(default_factory=list)
    last_loss: list[float] = field(default_factory=list)
    lr: float = 0.0
    seed: int = 0
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "batch_size": self.batch_size,
            "positions": self.positions,
            "first_loss": [round(x, 4) for x in self.first_loss],
            "last_loss": [round(x, 4) for x in self.last_loss],
            "lr": self.lr,
            "seed": self.seed,
            "wall_s": round(self.wall_s, 2),
        }


def train_heads(
    target: torch.nn.Module,
    states: TeacherStates,
    num_heads: int,
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
) -> tuple[MedusaHeads, TrainingStats]:
    """Train K = `num_heads` heads on `states` with the target frozen (self-distillation,
    module docstring): each step draws `batch_size` trainable rows t (seeded torch.Generator) and
    minimises, for every head k, -sum_x p_{t+k}(x) log q_k(x | h_t), p_{t+k} being the
    target's truncated softmax at row t + k of the same sequence (rows without one are
    masked out). AdamW, float32, on the CPU (where `states` live). Deterministic for a given
    seed, data and thread count. Returns the heads (eval, no grad) and the run's TrainingStats."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    lm_head = output_head(target)
    h = states.hidden.shape[1]
    heads = MedusaHeads(num_heads, h, torch.float32)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    n = states.hidden.shape[0]
    rows = states.trainable.nonzero().flatten()
    losses: list[list[float]] = []
    weight = lm_head.weight.detach().float().cpu()
    bias = lm_head.bias.detach().float().cpu() if getattr(lm_head, "bias", None) is not None else None
    for _ in range(steps):
        t = rows[torch.randint(0, len(rows), (batch_size,), generator=generator)]
        states_k = heads(states.hidden[t])  # [K, B, H]
        logits = torch.nn.functional.linear(states_k, weight, bias)  # [K, B, V]
        logq = logits.log_softmax(dim=-1)
        step_losses = []
        total = logq.new_zeros(())
        for k in range(1, num_heads + 1):
            target_rows = t + k
            valid = target_rows < states.seq_end[t]
            target_rows = target_rows.clamp(max=n - 1)
            lp = logq[k - 1].gather(-1, states.top_ids[target_rows])  # [B, top_k]
            per_row = -(states.top_probs[target_rows] * lp).sum(-1)
            loss_k = (per_row * valid).sum() / valid.sum().clamp_min(1)
            total = total + loss_k
            step_losses.append(float(loss_k.detach()))
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        losses.append(step_losses)
    tenth = max(1, steps // 10)

    def mean(rows_: list[list[float]]) -> list[float]:
        return [sum(r[k] for r in rows_) / len(rows_) for k in range(num_heads)] if rows_ else []

    stats = TrainingStats(
        steps,
        batch_size,
        int(len(rows)),
        mean(losses[:tenth]),
        mean(losses[-tenth:]),
        lr,
        seed,
        time.perf_counter() - started,
    )
    heads.requires_grad_(False)
    return heads.eval(), stats


# ---------------------------------------------------------------------------------------
# The draft kind


class HeadsDraftSpec(DraftSpecBase):
    """Trained heads on the target's last hidden state (Medusa-1 style, gate.drafts.heads).

    Gives a full distribution q per head: exact under rejection sampling (Leviathan et al.
    2023, Thm 1). The backbone and lm_head are the target's (billed once); the heads' own
    weights are the draft's; no draft KV cache. num_draft_tokens must not exceed the
    checkpoint's num_heads. Engines: vLLM's Medusa proposer (gate exports the heads to its
    format; it proposes each head's top-1 token); TensorRT-LLM decoding_type Medusa."""

    model_config = ConfigDict(title="HeadsDraft")

    kind: Literal["heads"]
    checkpoint: str = Field(
        ...,
        description="Folder with heads.json and heads.safetensors (gate.drafts.heads); relative to the policy file.",
    )


def _build(name: str, spec: HeadsDraftSpec, ctx: BuildContext) -> BuiltDraft:
    """The heads of the policy's checkpoint on the loaded target (load_heads: header, base
    fingerprint and shapes checked), at the target's lm_head dtype. Raises PolicyValueError."""
    from gate.models.loading import dtype_name

    at = f"drafts.{name}.checkpoint"
    folder = checkpoint_folder(spec.checkpoint, ctx.policy_dir)
    try:
        output_head(ctx.target)
    except ValueError as e:
        raise PolicyValueError(at, str(e)) from None
    heads, header = load_heads(folder, ctx.target, at, target_fingerprint=ctx.target_fingerprint)
    _check_heads(name, spec, header)
    draft = HeadsDraft(name, ctx.target, heads, spec.num_draft_tokens, ctx.device, vocab_size=ctx.vocab_size)
    return BuiltDraft(draft, model_info(name, str(folder), "heads", dtype_name(heads), heads))


def _check_heads(name: str, spec: HeadsDraftSpec, header: dict[str, Any]) -> None:
    if spec.num_draft_tokens > header["num_heads"]:
        default = "" if "num_draft_tokens" in spec.model_fields_set else " (the default)"
        raise PolicyValueError(
            f"drafts.{name}.num_draft_tokens",
            f"the checkpoint has {header['num_heads']} heads, one per "
            f"proposal; num_draft_tokens {spec.num_draft_tokens}{default} is more: set num_draft_tokens "
            f"to at most {header['num_heads']}",
        )


def _check_files(name: str, spec: HeadsDraftSpec, policy_dir: Path, config: Any) -> None:
    """gate validate: heads.json against the target's config, no tensor read."""
    at = f"drafts.{name}.checkpoint"
    folder = checkpoint_folder(spec.checkpoint, policy_dir)
    header = read_header(folder, at)
    check_header_config(header, config, at)
    _check_heads(name, spec, header)
    _check_tensor_shapes(folder, header, at)


def _check_tensor_shapes(folder: Path, header: dict[str, Any], yaml_path: str) -> None:
    """heads.safetensors exists and its tensors have the shapes heads.json states, read from
    the safetensors header only (no tensor data). Raises PolicyValueError at `yaml_path`."""
    from safetensors import SafetensorError, safe_open

    file = folder / TENSORS
    try:
        with safe_open(str(file), framework="pt") as f:
            shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except (OSError, SafetensorError) as e:
        raise PolicyValueError(yaml_path, f"cannot read {file}: {e}") from None
    k, h = header["num_heads"], header["hidden_size"]
    for key, shape in {"weight": (k, h, h), "bias": (k, h)}.items():
        if shapes.get(key) != shape:
            raise PolicyValueError(
                yaml_path, f"{file}: tensor {key!r} has shape {shapes.get(key)}, {HEADER} says {shape}"
            )


def _loaded_bill(name: str, draft: Draft, target: torch.nn.Module, kv_format_of: Any) -> DraftBill:
    """The heads' own bytes (weight, bias); the backbone and lm_head are the target's; no cache."""
    from gate.models.loading import weight_bytes

    return DraftBill(name, draft.num_draft_tokens, None, weight_bytes(*draft.modules(), exclude=[target]), True)


def heads_weight_bytes(header: dict[str, Any]) -> int:
    """Bytes of a checkpoint's heads at its dtype, from heads.json: K x (H x H + H) x element size."""
    k, h = header["num_heads"], header["hidden_size"]
    return k * (h * h + h) * DTYPES[header["dtype"]].itemsize


def _file_weight_bytes(name: str, spec: HeadsDraftSpec, policy_dir: Path) -> int:
    """gate bill: the heads' bytes from heads.json (at the checkpoint's dtype; gate check bills
    them at the target's lm_head dtype they are loaded at)."""
    return heads_weight_bytes(read_header(checkpoint_folder(spec.checkpoint, policy_dir), f"drafts.{name}.checkpoint"))


def medusa_directory(folder: Path, header: dict[str, Any], target_dir: Path, num_heads: int, cache_dir: Path) -> Path:
    """The heads of checkpoint `folder` in vLLM's Medusa format, written once under `cache_dir`
    (a folder named by the heads' and target's files, never containing "eagle": vLLM reads a
    path holding "eagle-" or "eagle3" as an EAGLE draft whatever the method):

    - config.json: {"architectures": ["MedusaModel"], "model_type": "medusa", hidden_size,
      vocab_size, "num_heads": num_heads, "num_hidden_layers": 1, "truncated_vocab_size":
      vocab_size, "medusa_fc_bias": true, "original_lm_head": true};
    - model.safetensors: blocks.{k}.layers.0.{weight, bias} (W_k, b_k) for the first
      `num_heads` heads, and lm_head.weight, the target's own (read from `target_dir`, its
      Hugging Face directory: lm_head.weight, or the tied embeddings).

    vLLM's ResidualBlock computes x + SiLU(W x + b) and original_lm_head shares one lm_head
    among the heads: the heads' logits are gate's (module docstring). Raises OSError or
    ValueError for files that cannot be read or written."""
    import hashlib

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    key = hashlib.sha256(
        f"{folder.resolve()}|{(folder / TENSORS).stat().st_mtime_ns}|{target_dir}|{num_heads}".encode()
    )
    out = Path(cache_dir) / f"medusa-{key.hexdigest()[:16]}"
    if (out / "model.safetensors").is_file():
        return out
    tensors = load_file(str(folder / TENSORS))
    head = None
    for file in sorted(Path(target_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names = set(f.keys())
            for name in ("lm_head.weight", "model.embed_tokens.weight"):
                if name in names:
                    head = f.get_tensor(name)
                    break
        if head is not None:
            break
    if head is None:
        raise ValueError(f"no lm_head.weight or model.embed_tokens.weight in {target_dir}")
    weights = {"lm_head.weight": head.to(tensors["weight"].dtype).contiguous()}
    for k in range(num_heads):
        weights[f"blocks.{k}.layers.0.weight"] = tensors["weight"][k].contiguous()
        weights[f"blocks.{k}.layers.0.bias"] = tensors["bias"][k].contiguous()
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": header["hidden_size"],
        "vocab_size": int(head.shape[0]),
        "num_heads": num_heads,
        "num_hidden_layers": 1,
        "truncated_vocab_size": int(head.shape[0]),
        "medusa_fc_bias": True,
        "original_lm_head": True,
        "torch_dtype": header["dtype"],
    }
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _vllm(name: str, spec: HeadsDraftSpec, ctx: VLLMContext) -> VLLMDraft:
    """vLLM's Medusa proposer on the heads, exported to its format (medusa_directory). vLLM's
    Medusa proposes each head's top-1 token: its q is a point mass there (gate's own loop
    samples each head's law), so at temperature > 0 the served acceptance is lower and
    exactness still holds (Leviathan et al. 2023, Thm 1, with q a point mass)."""
    from gate.models.hf_export import hf_directory

    at = f"drafts.{name}.checkpoint"
    folder = checkpoint_folder(spec.checkpoint, Path(ctx.policy_dir))
    header = read_header(folder, at)
    _check_heads(name, spec, header)
    try:
        target_dir = hf_directory(ctx.target, cache_dir=ctx.cache_dir)
        out = medusa_directory(folder, header, target_dir, spec.num_draft_tokens, Path(ctx.cache_dir))
    except (OSError, ValueError) as e:
        raise PolicyValueError(at, f"cannot write the heads in vLLM's Medusa format: {e}") from None
    return VLLMDraft({"method": "medusa", "model": str(out), "num_speculative_tokens": spec.num_draft_tokens})


KIND = DraftKind(
    name="heads",
    spec=HeadsDraftSpec,
    probability_info="distribution",
    build=_build,
    loaded_bill=_loaded_bill,
    check_files=_check_files,
    file_weight_bytes=_file_weight_bytes,
    vllm=_vllm,
)
