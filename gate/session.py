"""Resolve a validated policy into what the measurements need: the target, its engine,
every draft, the tokenized prompts and the laws. Every failure here is bad input: a
PolicyValueError naming the YAML path (the CLI adds file and line, exit code 2)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from gate.drafts.early_exit import early_exit_draft
from gate.drafts.interface import Draft
from gate.drafts.model import ModelDraft
from gate.drafts.prompt_lookup import PromptLookupDraft
from gate.engines.stop import StopStrings
from gate.engines.transformers import TransformersEngine
from gate.errors import PolicyValueError
from gate.law import Law
from gate.models import load as models
from gate.plan import PlannedPrompt
from gate.policy.load import LoadedPolicy
from gate.records import ModelInfo, WorkloadInfo
from gate.workloads.context import ContextBuilder, ContextError, Encode, check_fits
from gate.workloads.humaneval import HumanEval
from gate.workloads.interface import Prompt, WorkloadSource, choose
from gate.workloads.jsonl import JsonlPrompts
from gate.workloads.mt_bench import MTBench
from gate.workloads.sharegpt import ShareGPT, length_filter


@dataclass
class Session:
    """Everything loaded for one policy."""

    device: torch.device
    target: torch.nn.Module
    tokenizer: Any
    engine: TransformersEngine
    drafts: dict[str, Draft]
    laws: list[Law]
    prompts: list[PlannedPrompt]
    models: list[ModelInfo] = field(default_factory=list)
    workload: WorkloadInfo | None = None


def laws_of(loaded: LoadedPolicy) -> list[Law]:
    """The policy's laws as plain records."""
    return [Law(s.label, s.temperature, s.top_k, s.top_p) for s in loaded.policy.laws]


def workload_source(loaded: LoadedPolicy) -> WorkloadSource:
    """The policy's prompt source: one module per source under gate/workloads."""
    w = loaded.policy.workload
    if w.source == "jsonl":
        return JsonlPrompts(loaded.resolve(w.path or ""))
    return {"mt_bench": MTBench, "sharegpt": ShareGPT, "humaneval": HumanEval}[w.source]()


def encoder(tokenizer: Any, chat_template: bool) -> Encode:
    """messages -> the token ids the target is fed: the tokenizer's chat template with the
    generation prompt, or (chat_template false) the contents joined by blank lines."""

    def encode(messages: list[dict[str, str]]) -> list[int]:
        if chat_template:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if not isinstance(ids, list) else ids
        else:
            ids = tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"]
        return [int(i) for i in ids]

    return encode


def plan_workload(loaded: LoadedPolicy, tokenizer: Any, config: Any = None) -> tuple[list[PlannedPrompt], WorkloadInfo]:
    """The workload's prompts, selected (seeded), built to every context length and
    tokenized, with what the report records about how they were chosen.

    `config`: the target's model config; with it, every context length is first checked
    against the target's positions (gate.workloads.context.check_fits). Raises
    PolicyValueError for a missing package or file, a malformed line (its number is named),
    a selection that leaves no prompt, chat_template on a tokenizer without one, and a
    context length that does not fit the target or that no prompt or no text can reach."""
    policy = loaded.policy
    w = policy.workload
    if w.context_lengths and config is not None:
        gamma = max(d.num_draft_tokens for d in policy.drafts.values())
        check_fits(w.context_lengths, max(w.max_new_tokens_list), gamma, config)
    source = workload_source(loaded)
    everything = source.load()
    sharegpt = w.source == "sharegpt"
    accept = length_filter(tokenizer, **w.length_filter.model_dump()) if sharegpt else None
    chosen = choose(everything, w.seed, w.per_category, w.num_prompts, w.categories, accept)
    if not chosen.prompts:
        raise PolicyValueError("workload.categories" if w.categories else "workload", "the workload selects no prompt")
    if w.chat_template and not getattr(tokenizer, "chat_template", None):
        raise PolicyValueError("workload.chat_template", "the target tokenizer has no chat template; set chat_template: false")
    info = WorkloadInfo(
        source=w.source, seed=w.seed, available=sum(1 for p in everything if w.categories is None or p.category in w.categories),
        prompt_ids=[p.id for p in chosen.prompts], path=str(loaded.resolve(w.path)) if w.path else None,
        skipped=source.skipped(), examined=chosen.examined, pruned=chosen.pruned,
        length_filter=w.length_filter.model_dump() if sharegpt else None, context_lengths=list(w.context_lengths or []),
        stop=list(w.stop), notes=source.notes())
    encode = encoder(tokenizer, w.chat_template)
    if not w.context_lengths:
        return [PlannedPrompt(p.id, p.category, tuple(encode(p.messages))) for p in chosen.prompts], info
    builder = ContextBuilder(everything, tokenizer, encode, w.seed)
    return [c for i, length in enumerate(w.context_lengths) for c in _contexts(builder, chosen.prompts, length, i, info)], info


def _contexts(builder: ContextBuilder, questions: list[Prompt], length: int, index: int, info: WorkloadInfo) -> list[PlannedPrompt]:
    """Every question built to `length` tokens (those longer alone are recorded in info)."""
    where = f"workload.context_lengths[{index}]"
    out = []
    for q in questions:
        try:
            built = builder.build(q, length)
        except ContextError as e:
            raise PolicyValueError(where, f"cannot build a {length}-token context from real text: {e}") from None
        if built is None:
            info.context_skipped.append(f"{q.id}@{length}")
        else:
            out.append(PlannedPrompt(built.prompt.id, built.prompt.category, tuple(built.token_ids), length))
    if not out:
        raise PolicyValueError(where, f"every selected prompt is longer than {length} tokens by itself "
                               "(chat template included); ask for a longer context")
    return out


def load_prompts(loaded: LoadedPolicy, tokenizer: Any, config: Any = None) -> list[PlannedPrompt]:
    """The workload's prompts, as plan_workload builds them (same errors)."""
    return plan_workload(loaded, tokenizer, config)[0]


@dataclass
class Target:
    """The loaded target: model, tokenizer, engine and what was loaded."""

    device: torch.device
    model: torch.nn.Module
    tokenizer: Any
    engine: TransformersEngine
    info: ModelInfo


def open_target(loaded: LoadedPolicy, tokenizer: bool = True) -> Target:
    """Load the policy's target model (and its tokenizer unless `tokenizer` is False: scoring
    token ids needs none) and wrap them in an engine. Raises PolicyValueError."""
    policy = loaded.policy
    device = models.resolve_device(policy.target.device, "target.device")
    source = models.resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
    tok = models.load_tokenizer(source) if tokenizer else None
    target = models.load_model(source, policy.target.dtype, device)
    eos = {i for i in [getattr(tok, "eos_token_id", None), getattr(target.generation_config, "eos_token_id", None)]
           for i in (i if isinstance(i, list) else [i]) if i is not None}
    info = _info("target", str(source), "target", policy.target.dtype, target)
    stop = StopStrings(tok, policy.workload.stop) if policy.workload.stop and tok is not None else None
    return Target(device, target, tok, TransformersEngine(target, eos, device, stop), info)


def open_session(loaded: LoadedPolicy) -> Session:
    """Load target, drafts and prompts for a policy (models are loaded once each)."""
    policy = loaded.policy
    t = open_target(loaded)
    device, target, tokenizer, engine, infos = t.device, t.model, t.tokenizer, t.engine, [t.info]
    drafts: dict[str, Draft] = {}
    for name, spec in policy.drafts.items():
        path = f"drafts.{name}"
        if spec.kind == "prompt_lookup":
            drafts[name] = PromptLookupDraft(name, spec.max_ngram_size, spec.num_draft_tokens, engine.vocab_size, device)
        elif spec.kind == "early_exit":
            drafts[name] = early_exit_draft(name, target, spec.num_layers, spec.num_draft_tokens, device, f"{path}.num_layers")
            infos.append(_info(name, f"target[:{spec.num_layers}]", "early_exit", policy.target.dtype, drafts[name].model))
        else:
            dtype = spec.dtype or policy.target.dtype
            if spec.model == "target":
                model, label = copy.deepcopy(target).to(dtype=models.DTYPES[dtype]), "target"
            else:
                draft_source = models.resolve_source(spec.model, spec.gguf_file, loaded.path.parent, f"{path}.model")
                models.check_tokenizers(tokenizer, models.load_tokenizer(draft_source), f"{path}.model")
                model, label = models.load_model(draft_source, dtype, device), str(draft_source)
            if spec.quantization == "int8_dynamic":
                if device.type != "cpu":
                    raise PolicyValueError(f"{path}.quantization", "int8_dynamic (torch dynamic quantization) runs on the CPU only")
                if dtype != "float32":
                    raise PolicyValueError(f"{path}.dtype", "int8_dynamic quantizes float32 weights; leave dtype at float32")
                model = models.quantize_int8_dynamic(model)
            drafts[name] = ModelDraft(name, "model", model, spec.num_draft_tokens, device, vocab_size=engine.vocab_size)
            infos.append(_info(name, label, "model" + (f"+{spec.quantization}" if spec.quantization != "none" else ""), dtype, model))
    prompts, workload = plan_workload(loaded, tokenizer, target.config)
    return Session(device, target, tokenizer, engine, drafts, laws_of(loaded), prompts, infos, workload)


def _info(role: str, source: str, kind: str, dtype: str, model: torch.nn.Module) -> ModelInfo:
    params = sum(p.numel() for p in model.parameters())
    return ModelInfo(role, source, kind, dtype, models.fingerprint(model), params, models.weight_bytes(model))
