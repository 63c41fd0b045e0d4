"""Resolve a validated policy into what the measurements need: the target (its oracle
and the runner under test), every draft, the tokenized prompts and the laws. Every
failure here is bad input: a PolicyValueError naming the YAML path (the CLI adds file
and line, exit code 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gate.drafts import registry as draft_kinds
from gate.drafts.interface import BuildContext, Draft
from gate.oracle import TargetOracle
from gate.runners.interface import Runner
from gate.runners.stop import StopStrings
from gate.runners.registry import runner_class
from gate.errors import PolicyValueError
from gate.constraints import grammar_engine
from gate.constraints.interface import GrammarEngine
from gate.law import Law
from gate.models import load as models
from gate.plan import Plan, PlannedPrompt
from gate.policy.load import LoadedPolicy
from gate.records import ModelInfo, WorkloadInfo


@dataclass
class Session:
    """Everything loaded for one policy."""

    device: torch.device
    target: torch.nn.Module
    tokenizer: Any
    runner: Runner  # the system under test (serves every draft and the fallback)
    oracle: TargetOracle | None  # the target scoring tokens (overlap, exactness); None: no local target
    drafts: dict[str, Draft]
    laws: list[Law]
    prompts: list[PlannedPrompt]
    models: list[ModelInfo] = field(default_factory=list)
    workload: WorkloadInfo | None = None
    release: Any = None  # the pinned released target (gate.measure.identity.Release; loaded only to compare, never run)
    grammars: GrammarEngine | None = None  # compiles requests' response formats on the target's tokenizer


@dataclass
class Target:
    """The loaded target: model, tokenizer, its oracle and what was loaded; `eos_token_ids`
    and `stop` (stop strings, None: none) end a request of a runner built on it."""

    device: torch.device
    model: torch.nn.Module
    tokenizer: Any
    oracle: TargetOracle
    info: ModelInfo
    eos_token_ids: set[int] = field(default_factory=set)
    stop: StopStrings | None = None
    grammars: GrammarEngine | None = None  # None: no tokenizer loaded (no constraint can be compiled)

    def runner(self, drafts: dict[str, Draft]) -> Runner:
        """The in-process runner (kind "transformers", gate.runners.registry) on this target
        for `drafts` (name -> draft)."""
        return runner_class("transformers")(self.model, self.eos_token_ids, self.device, self.stop, drafts,  # type: ignore[call-arg]
                                            self.grammars)


def open_target(loaded: LoadedPolicy, tokenizer: bool | Any = True) -> Target:
    """Load the policy's target model and its oracle, with its tokenizer: loaded when
    `tokenizer` is True, none when False (scoring token ids needs none), else the tokenizer
    object given (the one gate.validate already loaded). Raises PolicyValueError."""
    policy = loaded.policy
    device = models.resolve_device(policy.target.device, "target.device")
    source = models.resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
    tok = (models.load_tokenizer(source) if tokenizer else None) if isinstance(tokenizer, bool) else tokenizer
    target = models.load_model(source, policy.target.dtype, device)
    eos = {i for i in [getattr(tok, "eos_token_id", None), getattr(target.generation_config, "eos_token_id", None)]
           for i in (i if isinstance(i, list) else [i]) if i is not None}
    info = models.model_info("target", str(source), "target", policy.target.dtype, target)
    stop = StopStrings(tok, policy.workload.stop) if policy.workload.stop and tok is not None else None
    oracle = TargetOracle(target, device)
    grammars = grammar_engine(tok, oracle.vocab_size, eos) if tok is not None else None
    return Target(device, target, tok, oracle, info, eos, stop, grammars)


def open_session(plan: Plan) -> Session:
    """Load the target and every draft of a validated plan (models are loaded once each);
    the prompts are the plan's (built once, by gate.validate). Raises PolicyValueError."""
    loaded = plan.loaded
    policy = loaded.policy
    t = open_target(loaded, plan.tokenizer if plan.tokenizer is not None else True)
    device, target, tokenizer, oracle, infos = t.device, t.model, t.tokenizer, t.oracle, [t.info]
    drafts: dict[str, Draft] = {}
    ctx = BuildContext(target, tokenizer, device, oracle.vocab_size, policy.target.dtype, loaded.path.parent, t.info.fingerprint)
    for name, spec in policy.drafts.items():  # each kind builds its own (gate.drafts.registry)
        built = draft_kinds.build_draft(name, spec, ctx)
        drafts[name] = built.draft
        if built.info is not None:
            infos.append(built.info)
    return Session(device, target, tokenizer, t.runner(drafts), oracle, drafts, list(plan.laws), list(plan.workload.prompts),
                   infos, plan.workload.info, getattr(plan, "release", None), t.grammars)


