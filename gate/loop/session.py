"""Resolve a validated plan into what the measurement loop needs: the runner under test
(built by its kind, gate.runners.registry), the models it runs in this process where it
runs them (Capabilities.in_process: the target and every draft), the local target's oracle
where a measurement needs one, the tokenized prompts and the laws. A runner's
configuration that cannot be built is bad input: a PolicyValueError naming the YAML path
(the CLI adds file and line, exit code 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gate.constraints import grammar_engine
from gate.constraints.interface import GrammarEngine
from gate.core.law import Law
from gate.core.requests import PlannedPrompt
from gate.drafts import registry as draft_kinds
from gate.drafts.interface import BuildContext, Draft
from gate.exactness.oracle import TargetOracle
from gate.models import loading as models
from gate.plan.matrix import Plan
from gate.policy.reader import LoadedPolicy
from gate.records import DraftInfo, ModelInfo, WorkloadInfo
from gate.runners.interface import Runner
from gate.runners.registry import runner_class
from gate.runners.stop import StopStrings


@dataclass
class Session:
    """Everything opened for one policy: what the measurement loop (gate.loop.run) runs.

    `target` and `drafts` are the models loaded in this process (None and {} for a runner
    that runs its own, a served engine); `oracle` the local target scoring tokens (overlap,
    exactness; None: no local target); `draft_infos` what each draft is, for rules and
    reports, whether loaded here or not; `notes` what opening it had to say for the report."""

    device: torch.device
    target: torch.nn.Module | None
    tokenizer: Any
    runner: Runner  # the system under test (serves every draft and the fallback)
    oracle: TargetOracle | None  # the target scoring tokens (overlap, exactness); None: no local target
    drafts: dict[str, Draft]
    laws: list[Law]
    prompts: list[PlannedPrompt]
    models: list[ModelInfo] = field(default_factory=list)
    workload: WorkloadInfo | None = None
    release: Any = None  # the pinned released target (gate.loop.identity.Release; loaded only to compare, never run)
    grammars: GrammarEngine | None = None  # compiles requests' response formats on the target's tokenizer
    plan: Plan | None = None
    draft_infos: dict[str, DraftInfo] = field(default_factory=dict)
    tokenizer_comparisons: list[Any] = field(
        default_factory=list
    )  # drafts with their own tokenizer, compared with the target's
    notes: list[str] = field(default_factory=list)

    @property
    def local(self) -> bool:
        """Whether the runner runs the target and drafts loaded here (open_session loaded them
        for it): its outputs are the local target's own, and its drafts are here to score."""
        return self.target is not None


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


@dataclass
class LocalModels:
    """What a runner that runs the models in this process (Capabilities.in_process) is built
    on: the loaded `target` and `drafts` (name -> draft)."""

    target: Target
    drafts: dict[str, Draft]


def open_target(loaded: LoadedPolicy, tokenizer: bool | Any = True) -> Target:
    """Load the policy's target model and its oracle, with its tokenizer: loaded when
    `tokenizer` is True, none when False (scoring token ids needs none), else the tokenizer
    object given (the one gate.plan.validate already loaded). Raises PolicyValueError."""
    policy = loaded.policy
    device = models.resolve_device(policy.target.device, "target.device")
    source = models.resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
    tok = (models.load_tokenizer(source) if tokenizer else None) if isinstance(tokenizer, bool) else tokenizer
    target = models.load_model(source, policy.target.dtype, device)
    eos = models.eos_token_ids(tok, target.generation_config)
    info = models.model_info("target", str(source), "target", policy.target.dtype, target)
    stop = StopStrings(tok, policy.workload.stop) if policy.workload.stop and tok is not None else None
    oracle = TargetOracle(target, device)
    oracle.grammars = grammar_engine(tok, oracle.vocab_size, eos) if tok is not None else None
    return Target(device, target, tok, oracle, info, eos, stop, oracle.grammars)


def open_session(plan: Plan, step: Any = None) -> Session:
    """Open what a validated plan runs: its runner (gate.runners.registry, by runner.kind)
    and, for a runner of the models in this process, the target and every draft (each
    loaded once); for any other runner the local target only where an exactness rule needs
    it (greedy: its logits tell a numerical near-tie from a fault; sampling: its law is the
    one-sample reference). If it cannot be loaded, session.notes says so: every greedy
    divergence then counts as a fault and sampled laws are tested two-sample only. The prompts are
    the plan's (built once, by gate.plan.validate). `step(what, done, total)` reports progress.
    Raises PolicyValueError (a runner or draft that cannot be built); anything else a model
    load raises propagates (a failed measurement)."""
    step = step or (lambda *_: None)
    loaded = plan.loaded
    policy = loaded.policy
    cls = runner_class(policy.runner.kind)
    if not policy.runner.runs_models_here:
        return _served_session(plan, cls, step)
    step("loading models", 0, 1)
    t = open_target(loaded, plan.tokenizer if plan.tokenizer is not None else True)
    device, target, tokenizer, oracle, infos = t.device, t.model, t.tokenizer, t.oracle, [t.info]
    drafts: dict[str, Draft] = {}
    ctx = BuildContext(
        target, tokenizer, device, oracle.vocab_size, policy.target.dtype, loaded.path.parent, t.info.fingerprint
    )
    for name, spec in policy.drafts.items():  # each kind builds its own (gate.drafts.registry)
        built = draft_kinds.build_draft(name, spec, ctx)
        drafts[name] = built.draft
        if built.info is not None:
            infos.append(built.info)
    step("loading models", 1, 1)
    draft_infos = {
        name: DraftInfo(
            d.kind,
            d.num_draft_tokens,
            d.probability_info,
            draft_kinds.get(d.kind).modifies_target,
            **policy.sweep_fields(name),
        )
        for name, d in drafts.items()
    }
    compared = [c for d in drafts.values() if (c := getattr(d, "tokenizer_comparison", None)) is not None]
    return Session(
        device,
        target,
        tokenizer,
        cls.from_plan(plan, LocalModels(t, drafts)),
        oracle,
        drafts,
        list(plan.laws),
        list(plan.workload.prompts),
        infos,
        plan.workload.info,
        plan.release,
        t.grammars,
        plan,
        draft_infos,
        compared,
    )


def _served_session(plan: Plan, cls: type[Runner], step: Any) -> Session:
    """The session of a runner that runs its own models: see open_session."""
    loaded = plan.loaded
    policy = loaded.policy
    runner = cls.from_plan(plan)
    session = Session(
        torch.device("cpu"),
        None,
        plan.tokenizer,
        runner,
        None,
        {},
        list(plan.laws),
        list(plan.workload.prompts),
        [],
        plan.workload.info,
        None,
        None,
        plan,
    )
    session.draft_infos = {
        name: DraftInfo(
            d.kind,
            d.num_draft_tokens,
            draft_kinds.get(d.kind).probability_info,
            draft_kinds.get(d.kind).modifies_target,
            **policy.sweep_fields(name),
            # a served engine loads the checkpoint as it is told (gate's own loop checks what it loads)
            low_acceptance_cause=draft_kinds.get(d.kind).low_acceptance_cause(d),
        )
        for name, d in policy.drafts.items()
    }
    if plan.exactness.pairs:
        try:
            step("loading the local target (exactness)", 0, 1)
            session.oracle = open_target(loaded, plan.tokenizer).oracle
        except KeyboardInterrupt:
            runner.close()
            raise
        except Exception as e:  # noqa: BLE001 - exactness then counts every divergence as a fault, and says so
            session.notes.append(
                f"the local target could not be loaded ({type(e).__name__}: {e}): greedy divergences "
                "between served runners cannot be told apart from numerical near-ties and count as faults, "
                "and sampled laws are tested against the fallback runner only (two-sample)"
            )
    return session
