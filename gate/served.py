"""Served runs: the plan's requests sent to servers (runner kind openai or llama_server) at
every load point of the policy, with the server's own spec-decode counters scoped to each
measured window.

For every law, load point (load.concurrency, then load.request_rate) and repetition, each
runner (the fallback and every draft) runs the same requests on the same prompts under the
same offered load, one runner at a time (a managed llama-server is started for it and the
previous one stopped: never two side by side on shared cores). The runner order rotates
with the load point and repetition, so slow drift of the machine does not always favour
the same runner. Per runner and window: warm-up requests (untimed), a scrape of the
server's counters, the timed requests, a second scrape; the difference is the window's
acceptance (gate.records.RunRecord.counters). A draft runner whose counters did not move
while it produced tokens had speculation off: an error, never a pass.

Nothing measured is lost: a failed request is a Failure at its runner, law and load point
and the run goes on; an interrupt stops the run with what it has; managed servers are
always stopped (close() in a finally block).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from gate.drafts import registry as draft_kinds
from gate.drafts.interface import ServedContext
from gate.errors import PolicyValueError
from gate.law import law_logits
from gate.load.interface import LoadStrategy
from gate.measure.contention import Probe
from gate.plan import Plan, PlannedPrompt, Request, request_seed
from gate.records import (FALLBACK, DraftInfo, Divergence, ExactnessRecord, Failure, FailureStage, Measurements,
                          RequestRecord, RunRecord, ServerRecord, SpecDecodeCounters)
import torch

from gate import interrupt
from gate.errors import describe_error
from gate.run import Phase, not_measured, request_record, run_phases
from gate.runners.interface import RequestResult, Runner

Progress = Callable[[str, int, int], None]  # (phase, done, total)
CACHE_DIR = Path.home() / ".cache" / "gate" / "gguf"  # GGUF files gate writes (early-exit drafts)


def load_points(policy: Any) -> list[LoadStrategy]:
    """The policy's load points in run order: closed-loop concurrencies, then open-loop
    rates (default: concurrency 1). Open-loop arrivals are seeded by workload.seed."""
    from gate.load.closed import ClosedLoop
    from gate.load.open import OpenLoop

    load = policy.load
    if load is None or (not load.concurrency and not load.request_rate):
        return [ClosedLoop(concurrency=1)]
    points: list[LoadStrategy] = [ClosedLoop(concurrency=c) for c in load.concurrency or []]
    points += [OpenLoop(request_rate=r, burstiness=load.burstiness, seed=policy.workload.seed,
                        concurrency=load.max_concurrency) for r in load.request_rate or []]
    return points


def point_of(load: LoadStrategy) -> tuple[int | None, float | None]:
    """(concurrency, request_rate) labels of a load point, as requests and failures carry them."""
    if load.request_rate is not None:
        return None, load.request_rate
    return load.concurrency, None


def describe_point(load: LoadStrategy) -> str:
    c, r = point_of(load)
    return f"concurrency {c}" if r is None else f"request rate {r:g}/s"


def target_gguf(plan: Plan) -> str:
    """The target's GGUF file (llama_server needs one). Raises PolicyValueError at target.model."""
    source = plan.target
    if not getattr(source, "gguf_file", None):
        raise PolicyValueError("target.model", f"runner llama_server serves a GGUF file; {source} is not one "
                               "(name a .gguf file or the packaged default)")
    return str(Path(source.location) / source.gguf_file)


def eos_ids(tokenizer: Any) -> set[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return {int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None}


def build_runner(plan: Plan) -> Runner:
    """The served runner of the policy (runner.kind openai or llama_server), checked to
    apply every declared law and constraint as gate does (check_served_law). Raises
    PolicyValueError naming the YAML path (a draft llama-server cannot run, a missing
    binary, a GGUF that cannot be written, a law field or constraint the server cannot
    honour)."""
    runner = _build_runner(plan)
    check_served_law(plan, runner)
    return runner


def law_path(policy: Any, i: int) -> str:
    """The YAML path of the policy's i-th law: `law` for a single mapping, `law[i]` for a list."""
    return f"law[{i}]" if isinstance(getattr(policy, "law", None), list) else "law"


def constraint_path(plan: Plan, fmt: Any) -> str:
    """The YAML path that declares constraint `fmt`: workload.constraints[j] for the first
    entry whose prompts carry it (a prompt's `constraint` label is the entry's name, or
    'prompt' for the entry that runs each prompt's own format), else workload.path (a
    prompt's own response_format in the prompt file, without workload.constraints)."""
    for j, entry in enumerate(getattr(plan.policy.workload, "constraints", None) or []):
        name = entry if entry == "prompt" else getattr(entry, "name", None)
        if name is not None and any(p.constraint == name and p.response_format == fmt
                                    for p in plan.workload.prompts):
            return f"workload.constraints[{j}]"
    return "workload.path"


def check_served_law(plan: Plan, runner: Runner) -> None:
    """Raise PolicyValueError at law[i].<field> (law.<field> for a single law), or at the
    constraint's path (constraint_path), for the first declared law, constraint, or law
    under a constraint that a runner of the policy cannot apply as gate does (the runner's
    law_refusals: the sources are there). Runners without law_refusals are not checked."""
    refusals = getattr(runner, "law_refusals", None)
    if refusals is None:
        return
    formats: dict[Any, str] = {}  # constraint -> the first prompt that has it
    for p in plan.workload.prompts:
        fmt = p.response_format
        if fmt is not None and fmt not in formats:
            formats[fmt] = p.id
    names = [FALLBACK, *plan.policy.drafts]
    for i, law in enumerate(plan.laws):
        for fmt in [None, *formats]:
            for name in names:
                try:
                    found = refusals(name, law, fmt)
                except (KeyError, ValueError):  # a runner name without an endpoint: validated elsewhere
                    continue
                for field, why in found:
                    if field == "constraint":
                        raise PolicyValueError(constraint_path(plan, fmt),
                                               f"runner {name!r} cannot apply the {fmt.describe()} constraint of prompt "
                                               f"{formats[fmt]!r} as gate does: {why}")
                    under = f" under the {fmt.describe()} constraint of prompt {formats[fmt]!r}" if fmt is not None else ""
                    raise PolicyValueError(f"{law_path(plan.policy, i)}.{field}",
                                           f"runner {name!r} cannot apply {field} of law {law.name!r}{under} as gate "
                                           f"does: {why}")


def _build_runner(plan: Plan) -> Runner:
    from gate.runners.registry import runner_class

    policy = plan.policy
    spec = policy.runner
    eos = eos_ids(plan.tokenizer)
    if spec.kind == "openai":
        from gate.runners.openai import Endpoint

        endpoints = {name: Endpoint(e.base_url, e.model, e.metrics_url, e.api, e.engine, spec.api_key_env)
                     for name, e in spec.endpoints.items()}
        return runner_class("openai")(endpoints, eos, request_timeout_s=spec.request_timeout_s,  # type: ignore[call-arg]
                                      ignore_eos=spec.ignore_eos, burst_gap_ms=spec.burst_gap_ms,
                                      max_consecutive_failures=spec.max_consecutive_failures)
    from gate.runners.llama_server import ServerConfig, find_binary

    binary = str(plan.resolve(spec.binary)) if spec.binary else find_binary()
    if not binary or not Path(binary).is_file() or not os.access(binary, os.X_OK):
        where = spec.binary or "$GATE_LLAMA_SERVER, llama-server on PATH, or scripts/build-llama-server.sh's build"
        raise PolicyValueError("runner.binary", f"no executable llama-server binary found ({where}); build it with "
                               "`make llama-server` or name it in runner.binary")
    model = target_gguf(plan)
    ctx = ServedContext(model, plan.path.parent, CACHE_DIR)
    servers = {FALLBACK: ServerConfig(model, extra_args=tuple(spec.extra_args))}
    for name, d in policy.drafts.items():
        kind = draft_kinds.get(d.kind)
        if kind.llama_server is None:
            raise PolicyValueError(f"drafts.{name}.kind", f"runner llama_server cannot run a {d.kind} draft "
                                   f"(kinds it runs: {', '.join(k.name for k in draft_kinds.kinds() if k.llama_server)})")
        served = kind.llama_server(name, d, ctx)
        servers[name] = ServerConfig(model, served.draft_model, served.spec_type, d.num_draft_tokens,
                                     tuple(served.extra_args) + tuple(spec.extra_args))
    parallel = max([p.concurrency or 1 for p in load_points(policy)] + [policy.load.max_concurrency or 1 if policy.load else 1])
    return runner_class("llama_server")(servers, binary, eos, threads=spec.threads, parallel=parallel,  # type: ignore[call-arg]
                                        ctx_size=spec.ctx_size, startup_timeout_s=spec.startup_timeout_s,
                                        request_timeout_s=spec.request_timeout_s, ignore_eos=spec.ignore_eos,
                                        burst_gap_ms=spec.burst_gap_ms,
                                        max_consecutive_failures=spec.max_consecutive_failures)


def measure_served(plan: Plan, runner: Runner, progress: Progress | None = None, oracle: Any = None) -> Measurements:
    """Every request of the plan at every load point through `runner` (see the module
    docstring), as raw records: requests labelled with their load point, one RunRecord per
    runner, law, load point and repetition with the server's counter deltas, the servers
    gate saw, greedy exactness against the fallback runner (with the local target's logit
    gap at each divergence when `oracle`, a gate.oracle.TargetOracle, is given), and the
    bill from configs. Never raises for a measurement that failed: it is a Failure.

    The phases (the requests, the served exactness pass, the bill) run under one guard
    (gate.run.run_phases): a SIGINT or SIGTERM, or measurement.max_wall_s running out
    (checked before each window and as each request ends), stops the phase in progress and
    keeps what was measured; each runner, law and load point with requests that did not
    end gets a failure saying how many and why, as does each pass not run; the bill is
    still made. interrupt.stopped_in() names the phase stopped."""
    from gate.measure.environment import environment, process_peak_rss_bytes, record_load

    progress = progress or (lambda *_: None)
    policy = plan.policy
    ms = policy.measurement
    names = [FALLBACK, *policy.drafts]
    m = Measurements(environment=environment(torch.device("cpu"), policy.workload.seed), laws=[law.name for law in plan.laws])
    m.drafts = {name: DraftInfo(d.kind, d.num_draft_tokens, draft_kinds.get(d.kind).probability_info)
                for name, d in policy.drafts.items()}
    m.workload = plan.workload.info
    points = load_points(policy)
    slo = policy.load.goodput.ms() if policy.load is not None and policy.load.goodput is not None else {}
    lengths = policy.workload.max_new_tokens_list
    prompts = list(plan.workload.prompts)
    total = len(plan.laws) * len(points) * ms.repetitions * len(names) * len(prompts) * len(lengths)
    ended: Counter = Counter()  # (runner, law, concurrency, rate) -> requests that ended (measured or failed)

    def run_requests() -> None:
        done = 0
        try:
            with runner:
                for law in plan.laws:
                    for li, load in enumerate(points):
                        for rep in range(ms.repetitions):
                            shift = (li + rep) % len(names)
                            for name in names[shift:] + names[:shift]:
                                interrupt.check_budget()  # between windows: none starts once the budget ran out
                                progress("requests", done, total)
                                requests = [Request(name, law, p, mnt, rep, request_seed(policy.workload.seed, p.id, law.name, mnt, rep))
                                            for mnt in lengths for p in prompts]
                                _window(runner, m, name, load, rep, requests, ms.warmup_requests, slo, ended)
                                done += len(requests)
                progress("requests", total, total)
        except Exception as e:  # noqa: BLE001 - e.g. a server that cannot start: recorded, the reports are written
            m.failures.append(Failure(FailureStage.RUN, "*", "*", "run", describe_error(e)))
        finally:
            m.servers = _servers(runner, names, policy.runner.kind)
            runner.close()

    def unmeasured(why: str, when: str) -> list[Failure]:
        """A failure per runner, law and load point with requests that did not end."""
        n = min(sum(ended.values()), total)
        text = not_measured(why, f"after {n} of {total} requests")
        per = ms.repetitions * len(prompts) * len(lengths)
        out = []
        for law in plan.laws:
            for load in points:
                c, r = point_of(load)
                for name in names:
                    k = per - ended.get((name, law.name, c, r), 0)
                    if k > 0:
                        out.append(Failure(FailureStage.REQUEST, name, law.name,
                                           f"{k} of {per} requests at {describe_point(load)}", text, c, r))
        return out

    def peaks() -> None:
        record_load(m.environment, m.requests)  # the machine's CPU pressure over the timed requests (contention)
        m.process_peak_rss_bytes = process_peak_rss_bytes()

    greedy_pairs = any(law.greedy for law in plan.laws if any(x == law.name for _, x in plan.exactness.pairs))
    phases = [
        Phase("the requests", FailureStage.REQUEST, run_requests, unmeasured,
              detail=lambda: f"{min(sum(ended.values()), total)} of {total} requests measured"),
        Phase("the served exactness pass", FailureStage.EXACTNESS, lambda: _greedy_exactness(plan, m, oracle, progress),
              unmeasured=None if greedy_pairs else (lambda why, when: [])),
        Phase("the bill", FailureStage.BILL, lambda: _bills(plan, m), after_stop=True),
        Phase("the peaks", FailureStage.RUN, peaks, after_stop=True, bookkeeping=True),
    ]
    run_phases(m, phases)
    return m


def _window(runner: Runner, m: Measurements, name: str, load: LoadStrategy, rep: int, requests: list[Request],
            warmup: int, slo: dict[str, float], ended: Counter | None = None) -> None:
    """One runner's window at one load point and repetition: warm-up, counters, requests,
    counters. `ended` counts the requests that ended (measured or failed) per (runner, law,
    concurrency, request_rate). Raises interrupt.OutOfTime as a request ends once
    measurement.max_wall_s has run out: the requests still in flight are cancelled and the
    rest not sent (so a run ends within the budget plus about one request's time limit)."""
    ended = ended if ended is not None else Counter()
    concurrency, rate = point_of(load)
    law = requests[0].law.name
    # A draft model proposes at every step, so counters that did not move mean speculation was off;
    # an n-gram draft (point mass) may find nothing to copy in a whole window.
    info = m.drafts.get(name)
    always_proposes = info is not None and info.probability_info == "distribution"
    gamma = (info.num_draft_tokens or 0) if info is not None else 0
    at = f"{describe_point(load)}, repetition {rep}"

    def fail(stage: FailureStage, what: str, message: str) -> None:
        m.failures.append(Failure(stage, name, law, what, message, concurrency, rate))

    if warmup:
        from gate.load.closed import ClosedLoop

        warm = [Request(name, r.law, r.prompt, min(8, r.max_new_tokens), r.repetition, r.seed) for r in requests[:warmup]]
        try:
            for i, result in enumerate(runner.run(warm, ClosedLoop(concurrency=1))):
                if isinstance(result, BaseException):
                    fail(FailureStage.WARM_UP, f"warm-up request {warm[i].prompt.id} at {at}", describe_error(result))
        except Exception as e:  # noqa: BLE001 - e.g. the server did not start: the window's requests will say so too
            fail(FailureStage.WARM_UP, f"warm-up at {at}", describe_error(e))
    before, scrape_error = _scrape(runner, name)
    records: list[RequestRecord] = []
    starts: list[tuple[float, RequestRecord]] = []

    def done(i: int, result: RequestResult) -> None:
        req = requests[i]
        ended[name, law, concurrency, rate] += 1
        if isinstance(result, BaseException):
            fail(FailureStage.REQUEST, f"request {req.prompt.id} at {at}", describe_error(result))
        else:
            rec = request_record(req, result, gamma, concurrency, rate)
            records.append(rec)
            starts.append((result.started_s, rec))
        interrupt.check_budget()  # the request is kept; no further one is sent once the budget ran out

    probe = Probe()
    started = probe.start()
    try:
        runner.run(requests, load, done)
    except Exception as e:  # noqa: BLE001 - nothing was sent (a server that cannot start): every request failed
        left = len(requests) - len(records)
        ended[name, law, concurrency, rate] += left
        fail(FailureStage.REQUEST, f"{left} requests at {at}", describe_error(e))
    finally:
        m.requests += records
        m.notes += runner.notes()  # what the runner saw beside the results (the kernel's listen-queue overflows)
        after, error = _scrape(runner, name)
        scrape_error = scrape_error or error
        if starts:
            w = RunRecord.of(name, law, load.offered(), starts, server=_info(runner, name))
            w.repetition = rep
            reading = probe.stop(started)
            if reading.cpu_stall_ms is not None and reading.wall_ms > 0:
                w.cpu_stall_share = min(1.0, reading.cpu_stall_ms / reading.wall_ms)
            w.counters = _delta(before, after)
            if slo:
                w.good_requests, w.slo_ms = sum(_meets(r, slo) for _, r in starts), dict(slo)
            m.runs.append(w)
            if scrape_error:
                fail(FailureStage.REQUEST, f"server counters at {at}", scrape_error)
            elif always_proposes and before is not None and (
                    w.counters is None or (w.counters.num_draft_tokens == 0 and w.counters.num_drafts == 0)):
                why = ("the server exposes no spec-decode counters" if w.counters is None else
                       "its spec-decode counters did not move")
                fail(FailureStage.REQUEST, f"server counters at {at}",
                     f"speculation was off: {why} while it committed {w.committed_tokens} tokens (some servers turn "
                     "speculation off for requests with logprobs, penalties or min-p)")


def _scrape(runner: Runner, name: str) -> tuple[Any, str | None]:
    """The runner's server counters now (None: it has no metrics endpoint), or the error."""
    counters = getattr(runner, "counters", None)
    if counters is None:
        return None, None
    try:
        return counters(name), None
    except Exception as e:  # noqa: BLE001 - an unreachable metrics URL is a failed measurement, not a crash
        return None, describe_error(e)


def _delta(before: Any, after: Any) -> SpecDecodeCounters | None:
    if before is None or after is None:
        return None
    from gate.runners.server_metrics import counter_delta

    return counter_delta(before, after)


def _info(runner: Runner, name: str) -> str | None:
    info = getattr(runner, "server_info", None)
    try:
        return info(name) if info is not None else None
    except Exception:  # noqa: BLE001 - identity is informative only
        return None


def _meets(r: RequestRecord, slo: dict[str, float]) -> bool:
    """Whether a request met every SLO (ms): ttft, tpot, e2el (vLLM's goodput; a request with
    one output token has no TPOT and meets that objective)."""
    values = {"ttft": r.ttft_ms, "tpot": r.tpot_ms, "e2el": r.e2el_ms}
    return all(not (values[k] > limit) for k, limit in slo.items())


def _servers(runner: Runner, names: list[str], kind: str) -> list[ServerRecord]:
    """What gate saw of each runner's engine (what the runner can tell: a managed server's
    command line and peak RSS, an endpoint's base URL, a version)."""
    endpoint, command, rss = (getattr(runner, a, None) for a in ("endpoint", "command_line", "peak_rss_bytes"))
    return [ServerRecord(name, kind, getattr(_safe(endpoint, name), "base_url", None), _safe(command, name),
                         _info(runner, name), _safe(rss, name)) for name in names]


def _safe(get: Any, name: str) -> Any:
    try:
        return get(name) if callable(get) else None
    except Exception:  # noqa: BLE001 - informative only
        return None


def _greedy_exactness(plan: Plan, m: Measurements, oracle: Any, progress: Progress | None = None) -> None:
    """Greedy exactness of served drafts: each draft runner's output equals the fallback
    runner's on the same prompt, length, repetition and load point, token for token. The
    first divergence of a request is recorded (later tokens follow other contexts), with how
    far the draft runner's token lies below the local target's top logit there when `oracle`
    is given, else an infinite gap (every divergence is a fault). The fallback runner is the
    control for the server's numerics: the largest such gap of its own tokens is recorded
    (ExactnessRecord.numerical_tolerance); the rules call a divergence within it undecidable.
    Gaps are taken under the law as greedy decoding sees it: logit bias, penalties with each
    position's own history, and the grammar of the prompt's constraint (_gaps).

    The local target's teacher-forced pass (_gaps, batched) runs only for a law with at
    least one request pair compared token for token: with no draft output that has token
    ids (every draft request failed, or the api returns counts only) it does not run at all.
    `progress("exactness", done, total)` counts the fallback outputs teacher-forced. Raises
    KeyboardInterrupt or interrupt.OutOfTime (the budget ran out between batches) as they come."""
    from gate.rules.samples import request_key
    from gate.runners.openai import UNKNOWN_ID

    progress = progress or (lambda *_: None)
    prompts = {p.id: p for p in plan.workload.prompts}
    laws = {law.name: law for law in plan.laws}
    greedy = {law.name for law in plan.laws if law.greedy}
    grammars = _Grammars(plan, oracle)
    compared: list[tuple[str, list[str], dict, dict, dict, dict]] = []
    for law in sorted({law for _, law in plan.exactness.pairs} & greedy):
        drafts = sorted(d for d, x in plan.exactness.pairs if x == law)
        fallback = {request_key(r): r for r in m.requests if r.draft == FALLBACK and r.law == law}
        recs = {d: ExactnessRecord(d, law, greedy=True) for d in drafts}
        found: dict[tuple, list[tuple[ExactnessRecord, int, int]]] = {}  # fallback cell -> (record, position, draft token)
        no_ids = dict.fromkeys(drafts, 0)
        for r in (x for x in m.requests if x.draft in recs and x.law == law):
            f = fallback.get(request_key(r))
            if f is None:
                continue
            if UNKNOWN_ID in f.output_ids or UNKNOWN_ID in r.output_ids:
                no_ids[r.draft] += 1  # counts only came back: nothing to compare token for token
                continue
            recs[r.draft].compared += 1
            pos = next((i for i, (a, b) in enumerate(zip(f.output_ids, r.output_ids)) if a != b), None)
            if pos is not None:
                found.setdefault(request_key(f), []).append((recs[r.draft], pos, r.output_ids[pos]))
        compared.append((law, drafts, fallback, recs, found, no_ids))
    passes = [law for law, _, _, recs, _, _ in compared if oracle is not None and any(r.compared for r in recs.values())]
    total = sum(len(_teacher_forceable(fallback)) for law, _, fallback, _, _, _ in compared if law in passes)
    done = [0]

    def step(n: int) -> None:
        done[0] += n
        progress("exactness", done[0], total)

    if passes:
        progress("exactness", 0, total)
    for law, drafts, fallback, recs, found, no_ids in compared:
        outside = 0
        try:
            if law in passes:
                control, outside = _gaps(oracle, prompts, fallback, found, laws[law], grammars, step)
            elif oracle is not None:  # nothing compared token for token: the local target's pass is not needed
                control = None
            else:  # no local target: every divergence is a fault
                control, found = None, {k: [(*hit, float("inf")) for hit in hits] for k, hits in found.items()}
        except Exception as e:  # noqa: BLE001
            m.failures += [Failure(FailureStage.EXACTNESS, d, law, "greedy exactness", describe_error(e)) for d in drafts]
            continue
        for d, rec in recs.items():
            rec.numerical_tolerance = control
            for key, hits in found.items():
                f = fallback[key]
                rec.divergences += [Divergence(f.prompt_id, pos, f.output_ids[pos], token, gap)
                                    for owner, pos, token, gap in hits if owner is rec]
            notes = []
            if no_ids[d]:
                notes.append(f"{no_ids[d]} request pair(s) came back without token ids (this api returns counts only: use "
                             "api llama_cpp, or a server that returns token ids)")
            if outside:
                notes.append(f"{outside} token(s) of the fallback runner lie outside gate's grammar for their prompt's "
                             "constraint, left out of the control: the server's grammar or its end tokens differ from "
                             "gate's (llama.cpp ends a grammar at any end-of-generation token, gate at the target's EOS)")
            rec.note = "; ".join(notes) or None
            m.exactness.append(rec)


def _teacher_forceable(fallback: dict[tuple, RequestRecord]) -> list[tuple[tuple, RequestRecord]]:
    """The fallback outputs the local target can be teacher-forced along (token ids, non-empty)."""
    from gate.runners.openai import UNKNOWN_ID

    return [(key, f) for key, f in fallback.items() if f.output_ids and UNKNOWN_ID not in f.output_ids]


class _Grammars:
    """Grammar matchers for the oracle side of served exactness, one per constraint, from gate's
    grammar engine over the target's tokenizer and the oracle's vocabulary, made on first use
    (an unconstrained run builds none)."""

    def __init__(self, plan: Plan, oracle: Any):
        self.plan = plan
        self.oracle = oracle
        self.engine: Any = None
        self.matchers: dict[Any, Any] = {}

    def matcher(self, fmt: Any) -> Any:
        """The Matcher of constraint `fmt` (None: None). Raises ValueError when it does not compile."""
        if fmt is None:
            return None
        if fmt not in self.matchers:
            if self.engine is None:
                from gate.constraints import grammar_engine

                tokenizer = self.plan.tokenizer
                self.engine = grammar_engine(tokenizer, int(self.oracle.vocab_size), eos_ids(tokenizer))
            self.matchers[fmt] = self.engine.matcher(fmt)
        return self.matchers[fmt]


def _gaps(oracle: Any, prompts: dict[str, PlannedPrompt], fallback: dict[tuple, RequestRecord],
          found: dict[tuple, list], law: Any = None, grammars: _Grammars | None = None,
          step: Callable[[int], None] | None = None) -> tuple[float | None, int]:
    """One teacher-forced pass of the local target along each fallback output (batched:
    teacher_forced; `step(n)` after each batch of n outputs) gives both
    the control (the largest gap below the local top logit of any token the fallback runner
    emitted; None without token ids) and, in place, the gap of each divergence found at that
    cell (its context is the fallback's prefix): `found` entries become (record, position,
    token, gap). Divergences without a local target keep an infinite gap.

    Logits are the law's (gate.law.law_logits: logit bias, penalties with the request's own history,
    the grammar of the prompt's constraint) when `law` (a gate.law.Law) has any of them, else
    raw. Returns (control, outside): outside counts the fallback's tokens gate's grammar
    forbids (a server grammar that differs from gate's): left out of the control; a
    divergence to a token gate's grammar forbids has an infinite gap."""
    worst: float | None = None
    outside = 0
    processed = law is not None and bool(law.logit_bias or law.needs_history)
    items = _teacher_forceable(fallback)
    seqs = [(list(prompts[f.prompt_id].token_ids) + list(f.output_ids), len(prompts[f.prompt_id].token_ids)) for _, f in items]
    for j, logits in teacher_forced(oracle, seqs, step):  # [T, V]: row i given the fallback's prefix
        key, f = items[j]
        prompt = prompts[f.prompt_id]
        ids = list(prompt.token_ids)
        full = seqs[j][0]
        fmt = prompt.response_format
        if law is not None and (processed or fmt is not None):
            grammar = grammars.matcher(fmt) if grammars is not None else None
            logits = law_logits(logits, law.bind(len(ids), grammar), full, len(ids))
        top = logits.max(dim=-1).values
        chosen = logits.gather(-1, torch.tensor(f.output_ids)[:, None]).squeeze(-1)
        allowed = torch.isfinite(chosen)
        outside += int((~allowed).sum())
        if bool(allowed.any()):
            gap = float((top - chosen)[allowed].max())
            worst = gap if worst is None else max(worst, gap)
        found[key] = [(rec, pos, token, _gap(top[pos], logits[pos, token])) for rec, pos, token in found.get(key, [])]
    return worst, outside


BATCH_ROWS = 8  # fallback outputs per teacher-forced forward of the local target
BATCH_LOGITS = 2 ** 26  # logits kept per forward (rows x positions x vocabulary): 256 MiB in float32


def teacher_forced(oracle: Any, seqs: list[tuple[list[int], int]],
                   step: Callable[[int], None] | None = None) -> Any:
    """Yield (i, logits) for each (ids, start) of `seqs`: the raw teacher-forced logits of
    `oracle` (a gate.oracle.TargetOracle) at positions start..len(ids)-1, float32
    [len(ids) - start, V], as TargetOracle.target_logits gives them (row k: the logits of
    ids[start + k] given ids[:start + k]), in an order of its own. Sequences of similar
    lengths go through the model together, right-padded with an attention mask (at most
    BATCH_ROWS rows and BATCH_LOGITS logits per forward; the logits of prompt positions are
    not computed where the model takes logits_to_keep); an oracle without a `model` (a
    torch module) is called one sequence at a time. Before each forward raises
    interrupt.OutOfTime once the budget ran out; `step(n)` after each forward of n
    sequences. Raises ValueError for a start below 1."""
    step = step or (lambda n: None)
    if any(start < 1 for _, start in seqs):
        raise ValueError("teacher forcing needs at least one token of prefix (start >= 1)")
    model = getattr(oracle, "model", None)
    if not isinstance(model, torch.nn.Module):
        for i, (ids, start) in enumerate(seqs):
            interrupt.check_budget()
            logits = oracle.target_logits(ids, start).float()
            step(1)
            yield i, logits
        return
    vocab = int(oracle.vocab_size)
    order = sorted(range(len(seqs)), key=lambda i: (seqs[i][1], len(seqs[i][0])))
    batch: list[int] = []
    for i in order:
        grown = [*batch, i]
        width = max(len(seqs[j][0]) - 1 for j in grown) - min(seqs[j][1] - 1 for j in grown)
        if batch and (len(grown) > BATCH_ROWS or len(grown) * width * vocab > BATCH_LOGITS):
            yield from _forward_batch(oracle, model, seqs, batch, step)
            batch = [i]
        else:
            batch = grown
    if batch:
        yield from _forward_batch(oracle, model, seqs, batch, step)


@torch.inference_mode()
def _forward_batch(oracle: Any, model: torch.nn.Module, seqs: list[tuple[list[int], int]], batch: list[int],
                   step: Callable[[int], None]) -> list[tuple[int, torch.Tensor]]:
    """One right-padded forward over the sequences `batch` indexes (see teacher_forced)."""
    interrupt.check_budget()
    inputs = [seqs[j][0][:-1] for j in batch]
    width = max(len(x) for x in inputs)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, x in enumerate(inputs):
        ids[r, :len(x)] = torch.tensor(x, dtype=torch.long)
        mask[r, :len(x)] = 1
    first = min(seqs[j][1] - 1 for j in batch)  # the first position whose logits any row needs
    args = dict(input_ids=ids.to(oracle.device), attention_mask=mask.to(oracle.device), use_cache=False)
    try:
        logits = model(**args, logits_to_keep=width - first).logits
    except TypeError:  # a model without logits_to_keep: every position
        logits = model(**args).logits
    offset = width - logits.shape[1]  # the position of logits[:, 0]
    out = [(j, logits[r, seqs[j][1] - 1 - offset:len(inputs[r]) - offset].float()) for r, j in enumerate(batch)]
    step(len(batch))
    return out


def _gap(top: torch.Tensor, value: torch.Tensor) -> float:
    """top - value, infinite when the token is forbidden (value -inf) or the row is empty."""
    gap = float(top - value)
    return gap if gap == gap else float("inf")  # nan: -inf - -inf, a row the grammar left empty


def _bills(plan: Plan, m: Measurements) -> None:
    """The bill of every runner from configs, without loading weights (as `gate bill`)."""
    from gate.resources import policy_bills

    try:
        m.bills = policy_bills(plan)
    except Exception as e:  # noqa: BLE001 - a bill that cannot be computed is a failed measurement
        m.failures.append(Failure(FailureStage.BILL, "*", "*", "bill", describe_error(e)))


__all__ = ["build_runner", "describe_point", "load_points", "measure_served", "point_of", "target_gguf"]
