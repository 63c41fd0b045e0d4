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
from gate.engines.transformers import TransformersEngine
from gate.errors import PolicyValueError
from gate.law import Law
from gate.models import load as models
from gate.plan import PlannedPrompt
from gate.policy.load import LoadedPolicy
from gate.records import ModelInfo
from gate.workloads.interface import select
from gate.workloads.jsonl import JsonlPrompts
from gate.workloads.mt_bench import MTBench


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


def laws_of(loaded: LoadedPolicy) -> list[Law]:
    """The policy's laws as plain records."""
    return [Law(s.label, s.temperature, s.top_k, s.top_p) for s in loaded.policy.laws]


def load_prompts(loaded: LoadedPolicy, tokenizer: Any) -> list[PlannedPrompt]:
    """The workload's prompts, selected (seeded) and tokenized.

    Raises PolicyValueError for a missing package or file, a malformed line (its number is
    named), a selection that leaves no prompt, or chat_template on a tokenizer without one."""
    w = loaded.policy.workload
    source = MTBench() if w.source == "mt_bench" else JsonlPrompts(loaded.resolve(w.path or ""))
    prompts = select(source.load(), w.seed, w.per_category, w.num_prompts, w.categories)
    if not prompts:
        raise PolicyValueError("workload.categories" if w.categories else "workload", "the workload selects no prompt")
    if w.chat_template and not getattr(tokenizer, "chat_template", None):
        raise PolicyValueError("workload.chat_template", "the target tokenizer has no chat template; set chat_template: false")
    out = []
    for p in prompts:
        if w.chat_template:
            ids = tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if not isinstance(ids, list) else ids
        else:
            ids = tokenizer("\n\n".join(m["content"] for m in p.messages))["input_ids"]
        out.append(PlannedPrompt(p.id, p.category, tuple(int(i) for i in ids)))
    return out


@dataclass
class Target:
    """The loaded target: model, tokenizer, engine and what was loaded."""

    device: torch.device
    model: torch.nn.Module
    tokenizer: Any
    engine: TransformersEngine
    info: ModelInfo


def open_target(loaded: LoadedPolicy) -> Target:
    """Load the policy's target model and tokenizer and wrap them in an engine."""
    policy = loaded.policy
    device = models.resolve_device(policy.target.device, "target.device")
    source = models.resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
    tokenizer = models.load_tokenizer(source)
    target = models.load_model(source, policy.target.dtype, device)
    eos = {i for i in [tokenizer.eos_token_id, getattr(target.generation_config, "eos_token_id", None)] for i in (i if isinstance(i, list) else [i]) if i is not None}
    info = _info("target", str(source), "target", policy.target.dtype, target)
    return Target(device, target, tokenizer, TransformersEngine(target, eos, device), info)


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
    prompts = load_prompts(loaded, tokenizer)
    return Session(device, target, tokenizer, engine, drafts, laws_of(loaded), prompts, infos)


def _info(role: str, source: str, kind: str, dtype: str, model: torch.nn.Module) -> ModelInfo:
    params = sum(p.numel() for p in model.parameters())
    return ModelInfo(role, source, kind, dtype, models.fingerprint(model), params, models.weight_bytes(model))
