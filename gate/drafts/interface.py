"""What every proposal mechanism gives the in-process runner, and how a draft kind is declared.

A draft states its probability information, because overlap and the correctness
argument depend on it:
- "distribution": a full q per position; exact under rejection sampling
  (Leviathan et al. 2023, Thm 1).
- "point_mass": a deterministic proposal x, i.e. q = one-hot(x); accepted with
  probability p(x), and the residual is p with x removed, renormalised.

Below the Draft interface: what a draft kind declares (DraftKind, its spec base, and the
contexts its hooks receive), listed in gate.drafts.registry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from gate.core.law import Law
from gate.measure.bill import DraftBill
from gate.measure.kv import KVFormat
from gate.measure.speculation import ProposalFloor, every_step
from gate.models.loading import model_info  # noqa: F401 - what a kind records of its model (re-exported)
from gate.records import ModelInfo

ProbabilityInfo = Literal["distribution", "point_mass"]
DType = Literal["float32", "bfloat16", "float16"]  # weight dtypes a policy may name (gate.policy.model uses this one)


@dataclass
class Proposal:
    """`tokens` [n] proposed after the context, with `q` [n, V] float32 (one-hot for point masses).

    Cross-tokenizer drafts (gate.drafts.cross_tokenizer) also say what translating cost:
    `mapping_ms`, the wall time (ms) this propose call spent translating between the two
    tokenizers (decoding, re-encoding, mapping q; not the draft's forwards), and
    `draft_tokens`, the tokens the draft proposed in its own vocabulary before translation
    (None: the same as len(tokens))."""

    tokens: torch.Tensor
    q: torch.Tensor
    mapping_ms: float = 0.0
    draft_tokens: int | None = None


class Draft(ABC):
    """A proposal mechanism. One instance serves one request at a time (start() resets it)."""

    name: str
    kind: str
    probability_info: ProbabilityInfo
    num_draft_tokens: int
    # True: the runner passes the target's hidden state to observe_target_hidden after the
    # prefill and after every verification (draft heads on the target's backbone, gate.drafts.heads)
    uses_target_hidden: bool = False
    # True (with uses_target_hidden): the runner passes the hidden states of every position whose logits gave a
    # committed token, not only the last (an EAGLE draft's layer attends over all of them, gate.drafts.eagle)
    target_hidden_history: bool = False

    def start(self) -> None:
        """Forget any state of a previous request (caches)."""

    def observe_target_hidden(self, hidden: torch.Tensor) -> None:
        """The target's last-layer hidden state [H] (the input of its lm_head, after the final
        norm) at the position whose logits gave the last committed token; called by the runner
        before the next propose when `uses_target_hidden` is True. Ignored by default."""

    def observe_target_states(self, states: torch.Tensor) -> None:
        """The target's hidden states [n, H] (as observe_target_hidden's) at the positions whose
        logits gave the tokens committed since the last call, in order: after the prefill every
        prompt position when `target_hidden_history` is True (else the last), after a step the
        accepted proposals' positions and the one that gave the next token. Called by the
        runner when `uses_target_hidden` is True. Default: observe_target_hidden(states[-1])."""
        self.observe_target_hidden(states[-1])

    @abstractmethod
    def propose(self, context: list[int], n: int, law: Law, generator: torch.Generator | None) -> Proposal:
        """Up to `n` proposals following `context` (prompt + committed tokens), drawn under `law`."""

    @abstractmethod
    def teacher_forced(self, ids: list[int], start: int, law: Law, vocab_size: int) -> torch.Tensor:
        """q at every position i >= start of `ids`, given ids[:i]: float32 [len(ids) - start, V].

        A point-mass draft returns one-hot rows, and all-zero rows where it proposes nothing."""

    def cache_bytes(self) -> int:
        """Measured bytes of the draft's own KV cache tensors now (0 when it has none)."""
        return 0

    def modules(self) -> list[torch.nn.Module]:
        """The modules whose weights the draft keeps resident (for the bill)."""
        return []


# ---------------------------------------------------------------------------------------
# Declaring a draft kind. Each kind module (model.py, early_exit.py, prompt_lookup.py)
# makes one `DraftKind` and gate.drafts.registry lists it; the policy's union, its kind
# messages, the bill, the roofline and validation are assembled from the registry.
# Nothing here imports gate.policy (policy imports drafts, never the other way).


class DraftSpecBase(BaseModel):
    """The policy fields every draft kind shares; a kind's spec subclasses it and adds
    `kind: Literal["<its name>"]` (the union's tag) and its own fields. Strict: unknown keys
    are errors, and specs are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    if TYPE_CHECKING:  # each kind declares its own Literal tag; the type checker reads it here
        kind: str

    num_draft_tokens: int = Field(4, ge=1, le=64, description="Proposals per verification step (gamma).")
    num_draft_tokens_sweep: list[Annotated[int, Field(ge=0, le=64)]] | None = Field(
        None,
        min_length=1,
        description="Also measure this draft with each of these num_draft_tokens (0: speculation "
        "off, which is the fallback): each value runs as its own runner '<name>.k<K>' (a managed server restarted "
        "with that K), and the report picks the best K per load point (gate.analysis.schedule).",
    )


@dataclass(frozen=True)
class ModelRef:
    """A model source named in the policy (not yet resolved): `model`, `gguf_file`, and the
    YAML path errors about it are reported at (e.g. drafts.small.model)."""

    model: str
    gguf_file: str | None
    yaml_path: str


@dataclass(frozen=True)
class BuildContext:
    """What building an in-process draft may use: the loaded target (module, tokenizer,
    device), the width of the target's logits (`vocab_size`, token ids), the target's dtype
    name ("float32", ...), the policy file's folder (relative model paths) and the target's
    weights fingerprint when already computed (gate.models.loading.fingerprint; None: not yet)."""

    target: torch.nn.Module
    tokenizer: Any
    device: torch.device
    vocab_size: int
    target_dtype: str
    policy_dir: Path
    target_fingerprint: str | None = None


@dataclass(frozen=True)
class BuiltDraft:
    """A built draft and the model it loaded for the report (None: it loads no model)."""

    draft: Draft
    info: ModelInfo | None = None


@dataclass(frozen=True)
class ConfigContext:
    """What a kind may read to cost a draft without loading weights: the target's
    transformers config and dtype name, and `read_config(model, gguf_file, yaml_path)`, which
    resolves a model source named in the policy and returns its config (raising
    PolicyValueError at yaml_path when it cannot), and the policy's folder."""

    target_config: Any
    target_dtype: str
    read_config: Callable[[str, str | None, str], Any]
    policy_dir: Path = Path(".")  # the policy file's folder: relative paths of files a kind reads (a checkpoint)


@dataclass(frozen=True)
class DraftModelConfig:
    """The model a draft runs, from configs alone (gate bill, gate roofline): its transformers
    `config`, weight `dtype` and `quantization` ("none" or "int8_dynamic"), the dtype its KV
    cache is held at (`kv_dtype`; "auto" kv_dtype in the policy resolves to it), and whether its
    weights are the target's own (`shares_target_weights`: billed once, to the target)."""

    config: Any
    dtype: str
    quantization: str = "none"
    kv_dtype: str | None = None  # None: dtype
    shares_target_weights: bool = False
    own_vocab_size: int | None = (
        None  # a draft with its own tokenizer (cross_tokenizer): its logits' width, billed apart
    )
    # the draft's own weight bytes where the config would miscount them (an EAGLE layer: its config's embeddings and
    # head are the target's); None: counted from the config
    own_weight_bytes: int | None = None

    @property
    def cache_dtype(self) -> str:
        """The dtype name the draft's KV cache is billed at when the policy says kv_dtype auto."""
        return self.kv_dtype or self.dtype


def bill_from_modules(
    name: str, draft: Draft, target: torch.nn.Module, kv_format_of: Callable[[str], KVFormat]
) -> DraftBill:
    """A loaded draft's bill inputs (gate check): the cache of its first module's config at
    `kv_format_of(dtype name of that module)`, the weight bytes of its modules not shared
    with `target`, and whether it keeps a distribution q. A draft without modules bills no
    cache and no weights."""
    from gate.measure.kv import cache_model
    from gate.models.loading import dtype_name, weight_bytes

    modules = draft.modules()
    cache = cache_model(modules[0].config, kv_format_of(dtype_name(modules[0]))) if modules else None
    own = weight_bytes(*modules, exclude=[target]) if modules else 0
    return DraftBill(name, draft.num_draft_tokens, cache, own, draft.probability_info == "distribution")


def _every_step(spec: Any) -> ProposalFloor:
    return every_step(spec.num_draft_tokens)


def _no_model(name: str, spec: Any, ctx: ConfigContext) -> DraftModelConfig | None:
    return None


def _no_check(name: str, spec: Any, config: Any) -> None:
    return None


def _no_sources(name: str, spec: Any) -> list[ModelRef]:
    return []


def _no_problems(name: str, spec: Any, target: Any) -> list[tuple[str, str]]:
    return []


def _no_tokenizer_check(name: str, spec: Any, target_tokenizer: Any, policy_dir: Path) -> None:
    return None


def _no_files(name: str, spec: Any, policy_dir: Path, config: Any) -> None:
    return None


def _no_file_weights(name: str, spec: Any, policy_dir: Path) -> int:
    return 0


@dataclass(frozen=True)
class ServedContext:
    """What a draft kind needs to say how llama.cpp's llama-server runs it: the target's GGUF
    file (`target_gguf`), the policy's folder (`policy_dir`, for relative paths) and a folder
    for files gate writes (`cache_dir`, e.g. a truncated GGUF)."""

    target_gguf: str
    policy_dir: Any
    cache_dir: Any


@dataclass(frozen=True)
class ServedDraft:
    """How llama-server runs a draft: `draft_model` (a GGUF for -md, None for n-gram kinds),
    `spec_type` (--spec-type, e.g. "draft-simple", "ngram-simple") and further server
    arguments (`extra_args`, e.g. the n-gram size)."""

    draft_model: str | None
    spec_type: str
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class VLLMContext:
    """What a draft kind needs to say how vLLM runs it: the target's resolved model source
    (`target`, gate.models.loading.ModelSource), the policy's folder (`policy_dir`, for
    relative paths) and a folder for model directories gate writes (`cache_dir`)."""

    target: Any
    policy_dir: Any
    cache_dir: Any


@dataclass(frozen=True)
class VLLMDraft:
    """How vLLM runs a draft: its `--speculative-config` (a JSON object: method,
    num_speculative_tokens, model, prompt_lookup_max, ...)."""

    speculative_config: dict


@dataclass(frozen=True)
class DraftKind:
    """One draft kind, declared once in its own module and listed in gate.drafts.registry.

    - `name`: the policy's `kind:` tag; `spec`: its pydantic class (a DraftSpecBase with
      `kind: Literal[name]`), a member of the policy's DraftSpec union and JSON schema.
    - `probability_info`: "distribution" (a full q) or "point_mass" (bill: draft probabilities).
    - `build(name, spec, ctx: BuildContext) -> BuiltDraft`: the in-process Draft (gate check);
      raises PolicyValueError naming the YAML path.
    - `model_config(name, spec, ctx: ConfigContext) -> DraftModelConfig | None`: the model the
      draft runs, from configs alone, for `gate bill` and `gate roofline` (None: no model, no
      cache, no draft step cost).
    - `loaded_bill(name, draft, target, kv_format_of) -> DraftBill`: bill inputs from the
      loaded draft (default: its modules, see bill_from_modules).
    - `check_target_config(name, spec, config)`: validation against the target's config before
      any weight is loaded; raises PolicyValueError (e.g. early-exit depth).
    - `tokenizer_sources(name, spec) -> list[ModelRef]`: separate models whose tokenizer must
      match the target's (validation checks them without loading weights).
    - `policy_problems(name, spec, target_spec) -> [(yaml path, message)]`: cross-field checks
      against the policy's target section (e.g. a draft that is the target itself).
    - `check_tokenizer(name, spec, target_tokenizer, policy_dir)`: validation of a draft that
      brings its own tokenizer (cross_tokenizer: it loads); raises PolicyValueError.
    - `llama_server(name, spec, ctx: ServedContext) -> ServedDraft`: how llama.cpp's server runs
      it (runner kind llama_server); None: that runner cannot; raises PolicyValueError.
    - `vllm(name, spec, ctx: VLLMContext) -> VLLMDraft`: how vLLM runs it (runner kind vllm,
      its --speculative-config); None: vLLM cannot; raises PolicyValueError.
    - `check_files(name, spec, policy_dir, config)`: validation of files the draft reads (a heads
      checkpoint's header) against the target's config, without loading weights; relative
      paths are relative to `policy_dir`; raises PolicyValueError.
    - `file_weight_bytes(name, spec, policy_dir) -> int`: for a kind that runs no model of its own
      (model_config None) but keeps weights (trained heads): their bytes, read from its files
      without loading them, for `gate bill`; raises PolicyValueError.
    - `proposal_floor(spec) -> ProposalFloor`: the fewest proposing steps its outputs imply if
      speculation ran (gate.measure.speculation; default: a proposal at every step).
    - `not_in_process(name, spec) -> (YAML path, why) | None`: why gate's own loop cannot run
      this draft (an EAGLE-3 checkpoint: served engines only); gate validate refuses it with
      an in-process runner. Default: None (it can).
    - `low_acceptance_cause(spec) -> str | None`: what a served draft of this kind accepting
      almost nothing most likely means (an EAGLE checkpoint served under the wrong method); the
      acceptance rules that fail on such a draft say it. Default: None.
    - `modifies_target`: True for a kind whose draft ships a changed target (a jointly
      fine-tuned backbone, merged adapters): the policy must pin `target.release`, and the
      reports call the run's target an updated target for that draft (gate.loop.identity).
    - `translates_tokenizer`: True for a kind whose proposals are translated between the draft's
      tokenizer and the target's, so the mapping metrics (Metric.needs "translating_draft":
      mapping_ms and the like) are measured for it.
    """

    name: str
    spec: type[DraftSpecBase]
    probability_info: ProbabilityInfo
    build: Callable[[str, Any, BuildContext], BuiltDraft]
    model_config: Callable[[str, Any, ConfigContext], DraftModelConfig | None] = _no_model
    loaded_bill: Callable[[str, Draft, torch.nn.Module, Callable[[str], KVFormat]], DraftBill] = bill_from_modules
    check_target_config: Callable[[str, Any, Any], None] = _no_check
    tokenizer_sources: Callable[[str, Any], list[ModelRef]] = _no_sources
    policy_problems: Callable[[str, Any, Any], list[tuple[str, str]]] = _no_problems
    llama_server: Callable[[str, Any, ServedContext], ServedDraft] | None = None
    vllm: Callable[[str, Any, VLLMContext], VLLMDraft] | None = None
    check_tokenizer: Callable[[str, Any, Any, Path], None] = _no_tokenizer_check
    check_files: Callable[[str, Any, Path, Any], None] = _no_files
    file_weight_bytes: Callable[[str, Any, Path], int] = _no_file_weights
    proposal_floor: Callable[[Any], ProposalFloor] = _every_step
    low_acceptance_cause: Callable[[Any], str | None] = lambda spec: None
    not_in_process: Callable[[str, Any], tuple[str, str] | None] = lambda name, spec: None
    modifies_target: bool = False
    translates_tokenizer: bool = False
