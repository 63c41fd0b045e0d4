"""`gate check` and `gate validate` as functions: policy -> session -> measure -> rules -> report.

The CLI only parses arguments and prints; everything it runs is here.
"""

from __future__ import annotations

import difflib
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gate import interrupt
from gate.errors import InputError, PolicyValueError
from gate.measure.contention import Handling, is_contended
from gate.measure.environment import environment
from gate.models.load import ModelSource, check_tokenizers, load_tokenizer, resolve_device, resolve_source
from gate.plan import plan_exactness
from gate.policy.load import LoadedPolicy, load_policy
from gate.records import Failure, Measurements
from gate.report.document import Report, make_report
from gate.rules.power import underpowered
from gate.rules.evaluate import evaluate, exit_code, settings_for
from gate.rules.summary import summarize
from gate.run import Progress, measure, measure_more
from gate.session import open_session, workload_source
from gate.workloads.interface import select


@dataclass
class CheckResult:
    report: Report
    exit_code: int


@dataclass(frozen=True)
class Options:
    """CLI switches that change how verdicts count: --fail-on-warn, --fail-on-inconclusive,
    --no-waivers (waivers=False shows the full truth)."""

    fail_on_warn: bool = False
    fail_on_inconclusive: bool = False
    waivers: bool = True


def validate(path: str | Path) -> LoadedPolicy:
    """Validate a policy without loading model weights (see _validate). Raises InputError."""
    return _validate(path)[0]


def _validate(path: str | Path) -> tuple[LoadedPolicy, tuple[Measurements, str | None] | None]:
    """Validate a policy without loading model weights: schema, units, names, that every
    model source and the prompt source can be found, and that a separate draft model's
    tokenizer matches the target's; also the baseline report's measurements when the policy
    names one (read once here, used by check). Raises InputError (file, YAML path, line)."""
    loaded = load_policy(path)
    policy = loaded.policy
    try:
        if not policy.drafts:
            raise PolicyValueError("drafts", "the policy names no draft; gate check needs at least one (a policy for "
                                   "gate exactness on recorded samples needs only a target and exactness rules)")
        resolve_device(policy.target.device, "target.device")
        target = resolve_source(policy.target.model, policy.target.gguf_file, loaded.path.parent, "target.model")
        separate = {name: resolve_source(draft.model, draft.gguf_file, loaded.path.parent, f"drafts.{name}.model")
                    for name, draft in policy.drafts.items() if draft.kind == "model" and draft.model != "target"}
        if separate:
            target_tokenizer = _tokenizer(target, "target.model")
            for name, source in separate.items():
                check_tokenizers(target_tokenizer, _tokenizer(source, f"drafts.{name}.model"), f"drafts.{name}.model")
        w = policy.workload
        source = workload_source(loaded)
        everything = source.load()
        chosen = select(everything, w.seed, w.per_category, w.num_prompts, w.categories)
        if not chosen:
            raise PolicyValueError("workload", "the workload selects no prompt")
        _check_categories(policy, sorted({p.category for p in everything}))
        weak = underpowered(policy, [p.category for p in chosen])
        loaded.warnings.extend(loaded.source.problem(at, message) for at, message in weak)
        _check_against_config(loaded, target)
    except PolicyValueError as e:
        raise loaded.error(e) from None
    return loaded, load_baseline(loaded)  # a missing or unreadable baseline report is bad input too


def _check_sliding_window(config: Any, positions: int) -> None:
    """gate's loop rolls the target's cache back after rejected proposals; transformers'
    sliding-window cache cannot roll back once its window is full, so such a target must
    not outgrow its window in this workload."""
    from gate.measure.kv import ConfigError, cache_model

    try:
        windows = [layer.window for layer in cache_model(config).layers if layer.window]
    except ConfigError:
        return  # a layout gate cannot bill is reported by the bill, not here
    if windows and positions >= min(windows) - 1:
        raise PolicyValueError("workload.max_new_tokens", f"the target has sliding-window layers (window {min(windows)}) and "
                               f"this workload needs {positions} positions: gate's speculative loop cannot roll back a full "
                               "sliding-window cache yet; keep prompt + max_new_tokens + num_draft_tokens below the window")


def _check_categories(policy: Any, known: list[str]) -> None:
    """Every category a rule scope or the workload names must exist in the prompt source."""
    named = [("workload.categories", j, c) for j, c in enumerate(policy.workload.categories or [])]
    named += [(f"rules[{i}].scope.categories", j, c) for i, r in enumerate(policy.rules) for j, c in enumerate(r.scope.categories or [])]
    for path, j, c in named:
        if c not in known:
            close = difflib.get_close_matches(c, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PolicyValueError(f"{path}[{j}]", f"the prompt source has no category {c!r}{hint}; its categories: {', '.join(known)}")


def _check_against_config(loaded: LoadedPolicy, target: ModelSource) -> None:
    """What the target's config decides before any weight is loaded: early-exit depth and
    whether the longest prompt plus max_new_tokens (and the bill's context) fit its positions."""
    from gate.resources import load_config
    from gate.session import load_prompts

    policy = loaded.policy
    try:
        config = load_config(target)
    except Exception as e:  # noqa: BLE001 - an unreadable config is bad input
        raise PolicyValueError("target.model", f"cannot read the model config of {target}: {type(e).__name__}: {e}") from None
    layers = getattr(config, "num_hidden_layers", None)
    limit = getattr(config, "max_position_embeddings", None)
    for name, d in policy.drafts.items():
        if d.kind == "early_exit" and layers and not d.num_layers < layers:
            raise PolicyValueError(f"drafts.{name}.num_layers", f"must be below the target's {layers} layers (got {d.num_layers})")
    if not limit:
        limit = 10**12
    if policy.resources.context_tokens and policy.resources.context_tokens > limit:
        raise PolicyValueError("resources.context_tokens", f"{policy.resources.context_tokens} tokens exceed the target's "
                               f"{limit} positions (max_position_embeddings)")
    longest = max(len(p.token_ids) for p in load_prompts(loaded, _tokenizer(target, "target.model"), config))
    need = longest + max(policy.workload.max_new_tokens_list)
    _check_sliding_window(config, need + max(d.num_draft_tokens for d in policy.drafts.values()))
    if need > limit:
        raise PolicyValueError("workload.max_new_tokens", f"the longest prompt ({longest} tokens) plus max_new_tokens needs "
                               f"{need} positions; the target has {limit} (max_position_embeddings)")


def _tokenizer(source: ModelSource, yaml_path: str) -> Any:
    from gate.models.load import MissingTokenizer

    try:
        return load_tokenizer(source)
    except MissingTokenizer as e:
        raise PolicyValueError(yaml_path, str(e)) from None
    except Exception as e:  # noqa: BLE001 - a tokenizer that cannot be read is bad input
        raise PolicyValueError(yaml_path, f"cannot load the tokenizer of {source}: {type(e).__name__}: {e}") from None


def check(path: str | Path, progress: Progress | None = None, options: Options = Options(),
          warmup: bool = True) -> CheckResult:
    """Run every measurement the policy needs, evaluate every rule, build the report.
    When verdicts are inconclusive and measurement.extra_repetitions allows, the drafts
    concerned (and their fallback) run further repetitions and every rule is decided again.

    Raises InputError for a bad policy or input (exit code 2). Measurement failures do not
    raise: they are recorded, their rules become errors, and the exit code is 3 (or 1
    when an error-level rule failed)."""
    step = progress or (lambda *_: None)
    interrupt.arm()
    try:
        loaded, baseline = _validate(path)
    except KeyboardInterrupt:
        return _interrupted(_policy_only(path), "before measuring started (while validating the policy)", options, None)
    policy = loaded.policy
    ms = policy.measurement
    try:
        step("loading models", 0, 1)
        session = open_session(loaded)
        step("loading models", 1, 1)
    except KeyboardInterrupt:
        return _interrupted(loaded, "before measuring started (while loading models)", options, baseline)
    except PolicyValueError as e:
        raise loaded.error(e) from None
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - a model that cannot be loaded is a failed measurement
        m = _nothing_measured(loaded, resolve_device(policy.target.device, "target.device"))
        m.failures.append(Failure("run", "*", "*", "loading models", f"{type(e).__name__}: {e}"))
        return finish(loaded, m, options, [traceback.format_exc(limit=3)], baseline=baseline)
    exactness = plan_exactness(policy.rules, list(policy.drafts), [law.label for law in policy.laws])
    lengths = policy.workload.max_new_tokens_list
    try:
        m = measure(session, lengths, ms.repetitions, policy.workload.seed, policy.resources,
                    warmup=ms.warmup_requests if warmup else 0, progress=progress, exactness=exactness,
                    interleave=ms.interleave, contention=_handling(ms))
    except KeyboardInterrupt:  # outside measure()'s own guard (planning, the bill): nothing kept
        return _interrupted(loaded, "while measuring", options, baseline, session=session)
    except Exception as e:  # noqa: BLE001 - measure() records failures itself; this is the safety net
        # Whatever escaped the run is a measurement that
        # could not be made: exit code 3 with the reports written, never a traceback.
        m = _nothing_measured(loaded, session.device)
        m.environment.models = session.models
        m.failures.append(Failure("run", "*", "*", "measuring", f"{type(e).__name__}: {e}"))
        return finish(loaded, m, options, [traceback.format_exc(limit=3)], baseline=baseline)
    notes: list[str] = []
    if interrupt.received() is not None or _stopped(m):  # measure() stopped and kept what it had
        return _interrupted(loaded, "while measuring", options, baseline, m=m)
    try:
        for extra in range(ms.extra_repetitions):
            settings = settings_for(policy, *(baseline or (None, None)), waivers=options.waivers)  # waived: not rerun
            pending = [o for o in evaluate(policy.rules, m, settings)
                       if o.status == "inconclusive" and o.metric in REPEATABLE and o.level != "off"]
            if not pending:
                break
            drafts, laws = sorted({o.draft for o in pending}), sorted({o.law for o in pending})
            rep = ms.repetitions + extra
            notes.append(f"extra repetition {extra + 1} of {ms.extra_repetitions} (repetition index {rep}) for drafts "
                         f"{', '.join(drafts)} under {', '.join(laws)}: inconclusive {', '.join(sorted({o.name for o in pending}))}")
            measure_more(session, m, drafts, laws, lengths, range(rep, rep + 1), policy.workload.seed, ms.interleave, progress,
                         _handling(ms))
            if interrupt.received() is not None or _stopped(m):
                break
    except KeyboardInterrupt:
        interrupt.caught()
    if interrupt.received() is not None or _stopped(m):
        return _interrupted(loaded, "during the extra repetitions", options, baseline, m=m, notes=notes)
    interrupt.stop_raising()  # only the verdicts and reports are left: a signal now is recorded, they are written whole
    return finish(loaded, m, options, notes, baseline=baseline)


def _stopped(m: Measurements) -> bool:
    """Whether the run recorded an interrupt (a KeyboardInterrupt that measure() caught)."""
    return any(f.stage == "run" and f.message.startswith("interrupted") for f in m.failures)


def _policy_only(path: str | Path) -> LoadedPolicy:
    """The policy alone (no model, prompt or baseline looked at), for the report of a run
    interrupted while it was being validated; the interrupt goes on when it cannot be read."""
    interrupt.caught()
    try:
        return load_policy(path)
    except InputError:
        raise KeyboardInterrupt from None


def _interrupted(loaded: LoadedPolicy, stage: str, options: Options, baseline: tuple[Measurements, str | None] | None,
                 m: Measurements | None = None, session: Any = None, notes: list[str] | None = None) -> CheckResult:
    """The result of a run stopped by SIGINT or SIGTERM `stage`: what was measured (or
    nothing), an interrupt failure so no rule passes on missing data, a note saying so, and
    the exit code 128 + signal (not a verdict)."""
    interrupt.caught()
    interrupt.stop_raising()
    if m is None:
        try:
            device = session.device if session is not None else resolve_device(loaded.policy.target.device, "target.device")
        except PolicyValueError:
            device = torch.device("cpu")
        m = _nothing_measured(loaded, device)
        if session is not None:
            m.environment.models = session.models
    if not _stopped(m):
        m.failures.append(Failure("run", "*", "*", "run", f"interrupted by {interrupt.name()} {stage}"))
    result = finish(loaded, m, options, [*(notes or []), interrupt.note(stage)], baseline=baseline)
    result.exit_code = result.report.exit_code = interrupt.exit_code()
    return result


def _handling(ms: Any) -> Handling:
    """policy.measurement's contention fields for the run (gate.measure.contention)."""
    from gate.measure.environment import cpu_count

    return Handling(ms.max_cpu_stall, ms.contention_reruns, cpu_count())


def contention_note(m: Measurements, max_cpu_stall: float | None) -> str | None:
    """A note saying when the machine was busy during the timed requests (None when quiet)."""
    env = m.environment
    cpus = env.cpu_count
    busy = [r for r in m.requests if is_contended(r, max_cpu_stall, cpus)]
    rerun = sum(1 for r in m.requests if r.contention_reruns)
    if not busy and not rerun:
        return None
    share = f"{env.cpu_stall_share:.0%}" if env.cpu_stall_share is not None else "an unknown share"
    load = f", load average up to {env.load_avg_1m_max:.1f} on {cpus} CPUs" if env.load_avg_1m_max is not None else ""
    text = (f"machine busy: some task waited for a CPU during {share} of the timed requests' wall time "
            f"({env.cpu_pressure_source or 'no pressure source'}{load}); ")
    text += (f"{len(busy)} of {len(m.requests)} requests contended (over {max_cpu_stall:.0%} of their wall time without "
             f"CPU) and left out of timing verdicts" if busy else "no request left contended")
    if rerun:
        text += f"; {rerun} requests kept from cells rerun for contention"
    return text


# Metrics whose verdicts more timed repetitions can settle (overlap is measured once, on repetition 0).
REPEATABLE = {"speedup", "committed_tokens_per_s", "ttft_ms", "itl_ms", "itl_chunk_ms", "tpot_ms", "e2el_ms",
              "acceptance_rate", "mean_acceptance_length", "kv_cache_bytes"}


def load_baseline(loaded: LoadedPolicy) -> tuple[Measurements, str | None] | None:
    """The baseline report's measurements and, when its environment differs from this
    machine's (device, torch, transformers), why it cannot be compared. The target
    fingerprint is compared after the run (finish). Raises InputError for an unreadable report."""
    from gate.report.explain import load_report

    spec = loaded.policy.baseline
    if spec is None:
        return None
    path = loaded.resolve(spec.report)
    if not path.is_file():
        why = "is a directory, not a report" if path.is_dir() else "does not exist"
        raise loaded.error(PolicyValueError("baseline.report", f"the baseline report {path} {why}"))
    try:
        report = load_report(path)
    except InputError as e:
        raise loaded.error(PolicyValueError("baseline.report", "; ".join(str(p) for p in e.problems))) from None
    for cand, name in spec.drafts.items():
        if name not in report.measurements.drafts:
            raise loaded.error(PolicyValueError(f"baseline.drafts.{cand}", f"the baseline report has no draft {name!r}; its drafts: "
                                                f"{', '.join(report.measurements.drafts)}"))
    return report.measurements, None


def _nothing_measured(loaded: LoadedPolicy, device: torch.device) -> Measurements:
    """Measurements with the environment, laws and drafts but no record (every rule: error)."""
    policy = loaded.policy
    m = Measurements(environment=environment(device, policy.workload.seed), laws=[law.label for law in policy.laws])
    m.drafts = {name: {"kind": d.kind, "num_draft_tokens": d.num_draft_tokens} for name, d in policy.drafts.items()}
    return m


def finish(loaded: LoadedPolicy, m: Measurements, options: Options, notes: list[str],
           rules: list[Any] | None = None, baseline: tuple[Measurements, str | None] | None = None) -> CheckResult:
    """Evaluate `rules` (default: the policy's) on `m` and build the report and exit code."""
    from gate.compare import environment_differences

    base, mismatch = baseline or (None, None)
    if base is not None:
        diffs = environment_differences(base.environment, m.environment)
        mismatch = "; ".join(diffs) or None
        if mismatch:
            notes = [*notes, f"baseline environment differs ({mismatch}): relative_to: baseline verdicts are inconclusive"]
    settings = settings_for(loaded.policy, base, mismatch, waivers=options.waivers)
    busy = contention_note(m, settings.max_cpu_stall)
    if busy:
        notes = [*notes, busy]
    outcomes = evaluate(loaded.policy.rules if rules is None else rules, m, settings)
    code = exit_code(outcomes, m, options.fail_on_warn, options.fail_on_inconclusive)
    report = make_report(str(loaded.path), loaded.policy.model_dump(mode="json"), m, outcomes, summarize(m), code)
    report.notes.extend([f"warning: {w}" for w in loaded.warnings] + notes)
    return CheckResult(report, code)
