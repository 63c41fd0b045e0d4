"""`gate check` as a function: plan (gate.plan.validate) -> session -> measure -> rules -> report.

The CLI only parses arguments and prints; everything it runs is here.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gate.analysis import interactivity
from gate.analysis import schedule as k_schedule
from gate.analysis.cost import cost
from gate.analysis.load_points import load_summary
from gate.analysis.summary import summarize
from gate.core.errors import InputError, PolicyValueError
from gate.drafts import registry as draft_kinds
from gate.load.points import load_points, search_plan
from gate.loop import interrupt
from gate.loop.run import Progress, Settings, measure, measure_more
from gate.loop.session import open_session
from gate.measure import speculation
from gate.measure.client_check import client_checks
from gate.measure.contention import Handling, is_contended
from gate.measure.environment import environment
from gate.measure.speculation import proposals
from gate.metrics.catalogue import REPEATABLE
from gate.models.loading import resolve_device
from gate.plan.rounds import Sequential, Undecided
from gate.plan.validate import validate
from gate.policy.baseline import Baseline
from gate.policy.reader import LoadedPolicy, load_policy
from gate.records import DID_NOT_SPECULATE, FALLBACK, DraftInfo, Failure, FailureStage, Measurements, SpeculationStatus
from gate.report.document import Report, make_report
from gate.rules.evaluate import evaluate, exit_code, settings_for
from gate.rules.kinds import registry as rule_kinds
from gate.rules.outcome import Outcome
from gate.rules.status import Status


@dataclass
class CheckResult:
    report: Report
    exit_code: int


@dataclass(frozen=True)
class Options:
    """CLI switches that change how verdicts count: --fail-on-warn, --fail-on-inconclusive,
    --no-waivers (waivers=False shows the full truth); and --shard I/N ((i, n): measure the
    i-th of n shards of the run, gate.commands.merge joins them)."""

    fail_on_warn: bool = False
    fail_on_inconclusive: bool = False
    waivers: bool = True
    shard: tuple[int, int] | None = None


def check(
    path: str | Path, progress: Progress | None = None, options: Options = Options(), warmup: bool = True
) -> CheckResult:
    """Run every measurement the policy needs, evaluate every rule, build the report.
    When verdicts are inconclusive and measurement.extra_repetitions allows, the drafts
    concerned (and their fallback) run further repetitions and every rule is decided again.

    measurement.max_wall_s, when set, is counted from this call: once it has run out gate
    measures nothing more (checked between requests, load points and phases), the requests
    and passes not measured are failures ("not measured: measurement.max_wall_s (20 min)
    ran out after N of M requests"), the rules are decided on what was measured and a note
    says so; the exit code is the verdicts' (3 with measurements missing), not an
    interrupt's. A SIGINT or SIGTERM stops the phase in progress likewise, and the result
    then carries 128 + the signal.

    Raises InputError for a bad policy or input (exit code 2). Measurement failures do not
    raise: they are recorded, their rules become errors, and the exit code is 3 (or 1
    when an error-level rule failed)."""
    started = time.monotonic()
    interrupt.clear_run()
    try:
        return _check(path, progress, options, warmup, started)
    finally:
        interrupt.clear_run()


def _check(path: str | Path, progress: Progress | None, options: Options, warmup: bool, started: float) -> CheckResult:
    step = progress or (lambda *_: None)
    interrupt.arm()
    try:
        plan = validate(path)
    except KeyboardInterrupt:
        return _interrupted(_policy_only(path), "before measuring started (while validating the policy)", options, None)
    loaded, baseline = plan.loaded, plan.baseline
    policy = loaded.policy
    ms = policy.measurement
    interrupt.set_budget(ms.wall_budget_s(), f"measurement.max_wall_s ({ms.wall_budget_shown()})", started)
    loading = ["before measuring started (while opening the runner)"]

    def opening(what: str, done: int, total: int) -> None:
        loading[0] = f"before measuring started (while {what})"
        step(what, done, total)

    try:
        session = open_session(plan, opening)
    except KeyboardInterrupt:
        return _interrupted(loaded, loading[0], options, baseline)
    except PolicyValueError as e:
        raise loaded.error(e) from None
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - a model that cannot be loaded is a failed measurement
        m = _nothing_measured(loaded, resolve_device(policy.target.device, "target.device"))
        m.failures.append(Failure(FailureStage.RUN, "*", "*", "loading models", f"{type(e).__name__}: {e}"))
        return finish(loaded, m, options, [traceback.format_exc(limit=3)], baseline=baseline)
    settings = run_settings(
        policy, warmup, options.shard, undecided(loaded, baseline, options), unsettled_samples(loaded, options)
    )
    notes: list[str] = list(session.notes)
    try:
        m = measure(session, settings, progress, plan.exactness)
    except KeyboardInterrupt:  # outside measure()'s own guard (before its first phase): nothing kept
        session.runner.close()
        return _interrupted(loaded, "while measuring", options, baseline, session=session, notes=notes)
    except Exception as e:  # noqa: BLE001 - measure() records failures itself; this is the safety net
        # Whatever escaped the run is a measurement that
        # could not be made: exit code 3 with the reports written, never a traceback.
        session.runner.close()
        m = _nothing_measured(loaded, session.device)
        m.environment.models = session.models
        m.failures.append(Failure(FailureStage.RUN, "*", "*", "measuring", f"{type(e).__name__}: {e}"))
        return finish(loaded, m, options, [*notes, traceback.format_exc(limit=3)], baseline=baseline)
    if interrupt.received() is not None or _stopped(m):  # measure() stopped and kept what it had
        return _interrupted(loaded, _during(), options, baseline, m=m, notes=notes)
    if interrupt.ran_out():
        notes.append(budget_note())
    try:
        if options.shard is not None and ms.extra_repetitions:
            notes.append(
                f"shard {options.shard[0]}/{options.shard[1]}: measurement.extra_repetitions are not run in a "
                "shard (they are decided on the whole run; gate merge decides on what the shards measured)"
            )
        for extra in range(0 if interrupt.ran_out() or options.shard is not None else ms.extra_repetitions):
            settings_ = settings_for(
                policy, baseline.measurements if baseline else None, waivers=options.waivers
            )  # waived: not rerun
            check_speculation(loaded, m)  # a runner that did not speculate is an error: no repetition can settle it
            pending = [
                o
                for o in evaluate(policy.rules, m, settings_)
                if o.status == Status.INCONCLUSIVE and o.metric in REPEATABLE and o.level != "off"
            ]
            if not pending:
                break
            drafts, laws = sorted({o.draft for o in pending}), sorted({o.law for o in pending})
            rep = ms.repetitions + extra
            notes.append(
                f"extra repetition {extra + 1} of {ms.extra_repetitions} (repetition index {rep}) for drafts "
                f"{', '.join(drafts)} under {', '.join(laws)}: inconclusive "
                f"{', '.join(sorted({o.name for o in pending}))}"
            )
            measure_more(session, m, settings, drafts, laws, range(rep, rep + 1), progress)
            if interrupt.received() is not None or _stopped(m):
                break
            if interrupt.ran_out():
                notes.append(
                    f"{interrupt.budget()} ran out during extra repetition {extra + 1}, "
                    f"{_duration(interrupt.elapsed_s())} after gate check started: gate stopped measuring; "
                    "the rules were decided on what was measured"
                )
                break
    except KeyboardInterrupt:
        interrupt.caught()
    if interrupt.received() is not None or _stopped(m):
        session.runner.close()
        return _interrupted(loaded, "during the extra repetitions", options, baseline, m=m, notes=notes)
    interrupt.stop_raising()  # only the verdicts and reports are left: a signal now is recorded, they are written whole
    session.runner.close()  # nothing more is sent to the system under test
    return finish(loaded, m, options, notes, baseline=baseline)


def undecided(loaded: LoadedPolicy, baseline: Baseline | None, options: Options) -> Undecided:
    """The predicate a sequential run asks after each look (gate.plan.rounds): the (runner,
    law) cells with an error-level verdict that is inconclusive and that more requests could
    settle (gate.metrics.catalogue REPEATABLE), and the cells of an error-level exactness rule
    not yet measured as far as the fixed plan (an exactness pass states no power against a
    fault that hits some requests: gate never checks fewer outputs than the policy planned;
    the pass runs once the looks end, on every output). Warn-level verdicts never extend a
    run; a waived one is not undecided; a runner that did not speculate is an error no look
    settles."""
    base = baseline.measurements if baseline else None
    closed = (Status.FAIL, Status.SKIPPED, Status.WAIVED)

    def cells(m: Measurements) -> set[tuple[str, str]]:
        check_speculation(loaded, m)
        outcomes = evaluate(loaded.policy.rules, m, settings_for(loaded.policy, base, waivers=options.waivers))
        looks = m.looks

        def short_of_plan(o: Outcome) -> bool:
            return looks is not None and looks.schedule[looks.taken.get(f"{o.draft}/{o.law}", 1) - 1] < looks.fixed_plan

        return {
            (o.draft, o.law)
            for o in outcomes
            if o.level == "error"
            and (
                (o.status == Status.INCONCLUSIVE and o.metric in REPEATABLE)
                or (o.tests_law and o.status not in closed and short_of_plan(o))
            )
        }

    return cells


def unsettled_samples(loaded: LoadedPolicy, options: Options) -> Undecided:
    """The predicate a sequential run asks after each look of its served exactness samples
    (gate.loop.run, gate.rules.sequential.sample_level): the (draft, law) cells whose
    exactness outcome, of any level not off, is inconclusive, so that more samples could
    settle it. The samples' plan is what the policy asked for every exactness rule, warn-level
    ones too: the looks only stop it early where the verdict is already decided; a waived
    outcome is not extended."""
    rules = [r for r in loaded.policy.rules if rule_kinds.needs_exactness(r)]  # only their verdicts can settle here

    def cells(m: Measurements) -> set[tuple[str, str]]:
        outcomes = evaluate(rules, m, settings_for(loaded.policy, None, waivers=options.waivers))
        return {(o.draft, o.law) for o in outcomes if o.tests_law and o.status == Status.INCONCLUSIVE}

    return cells


def run_settings(
    policy: Any,
    warmup: bool = True,
    shard: tuple[int, int] | None = None,
    still: Undecided | None = None,
    samples: Undecided | None = None,
) -> Settings:
    """What the measurement loop runs for `policy` (gate.loop.run.Settings): its lengths,
    repetitions, seed, warm-up (none when `warmup` is False), interleaving, load points,
    goodput objectives, contention handling, resources, the envelope search, the shard and,
    for a sequential run (measurement.sequential), its budget and the predicates `still`
    (undecided; None: nothing is ever undecided, the first look is the run) and `samples`
    (unsettled_samples; None: the served exactness samples' plan is drawn at once)."""
    ms = policy.measurement
    sequential = Sequential(ms.budget.requests, still or (lambda m: set()), samples) if ms.sequential else None
    slo = policy.load.goodput.ms() if policy.load is not None and policy.load.goodput is not None else {}
    return Settings(
        policy.workload.max_new_tokens_list,
        ms.repetitions,
        policy.workload.seed,
        ms.warmup_requests if warmup else 0,
        ms.interleave,
        tuple(load_points(policy)),
        slo,
        _handling(ms),
        policy.resources,
        search_plan(policy),
        shard,
        sequential,
    )


def _during() -> str:
    """The stage an interrupt's note names: "during the served exactness pass" (the phase the
    run's guard stopped), else "while measuring"."""
    phase = interrupt.stopped_in()
    return f"during {phase}" if phase else "while measuring"


def budget_note() -> str:
    """The report's note for a run whose measurement.max_wall_s ran out."""
    phase = interrupt.stopped_in()
    where = f" during {phase}" if phase else ""
    detail = interrupt.stop_detail()
    return (
        f"{interrupt.budget()} ran out{where}, {_duration(interrupt.elapsed_s())} after gate check started: gate "
        f'stopped measuring{f" ({detail})" if detail else ""}; what was not measured is an error ("not measured: '
        '..."), and the rules were decided on what was measured (exit code 3: measurements missing)'
    )


def _duration(seconds: float | None) -> str:
    """Seconds as '1m05s' or '12.3 s'."""
    if seconds is None:
        return "an unknown time"
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def _stopped(m: Measurements) -> bool:
    """Whether the run recorded an interrupt (a KeyboardInterrupt that measure() caught)."""
    return any(f.stage == FailureStage.RUN and f.message.startswith("interrupted") for f in m.failures)


def _policy_only(path: str | Path) -> LoadedPolicy:
    """The policy alone (no model, prompt or baseline looked at), for the report of a run
    interrupted while it was being validated; the interrupt goes on when it cannot be read."""
    interrupt.caught()
    try:
        return load_policy(path)
    except InputError:
        raise KeyboardInterrupt from None


def _interrupted(
    loaded: LoadedPolicy,
    stage: str,
    options: Options,
    baseline: Baseline | None,
    m: Measurements | None = None,
    session: Any = None,
    notes: list[str] | None = None,
) -> CheckResult:
    """The result of a run stopped by SIGINT or SIGTERM `stage`: what was measured (or
    nothing), an interrupt failure so no rule passes on missing data, a note saying so, and
    the exit code 128 + signal (not a verdict)."""
    interrupt.caught()
    interrupt.stop_raising()
    if m is None:
        try:
            device = (
                session.device if session is not None else resolve_device(loaded.policy.target.device, "target.device")
            )
        except PolicyValueError:
            device = torch.device("cpu")
        m = _nothing_measured(loaded, device)
        if session is not None:
            m.environment.models = session.models
    if not _stopped(m) and interrupt.stopped_in() is None:  # the run's guard recorded what it did not measure
        m.failures.append(Failure(FailureStage.RUN, "*", "*", "run", f"interrupted by {interrupt.name()} {stage}"))
    result = finish(loaded, m, options, [*(notes or []), interrupt.note(stage)], baseline=baseline)
    result.exit_code = result.report.exit_code = interrupt.exit_code()
    return result


def _handling(ms: Any) -> Handling:
    """policy.measurement's contention fields for the run (gate.measure.contention)."""
    from gate.measure.environment import cpu_count

    return Handling(ms.max_cpu_stall, ms.contention_reruns, cpu_count(), ms.contention_rerun_budget)


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
    text = (
        f"machine busy: some task waited for a CPU during {share} of the timed requests' wall time "
        f"({env.cpu_pressure_source or 'no pressure source'}{load}); "
    )
    text += (
        f"{len(busy)} of {len(m.requests)} requests contended (over {max_cpu_stall:.0%} of their wall time without "
        f"CPU) and left out of timing verdicts"
        if busy
        else "no request left contended"
    )
    if rerun:
        text += f"; {rerun} requests kept from cells rerun for contention"
    return text


def _nothing_measured(loaded: LoadedPolicy, device: torch.device) -> Measurements:
    """Measurements with the environment, laws and drafts but no record (every rule: error)."""
    policy = loaded.policy
    m = Measurements(environment=environment(device, policy.workload.seed), laws=[law.label for law in policy.laws])
    m.drafts = {
        name: DraftInfo(d.kind, d.num_draft_tokens, **policy.sweep_fields(name)) for name, d in policy.drafts.items()
    }
    return m


def speculation_notes(m: Measurements) -> list[str]:
    """A note per draft runner, law and load point whose speculation did not run as declared
    (m.speculation, gate.measure.speculation: its verdicts there are errors), that had nothing
    to propose, or whose proposals were not counted; and per draft that made no proposal under
    one constraint label while it did under another: engines have turned speculation off for
    structured-output requests without saying so, and acceptance there then measures nothing.
    Proposals are gate's step counters (in-process) or the server's per-request draft count
    (llama.cpp); requests with neither, or with one output token, are not counted."""
    out = [
        rec.describe() + (": every rule outcome of it there is an error" if rec.status in DID_NOT_SPECULATE else "")
        for rec in m.speculation
        if rec.status != SpeculationStatus.SPECULATED
    ]
    made: dict[str, dict[str | None, list[int]]] = {}  # draft -> constraint label -> proposals per request
    for r in m.requests:
        n = proposals(r)
        if r.draft != FALLBACK and n is not None and len(r.output_ids or []) >= 2:
            made.setdefault(r.draft, {}).setdefault(r.constraint, []).append(int(n))
    for draft, by_label in sorted(made.items()):
        if not any(c for cs in by_label.values() for c in cs):
            continue  # no proposal anywhere: the records above say why
        for label, cs in sorted((lb, cs) for lb, cs in by_label.items() if lb is not None):
            if not any(cs):  # and the draft proposed elsewhere (above)
                out.append(
                    f"draft {draft} made no proposal on its {len(cs)} request(s) under constraint {label!r}, though it "
                    "did under the others: the engine may turn speculation off for such requests (acceptance there "
                    "measures nothing)"
                )
    return out


def check_speculation(loaded: LoadedPolicy, m: Measurements) -> None:
    """m.speculation from the timed requests and each draft kind's proposal floor
    (gate.measure.speculation): whether every draft runner speculated where it ran."""
    floors = {name: draft_kinds.proposal_floor(d) for name, d in loaded.policy.drafts.items() if name in m.drafts}
    m.speculation = speculation.check(m, floors)


def finish(
    loaded: LoadedPolicy,
    m: Measurements,
    options: Options,
    notes: list[str],
    rules: list[Any] | None = None,
    baseline: Baseline | None = None,
) -> CheckResult:
    """Evaluate `rules` (default: the policy's) on `m` and build the report and exit code."""
    from gate.commands.compare import environment_differences, workload_differences

    base, mismatch = (baseline.measurements if baseline else None), None
    if base is not None:  # what gate compare calls not comparable: another machine or software, another workload
        diffs = environment_differences(base.environment, m.environment) + workload_differences(base, m, laws=False)
        mismatch = "; ".join(diffs) or None
        if mismatch:
            notes = [
                *notes,
                f"the baseline was measured otherwise ({mismatch}): relative_to: baseline verdicts are inconclusive",
            ]
    settings = settings_for(loaded.policy, base, mismatch, waivers=options.waivers)
    busy = contention_note(m, settings.max_cpu_stall)
    if busy:
        notes = [*notes, busy]
    check_speculation(loaded, m)
    notes = [*notes, *m.notes, *speculation_notes(m)]
    rules = loaded.policy.rules if rules is None else rules
    if options.shard is not None:  # a shard's measurements decide nothing alone: gate merge decides on all of them
        i, n = options.shard
        empty = "" if m.requests or m.envelopes else "; this shard holds no (law, load point) cell: it measured nothing"
        notes = [
            *notes,
            f"shard {i}/{n}: no rule is decided in a shard (gate merge decides every rule once, on every "
            f"shard's measurements); its exit code says whether its measurements were made{empty}",
        ]
        rules = []
    outcomes = evaluate(rules, m, settings)
    code = exit_code(outcomes, m, options.fail_on_warn, options.fail_on_inconclusive)
    points, crossings = load_summary(m, settings.confidence, settings.resamples, settings.seed)
    report = make_report(
        str(loaded.path), loaded.policy.model_dump(mode="json"), m, outcomes, summarize(m), code, points, crossings
    )
    report.shard = None if options.shard is None else f"{options.shard[0]}/{options.shard[1]}"
    report.cost = cost(m)
    report.interactivity = interactivity.points(m, points)
    load = loaded.policy.load
    report.equal_interactivity = interactivity.compare(report.interactivity, load.per_user_speed() if load else None)
    report.schedule = k_schedule.schedule(
        k_schedule.clean(m, settings.max_cpu_stall, settings.max_client_lag_ms),
        loaded.policy.measurement.sweep_max_spread,
        settings.confidence,
        settings.resamples,
        settings.seed,
    )
    report.client = client_checks(
        m.runs,
        m.requests,
        settings.max_client_lag_ms,
        {s.runner: s.slots for s in m.servers if s.slots is not None},
        getattr(loaded.policy.runner, "burst_gap_ms", None),
    )
    delayed = sum(c.delayed for c in report.client)
    if delayed:
        notes = [
            *notes,
            f"client delayed: {delayed} of {sum(c.requests for c in report.client)} served requests were "
            f"begun or read more than {settings.max_client_lag_ms:g} ms late by gate's own client (schedule or "
            "event-loop lag) and left out of timing verdicts; see the client self-check",
        ]
    report.notes.extend([f"warning: {w}" for w in loaded.warnings] + notes)
    return CheckResult(report, code)
