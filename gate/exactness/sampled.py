"""Sampled-law exactness of served engines, black box: the sampling plan and the raw material
of its tests (the verdicts are in gate.exactness.verdict).

A served engine's first output token comes from the prefill, the target alone; speculation
begins at the second. So the tests here rest on positions speculation produces: short
requests (SAMPLE_TOKENS tokens) are repeated on a few prompts, each with its own seed, by
every runner (the fallback first) and spread over the policy's concurrency points, and the
law of the token at output position j >= 1 is tested *given the engine's own tokens before
it*, grouped by that prefix (gate.exactness.collect.contexts). Two references:

- one-sample: the local target's declared law along the engine's own prefix (p by teacher
  forcing, the law applied with history as in-process), counted in ExactnessRecord.next_token;
  valid where the server runs the declared target at a precision below the test's
  resolution, which the fallback runner's own samples check first (the rules);
- two-sample: the same server with speculation off, the fallback runner's samples at the
  same prompt and prefix (ExactnessRecord.two_sample), robust to quantized or fused kernels.

The number of samples per prompt is the policy's next_token_samples, or (0) chosen here from
the local target's law so that the claim test at the first speculative position (after the
likeliest first token) reaches the rule's detect_tv at its power (planned_samples).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch

from gate.core.requests import PlannedPrompt, Request, request_seed
from gate.exactness.collect import contexts, sparse_counts
from gate.exactness.stats import DEFAULT_SIGNIFICANCE
from gate.load.closed import ClosedLoop
from gate.load.interface import LoadStrategy
from gate.load.points import describe_point
from gate.loop import interrupt
from gate.plan.matrix import AUTO_SAMPLE_BUDGET, Asked, samples_asked
from gate.records import (
    FALLBACK,
    ExactnessRecord,
    Measurements,
    SpecDecodeCounters,
    TwoSampleCounts,
)

SAMPLE_TOKENS = 4  # output tokens per sample request: the prefill's, then positions 1-3 of the first verification steps
MAX_PLANNED_SAMPLES = (
    AUTO_SAMPLE_BUDGET  # per prompt, runner and law when gate chooses, unless measurement.budget.samples
)
DEFAULT_SAMPLES = 1024  # per prompt when gate chooses without a local target to size the plan from
MIN_CONTEXT = 50  # samples at an output prefix for a next-token test there (one- or two-sample)
MAX_CONTEXTS = 4  # output prefixes tested per prompt, runner and law (the most shared)
TESTS_PER_PROMPT = (
    1 + 2 * MAX_CONTEXTS
)  # the Holm family a planned size assumes per prompt and draft (see plan_samples)

Progress = Callable[[str, int, int], None]


@dataclass
class SamplePlan:
    """The served samples of one sampling law: every runner in `runners` (the fallback first)
    draws `samples[prompt id]` requests of `tokens` output tokens on each of `prompts`, split
    evenly over `points` (closed loops); `why`: how the number was chosen (reported)."""

    law: Any  # gate.core.law.Law
    runners: list[str]
    prompts: list[PlannedPrompt]
    samples: dict[str, int]
    points: list[LoadStrategy]
    tokens: int = SAMPLE_TOKENS
    why: str = ""
    first: dict[str, int] = field(default_factory=dict)  # prompt id -> the index of its first sample (a later look's)

    def look(self, before: float, upto: float, runners: list[str]) -> SamplePlan:
        """What a sample look adds to this plan (gate.rules.sequential.SAMPLE_LOOKS): the
        samples from fraction `before` to `upto` of each prompt's plan (rounded up), for
        `runners` only, numbered on from the earlier looks' (their seeds differ)."""
        lo = {p: math.ceil(n * before) for p, n in self.samples.items()}
        hi = {p: math.ceil(n * upto) for p, n in self.samples.items()}
        return replace(self, runners=runners, samples={p: hi[p] - lo[p] for p in self.samples}, first=lo)

    @property
    def requests_per_runner(self) -> int:
        return sum(self.samples.values())

    def describe(self) -> str:
        """One line: requests, tokens, load points and why this many."""
        n = self.requests_per_runner * len(self.runners)
        points = ", ".join(describe_point(p) for p in self.points)
        return (
            f"{self.law.name}: {n} sample requests ({', '.join(f'{k} x {v}' for k, v in self.samples.items())} per "
            f"runner, {len(self.runners)} runners) of {self.tokens} tokens = {n * self.tokens} tokens, at {points}; "
            f"{self.why}"
        )


def sample_points(points: list[LoadStrategy]) -> list[LoadStrategy]:
    """The load points samples are drawn at: each closed-loop point, and an open-loop point as
    a closed loop at its max_concurrency (the law must hold in a full batch; waiting for a
    request rate's arrivals adds nothing to the test but wall time); concurrency 1 if none."""
    out: list[LoadStrategy] = []
    for p in points:
        c = p.concurrency if p.concurrency is not None else 1
        if c not in [q.concurrency for q in out]:
            out.append(ClosedLoop(concurrency=c))
    return out or [ClosedLoop(concurrency=1)]


def plan_samples(session: Any, exactness: Any, points: list[LoadStrategy], share: float = 1.0) -> list[SamplePlan]:
    """The SamplePlan of every sampling law an exactness pair of `exactness` (gate.plan.matrix.
    ExactnessPlan) names, for the served `session` (gate.loop.session.Session): the fallback and
    the drafts of that law's pairs, the first next_token_prompts prompts, the policy's
    next_token_samples per prompt or, when auto, planned_samples from the local target's law
    (DEFAULT_SAMPLES without a local target); none for a law whose rules ask 0. `share`: the
    part of the rule's significance the plan's full size is decided at (a sequential run's
    last sample look, gate.rules.sequential.sample_level; 1: the fixed plan). Raises what
    the local target's forward raises."""
    laws = {law.name: law for law in session.laws}
    out = []
    for name in sorted({law for _, law in exactness.pairs}):
        law = laws.get(name)
        if law is None or law.greedy:
            continue
        drafts = sorted(d for d, x in exactness.pairs if x == name and d in session.draft_infos)
        if not drafts:
            continue
        prompts = list(session.prompts[: exactness.next_token_prompts])
        asked = samples_asked(exactness.next_token_samples.get((d, name), Asked()) for d in drafts)
        if asked.none:
            continue  # no next-token test asked (gate validate refuses it for a served run)
        tv, power, alpha = min(exactness.demands.get((d, name), (0.1, 0.9, DEFAULT_SIGNIFICANCE)) for d in drafts)
        level = share * alpha / max(1, TESTS_PER_PROMPT * len(prompts) * len(drafts))
        at_least = f", at least the {asked.fixed} a rule asks" if asked.fixed else ""
        if not asked.auto:
            samples = {p.id: asked.fixed for p in prompts}
            why = f"next_token_samples {asked.fixed} per prompt (the policy)"
        elif session.oracle is None:
            samples = {p.id: max(asked.fixed, DEFAULT_SAMPLES) for p in prompts}
            why = f"{DEFAULT_SAMPLES} per prompt{at_least} (gate's default: no local target to size the plan from)"
        else:
            most = exactness.most_samples
            samples = {
                p.id: asked.draw(partial(planned_samples, session, law, p, tv, power, level, most)) for p in prompts
            }
            why = (
                f"chosen by gate from the local target's law: the claim test after one of each prompt's "
                f"{PLANNED_FIRST_TOKENS} likeliest first tokens detects TV {tv:g} at power {power:g} at level "
                f"{level:.3g} (at most {most} per prompt, measurement.budget.samples{at_least})"
            )
        out.append(SamplePlan(law, [FALLBACK, *drafts], prompts, samples, sample_points(points), why=why))
    return out


def planned_cost(plan: Any) -> list[str]:
    """What a validated plan (gate.plan.matrix.Plan) will draw for the next-token tests of
    sampled exactness, one line per sampling law, before any model is loaded: served, the
    sample requests and their output tokens; in process, the speculative first steps; exact
    where the policy sets next_token_samples, else the most gate may choose
    (MAX_PLANNED_SAMPLES per prompt); [] without a sampled exactness pair that asks any.
    Served wall time is predicted at check, from the timed requests (a note in the report)."""
    local = plan.loaded.policy.runner.runs_models_here
    ex = plan.exactness
    out = []
    for law in plan.laws:
        drafts = sorted(d for d, x in ex.pairs if x == law.name)
        asked = samples_asked(ex.next_token_samples.get((d, law.name), Asked()) for d in drafts)
        if law.greedy or not drafts or asked.none:
            continue
        prompts = len(plan.workload.prompts[: ex.next_token_prompts])
        per = max(asked.fixed, ex.most_samples) if asked.auto else asked.fixed
        most, chosen = ("at most ", "; gate sizes it from the target at check") if asked.auto else ("", "")
        if local:
            n = per * prompts * len(drafts)
            out.append(
                f"in-process next-token samples under {law.name}: {most}{n} speculative first steps ({per} per "
                f"prompt x {prompts} prompts x {len(drafts)} drafts{chosen})"
            )
            continue
        n = per * prompts * (len(drafts) + 1)
        out.append(
            f"served exactness samples under {law.name}: {most}{n} requests of "
            f"{SAMPLE_TOKENS} tokens ({n * SAMPLE_TOKENS} tokens: {per} per prompt x {prompts} prompts x "
            f"{len(drafts) + 1} runners{chosen})"
        )
    return out


@torch.inference_mode()
def planned_samples(
    session: Any,
    law: Any,
    prompt: PlannedPrompt,
    tv: float,
    power: float,
    alpha: float,
    most: int = MAX_PLANNED_SAMPLES,
) -> int:
    """Samples of `prompt` so that the next-token G-test at output position 1, after one of the
    target's PLANNED_FIRST_TOKENS likeliest first tokens x, the one needing the fewest samples
    (p(x) of the samples land there; sized for the lower 2.5%
    quantile of that binomial count), detects TV `tv` with probability `power` at level
    `alpha` (gate.exactness.stats: the noncentral chi-square bound, the pooled mass of
    rare categories added), at most `most`. Sized for the one-sample reference:
    where the verdict must rest on the two-sample one (a fallback runner that fails the
    one-sample test) about twice as many are needed, and the verdict says so."""
    ids, fmt = list(prompt.token_ids), prompt.response_format
    first = session.oracle.next_token_law(ids, [], law, fmt).float()
    best = most
    for x in torch.topk(first, min(PLANNED_FIRST_TOKENS, first.numel())).indices.tolist():
        share = float(first[x])
        if share <= 0:
            continue
        nxt = session.oracle.next_token_law(ids, [x], law, fmt).float()
        best = min(best, _samples_for(nxt, share, tv, power, alpha, most))
    return best


PLANNED_FIRST_TOKENS = 3  # first tokens whose position-1 test a plan is sized for (the cheapest one wins)


@torch.inference_mode()
def planned_first_steps(
    session: Any,
    law: Any,
    prompt: PlannedPrompt,
    tv: float,
    power: float,
    alpha: float,
    most: int = MAX_PLANNED_SAMPLES,
) -> int:
    """Speculative first steps of `prompt` (in process: every step starts right after the
    prompt, so every sample lands at the claim position) so that the claim G-test there, whose
    law is the target's first-token law, detects TV `tv` with probability `power` at level
    `alpha` (as planned_samples, with all the samples at that context), at most `most`."""
    first = session.oracle.next_token_law(prompt.token_ids, [], law, prompt.response_format).float()
    return _samples_for(first, 1.0, tv, power, alpha, most)


def _samples_for(
    nxt: torch.Tensor, share: float, tv: float, power: float, alpha: float, most: int = MAX_PLANNED_SAMPLES
) -> int:
    """Samples of a prompt so that the test after a first token of probability `share`, whose
    next-token law is `nxt` [V], reaches `tv` (see planned_samples)."""
    from gate.exactness.stats import _smallest_n, gtest_detectable

    probs = torch.sort(nxt[nxt > 0], descending=True).values

    def enough(n: int) -> bool:
        # the samples landing there are Binomial(n, share): power at its lower 2.5% quantile, and the categories the
        # test keeps apart (its degrees of freedom) at the upper one, so that neither end falls short
        spread = 2.0 * math.sqrt(n * share * (1.0 - share))
        at = n * share - spread
        big = (n * share + spread) * probs >= 5.0
        k = int(big.sum())
        if at <= 0 or k < 2:
            return False
        rest = probs[~big]
        pooled = float(rest.sum()) if rest.numel() >= 2 else 0.0
        df = k  # k kept categories and the cell of the rest (the test always carries one: sparse_counts' rest)
        return gtest_detectable(int(at), df, alpha, power) + pooled <= tv

    if probs.numel() < 2:
        return 2 * MIN_CONTEXT  # a one-token law there: any other token fails at once
    return min(most, _smallest_n(enough, limit=most))


def sample_requests(plan: SamplePlan, name: str, point: int, seed: int) -> list[Request]:
    """Runner `name`'s sample requests of `plan` at its `point`-th load point: each prompt's
    samples split evenly over the points, each with its own seed (request_seed over the runner,
    prompt, law and sample index), so a verdict can be replayed. Drawn by the loop
    (gate.loop.run), as every timed request is."""
    reqs = []
    for prompt in plan.prompts:
        n, lo = plan.samples[prompt.id], plan.first.get(prompt.id, 0)
        share = range(lo + point * n // len(plan.points), lo + (point + 1) * n // len(plan.points))
        reqs += [
            Request(
                name,
                plan.law,
                prompt,
                plan.tokens,
                i,
                request_seed(seed, f"{prompt.id}|{name}|sample", plan.law.name, plan.tokens, i),
            )
            for i in share
        ]
    return reqs


def speculated_note(d: SpecDecodeCounters) -> str:
    """How much speculation the samples exercised, from the server's counter deltas over them:
    the tests see the accept path only where proposals were accepted."""
    return (
        f" (the server's counters: {d.num_draft_tokens} tokens proposed, {d.num_accepted_tokens} accepted: the "
        "tests reach the accept path only through accepted proposals)"
    )


@torch.inference_mode()
def sampled_exactness(
    session: Any,
    m: Measurements,
    exactness: Any,
    progress: Progress | None = None,
    laws_at: dict[tuple[str, str, tuple[int, ...]], torch.Tensor] | None = None,
) -> None:
    """The raw material of served sampling-law exactness from m.samples: for every runner of
    a sampled pair, the fallback too (the reference check), one ExactnessRecord
    (runner_record) with the local target's law at each context where it is loaded, in place
    of any record of that runner and law already there (a sequential run builds them after
    every sample look). `laws_at`: (law, prompt id, prefix) -> the local target's law there,
    kept between such builds. Raises what the local target's forward raises (the pass is a
    Phase: a failure)."""
    progress = progress or (lambda *_: None)
    known = laws_at if laws_at is not None else {}
    prompts = {p.id: p for p in session.prompts}
    laws = {law.name: law for law in session.laws}
    sampled = sorted({law for _, law in exactness.pairs if law in laws and not laws[law].greedy})
    jobs = [(law, d) for law in sampled for d in [FALLBACK, *sorted(d for d, x in exactness.pairs if x == law)]]
    for i, (law_name, name) in enumerate(jobs):
        progress("exactness", i, len(jobs))
        law = laws[law_name]

        def target_law(prompt_id: str, prefix: tuple[int, ...], law: Any = law) -> torch.Tensor:
            key = (law.name, prompt_id, tuple(prefix))
            if key not in known:
                interrupt.check_budget()
                prompt = prompts[prompt_id]
                probs = session.oracle.next_token_law(prompt.token_ids, prefix, law, prompt.response_format)
                known[key] = probs.cpu()
            return known[key]

        outputs = _outputs(m, name, law_name)
        if not outputs:
            continue  # nothing drawn: the rule says the measurement is missing (the failures say why)
        rec = runner_record(
            name,
            law_name,
            outputs,
            None if name == FALLBACK else _outputs(m, FALLBACK, law_name),
            target_law if session.oracle is not None else None,
        )
        rec.sample_wall_s = m.sample_wall_s.get(f"{name}/{law_name}", 0.0)
        # a sequential run builds them after every sample look: the last build, on every sample, stands
        m.exactness = [r for r in m.exactness if (r.draft, r.law) != (name, law_name)] + [rec]
    progress("exactness", len(jobs), len(jobs))


def _outputs(m: Measurements, runner: str, law: str) -> dict[str, list[list[int]]]:
    """prompt id -> the output ids of `runner`'s samples under `law`, in the order drawn."""
    out: dict[str, list[list[int]]] = defaultdict(list)
    for s in m.samples:
        if s.runner == runner and s.law == law:
            out[s.prompt_id].append(s.output_ids)
    return dict(out)


def runner_record(
    name: str,
    law: str,
    outputs: dict[str, list[list[int]]],
    reference: dict[str, list[list[int]]] | None,
    target_law: Callable[[str, tuple[int, ...]], torch.Tensor] | None,
) -> ExactnessRecord:
    """The ExactnessRecord (speculative_from 1) of one served runner's samples under `law`:
    `outputs` (prompt id -> output ids of each sample), counted against `target_law(prompt id,
    output prefix)` (the local target's law there, [V]; None: no local target) at the most
    shared prefixes (gate.exactness.collect.contexts; the first position, the prefill's,
    included: it tests the server's law, not speculation), and, for a draft runner, against
    `reference` (the fallback runner's outputs) at every prefix both share with at least
    MIN_CONTEXT samples (two_sample_counts)."""
    rec = ExactnessRecord(name, law, greedy=False, speculative_from=1)
    rec.sample_requests = sum(len(o) for o in outputs.values())
    rec.sample_tokens = sum(len(x) for o in outputs.values() for x in o)
    for pid, outs in sorted(outputs.items()):
        if target_law is not None:
            for prefix, tokens in contexts(
                outs, min_first=MIN_CONTEXT, min_later=MIN_CONTEXT, max_later=MAX_CONTEXTS, max_depth=SAMPLE_TOKENS
            ):
                rec.next_token.append(sparse_counts(pid, tokens, target_law(pid, prefix), prefix=prefix))
        if reference is not None:
            rec.two_sample += two_sample_counts(pid, outs, reference.get(pid, []))
    return rec


def two_sample_counts(prompt_id: str, outputs: list[list[int]], reference: list[list[int]]) -> list[TwoSampleCounts]:
    """Next-token counts of `outputs` and `reference` (the fallback's outputs of the same prompt
    and law) at every output prefix of 1..SAMPLE_TOKENS - 1 tokens both reach at least
    MIN_CONTEXT times, the MAX_CONTEXTS most shared (by the smaller count; ties by prefix)."""

    def nexts(outs: list[list[int]]) -> dict[tuple[int, ...], list[int]]:
        d: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for out in outs:
            for j in range(1, min(len(out), SAMPLE_TOKENS)):
                d[tuple(out[:j])].append(out[j])
        return d

    a, b = nexts(outputs), nexts(reference)
    shared = [k for k in a.keys() & b.keys() if min(len(a[k]), len(b[k])) >= MIN_CONTEXT]
    shared.sort(key=lambda k: (-min(len(a[k]), len(b[k])), k))
    out = []
    for k in shared[:MAX_CONTEXTS]:
        tokens = sorted(set(a[k]) | set(b[k]))
        out.append(
            TwoSampleCounts(
                prompt_id, list(k), tokens, [a[k].count(t) for t in tokens], [b[k].count(t) for t in tokens]
            )
        )
    return out


def predicted_wall_s(plans: list[SamplePlan], m: Measurements) -> float | None:
    """The samples' wall time (s) predicted from the timed requests: per runner and load
    point, the median TTFT plus (tokens - 1) median TPOT of its timed requests, over the
    concurrency; None when a runner has no timed request to predict from."""
    import statistics

    total = 0.0
    for plan in plans:
        for name in plan.runners:
            for point in plan.points:
                c = point.concurrency or 1
                mine = [r for r in m.requests if r.draft == name and (r.concurrency in (c, None))]
                if not mine:
                    return None
                ttfts = [r.ttft_ms for r in mine if r.ttft_ms == r.ttft_ms]
                if not ttfts:
                    return None
                ttft = statistics.median(ttfts)
                tpots = [r.tpot_ms for r in mine if r.tpot_ms == r.tpot_ms]
                tpot = statistics.median(tpots) if tpots else 0.0
                per = (ttft + (plan.tokens - 1) * tpot) / 1e3
                total += per * plan.requests_per_runner / len(plan.points) / c
    return total
