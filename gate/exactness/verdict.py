"""Exactness rules: does speculative output follow the target's declared law?

Greedy laws: token-for-token equality with the fallback; a divergence whose target top-1
minus top-2 logit gap exceeds the rule's tie tolerance is a fault, one within it a
numerical near-tie (reported, not failed). Sampling laws: a next-token G-test at the first
output position of every prompt sampled often enough (the *claim* tests), next-token tests
after output prefixes many samples share and the PIT Kolmogorov-Smirnov test over every
generated token (*evidence* tests), Holm-corrected together across every draft and law the
rule covers (gate.exactness.stats). Any rejection fails. A sampling verdict passes only
when there is a claim test and every claim test could detect the rule's detect_tv (the TV
distance of the next-token law at that context) with the rule's power at its Holm level;
otherwise it is inconclusive and says how many samples it needs.

Served engines (records with speculative_from 1, gate.exactness.sampled): the first output
position is the prefill's, so claims rest on later positions, given the engine's own prefix;
the reference is checked first on the fallback runner's samples (served_tests): the declared
target (one-sample) while they pass it, else the fallback runner itself (two-sample).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gate.exactness.stats import (
    CLAIM,
    EVIDENCE,
    FAIL,
    ExactnessTest,
    decide,
    gtest_samples_needed,
    next_token_test,
    overall,
    pit_test,
    two_sample_test,
)
from gate.records import (
    FALLBACK,
    RECORDED_SAMPLES,
    ExactnessRecord,
    Measurements,
    NextTokenCounts,
    TwoSampleCounts,
    describe_failures,
)
from gate.rules.outcome import EXACTNESS, Outcome
from gate.rules.sequential import sample_level
from gate.rules.status import Status

if TYPE_CHECKING:
    from gate.policy.model import RuleSpec


def context_test(nt: NextTokenCounts, rule: RuleSpec, role: Any = None) -> ExactnessTest:
    """The G-test at one context (`rule`: significance, power, detect_tv): a claim at a
    prompt's first output position, evidence after a prefix (`role`, when given, instead)."""
    counts = np.asarray(nt.counts + [nt.rest_count, nt.zero_count], dtype=float)
    p = np.asarray(nt.support_probs + [nt.rest_prob, 0.0], dtype=float)
    where = f"{nt.prompt_id} after output {list(nt.prefix)}" if nt.prefix else nt.prompt_id
    test = next_token_test(counts, p, rule.significance, rule.power, rule.detect_tv, name=f"next-token[{where}]")
    test.role = role if role is not None else EVIDENCE if nt.prefix else CLAIM
    return test


@dataclass
class ServedReference:
    """Which reference decides a served draft runner's sampling verdict: "target" (one-sample
    against the local target's declared law, valid because the fallback runner's own samples
    pass it) or "fallback" (two-sample against the fallback runner: the fallback fails the
    one-sample test, or there is no local target); `text` says so in the verdict."""

    reference: str
    text: str


def served_tests(
    rule: RuleSpec, rec: ExactnessRecord, ref: ExactnessRecord
) -> tuple[list[ExactnessTest], ServedReference]:
    """The tests of a served draft runner's samples `rec` and the reference they rest on,
    checked first on the fallback runner's `ref`: its one-sample tests against the local
    target, Holm-corrected on their own at the rule's significance. Where none rejects, the
    reference is the declared target: per prompt the most powerful test after a prefix of one
    or more output tokens (a speculative position) is the claim, every other one-sample test and
    every two-sample test evidence (the prefill's position tests the server, not speculation).
    Otherwise the draft's one-sample tests are left out (they would blame speculation for
    the server's numerics) and per prompt the best two-sample test is the claim."""
    checks = [context_test(nt, rule, role=EVIDENCE) for nt in ref.next_token]
    decide(checks, rule.significance)
    rejected = [t for t in checks if t.verdict == FAIL]
    one = [context_test(nt, rule, role=EVIDENCE) for nt in rec.next_token]
    two = [_two_sample(ts, rule) for ts in rec.two_sample]
    detail = "; ".join(f"{t.name} p {t.pvalue:.3g} over {t.n}" for t in checks[:4])
    if checks and not rejected:
        _claim_per_prompt(one, [nt.prompt_id for nt in rec.next_token], [bool(nt.prefix) for nt in rec.next_token])
        text = (
            f"reference: the declared target (one-sample), valid since the fallback runner's own samples pass it "
            f"({len(checks)} tests, none rejected at family-wise {rule.significance:g}: {detail}); the two-sample "
            "tests against the fallback runner are evidence"
        )
        return one + two, ServedReference("target", text)
    why = (
        "the fallback runner itself fails the one-sample test against the declared target ("
        + "; ".join(f"{t.name} Holm p {t.adjusted_pvalue:.3g}" for t in rejected[:3])
        + "): the server's numerics are not the local target's, so the draft runner's one-sample tests are not used"
        if rejected
        else "no local target to test the fallback runner against"
    )
    _claim_per_prompt(two, [ts.prompt_id for ts in rec.two_sample], [True] * len(two))
    return two, ServedReference(
        "fallback", f"reference: the fallback runner, same server with speculation off (two-sample), since {why}"
    )


def _claim_per_prompt(tests: list[ExactnessTest], prompts: list[str], eligible: list[bool]) -> None:
    """Make the eligible test of each prompt that detects the smallest TV (its power stated at
    the rule's significance; ties: more samples) its claim; every other test stays evidence.
    The choice rests on sample counts and the target's law at each prefix (one-sample), or on
    the two runners' pooled counts there (two-sample: the margins the homogeneity test is
    conditional on), never on how the tokens split between hypotheses, so the level holds."""
    best: dict[str, ExactnessTest] = {}

    def rank(t: ExactnessTest) -> tuple[float, float]:
        return (t.detectable, -(t.effective_n if t.effective_n is not None else t.n))

    for t, pid, ok in zip(tests, prompts, eligible, strict=False):
        if ok and (pid not in best or rank(t) < rank(best[pid])):
            best[pid] = t
    for t in best.values():
        t.role = CLAIM


def _two_sample(ts: TwoSampleCounts, rule: RuleSpec) -> ExactnessTest:
    test = two_sample_test(
        ts.counts,
        ts.reference_counts,
        rule.significance,
        rule.power,
        rule.detect_tv,
        name=f"two-sample[{ts.prompt_id} after output {list(ts.prefix)}, vs fallback]",
    )
    test.role = EVIDENCE
    return test


def evaluate_exactness(rule: RuleSpec, m: Measurements, drafts: list[str], laws: list[str]) -> list[Outcome]:
    """One outcome per (draft, law) in scope; sampling tests share one Holm family. A
    sequential run's served samples (m.sample_looks) are decided at the significance of the
    last sample look drawn (gate.rules.sequential.sample_level), every record of the family
    with them, those that stopped at an earlier look too (a look's family test at its own
    level, so the looks together hold the rule's significance)."""
    sample_look = m.sample_looks.taken if m.sample_looks is not None else 0
    looked = ""
    if sample_look:
        looked = (
            f"sample look {sample_look} of {len(m.sample_looks.fractions) if m.sample_looks else 0}, "
            f"its share of significance {rule.significance:g}; "
        )
        rule = rule.model_copy(update={"significance": sample_level(rule.significance, sample_look)})
    base: dict[str, Any] = dict(
        rule_id=rule.id,
        metric=EXACTNESS,
        aggregation="-",
        comparison="",
        threshold=rule.detect_tv,
        relative_to=None,
        level=rule.level,
        fallback_value=None,
    )
    records = {(r.draft, r.law): r for r in m.exactness}
    sampling: dict[tuple[str, str], list[ExactnessTest]] = {}
    served: dict[tuple[str, str], ServedReference] = {}
    outcomes: dict[tuple[str, str], Outcome] = {}
    # Recorded samples (gate exactness) name their own sources: only the laws they were sampled under.
    pairs = [(d, law) for d in drafts for law in laws if (d, law) in records or _kind(m, d) != RECORDED_SAMPLES]
    for d, law in pairs:
        key = (d, law)
        scope = f"{d}/{law}"
        # a failed request leaves its tokens untested: the verdict would rest on what is left
        failed = [
            f
            for f in m.failures
            if f.draft in (d, "*")
            and f.law in (law, "*")
            and f.stage in ("exactness", "run", "request", "verification")
        ]
        rec = records.get(key)
        if rule.level == "off":
            outcomes[key] = Outcome(
                **base,
                scope=scope,
                draft=d,
                law=law,
                status=Status.SKIPPED,
                measured=None,
                samples=0,
                message="exactness: level off, not evaluated",
            )
        elif failed or rec is None:
            why = describe_failures(failed) or "no exactness measurement for this scope"
            outcomes[key] = Outcome(
                **base,
                scope=scope,
                draft=d,
                law=law,
                status=Status.ERROR,
                measured=None,
                samples=0,
                message=f"exactness: measurement missing ({why})",
            )
        elif rec.greedy:
            outcomes[key] = _greedy(rule, rec, base, scope)
        elif rec.speculative_from:  # served: the reference first (the fallback runner's own samples)
            ref = records.get((FALLBACK, law))
            if ref is None:
                outcomes[key] = Outcome(
                    **base,
                    scope=scope,
                    draft=d,
                    law=law,
                    status=Status.ERROR,
                    measured=None,
                    samples=0,
                    message="exactness (sampling, served): the fallback runner's samples, the reference, are missing",
                )
                continue
            tests, served[key] = served_tests(rule, rec, ref)
            sampling[key] = tests
        else:
            tests = []
            if rec.pit:
                tests.append(
                    pit_test(
                        [np.nan if u is None else u for u in rec.pit], rule.significance, rule.power, rule.detect_tv
                    )
                )
            tests += [context_test(nt, rule) for nt in rec.next_token]
            sampling[key] = tests
    if not pairs:
        return [
            Outcome(
                **base,
                scope="*",
                draft="*",
                law="*",
                status=Status.ERROR,
                measured=None,
                samples=0,
                message="exactness: nothing recorded matches this rule's scope "
                f"(laws: {', '.join(rule.scope.laws or laws)}; "
                f"recorded: {', '.join(sorted(f'{d}/{law}' for d, law in records)) or 'none'})",
            )
        ]
    decide([t for tests in sampling.values() for t in tests], rule.significance)
    for key, tests in sampling.items():
        outcomes[key] = _sampling(rule, key, tests, base, served.get(key), records.get(key), looked)
    return [outcomes[key] for key in pairs]


def _greedy(rule: RuleSpec, rec: ExactnessRecord, base: dict[str, Any], scope: str) -> Outcome:
    # Served runs: a divergence no further below the local top than the fallback runner's own tokens ever were is
    # within the server's numerical noise (its kernels against the local computation), not a fault of speculation.
    if rec.numerical_tolerance is not None and rec.numerical_tolerance > rule.reference_tolerance:
        # A control is valid only when the fallback serves the declared target: beyond the bound it is another model
        return Outcome(
            **base,
            scope=scope,
            draft=rec.draft,
            law=rec.law,
            status=Status.ERROR,
            measured=None,
            samples=rec.compared,
            details=[asdict(d) for d in rec.divergences],
            message=f"exactness (greedy): the fallback runner does not serve the declared target: a token "
            f"it emitted lies {rec.numerical_tolerance:.3f} logits below the local target's top, beyond "
            f"the {rule.reference_tolerance:g}-logit reference tolerance (what the server's dtype and "
            "kernels may explain), so no verdict against the declared law can be given: serve the "
            "declared target (or declare the one served)",
        )
    tolerance = max(rule.tie_tolerance, rec.numerical_tolerance or 0.0)
    faults = [d for d in rec.divergences if d.gap_logits > tolerance]
    # served: the divergence is from the fallback runner's token, not from the target's argmax
    details = [
        _renamed(asdict(d), rec.numerical_tolerance is not None)
        | {
            "near_tie": d.gap_logits <= rule.tie_tolerance,
            "within_server_numerics": rule.tie_tolerance < d.gap_logits <= tolerance,
        }
        for d in rec.divergences
    ]
    if rec.compared == 0:
        why = f" ({rec.note})" if rec.note else ""
        return Outcome(
            **base,
            scope=scope,
            draft=rec.draft,
            law=rec.law,
            status=Status.ERROR,
            measured=None,
            samples=0,
            message=f"exactness (greedy): no speculative request could be compared with the fallback{why}",
            details=details,
        )
    status = Status.FAIL if faults else Status.PASS
    # within the control's noise but beyond the rule's tolerance: the server's kernels could explain them
    noise = [d for d in rec.divergences if rule.tie_tolerance < d.gap_logits <= tolerance]
    ties = [d for d in rec.divergences if d.gap_logits <= rule.tie_tolerance]
    if status == Status.PASS and noise:
        status = Status.INCONCLUSIVE
    if status == Status.FAIL and rule.level == "warn":
        status = Status.WARN
    text = f"exactness (greedy): {_greedy_text(rule, rec, faults, noise, ties)}"
    if rec.note:
        text += f"; {rec.note}"
    return Outcome(
        **base,
        scope=scope,
        draft=rec.draft,
        law=rec.law,
        status=status,
        measured=float(len({d.prompt_id for d in faults})) / rec.compared,
        samples=rec.compared,
        message=f"{text}: {status}",
        details=details,
    )


def _renamed(d: dict[str, Any], served: bool) -> dict[str, Any]:
    """A divergence's fields for the report's details: served, its target_token is the fallback
    runner's token there (fallback_token)."""
    if served:
        d["fallback_token"] = d.pop("target_token")
    return d


def _greedy_text(rule: RuleSpec, rec: ExactnessRecord, faults: list[Any], noise: list[Any], ties: list[Any]) -> str:
    """What a greedy verdict saw, in plain words: how many requests diverged, how far below
    the target's top logit their tokens lay, and what the rule's tie tolerance and (served)
    the fallback runner's own deviation from the local target explain."""
    served = rec.numerical_tolerance is not None
    control = rec.numerical_tolerance or 0.0
    other = "the fallback runner's" if served else "the target's argmax"

    def requests(
        ds: list[Any],
    ) -> int:  # in-process every diverging position is recorded, served the first of a request
        return len({(d.prompt_id, d.repetition, d.concurrency, d.request_rate) for d in ds})

    def span(ds: list[Any]) -> str:
        lo, hi = min(d.gap_logits for d in ds), max(d.gap_logits for d in ds)
        return f"{lo:.3g} logits" if lo == hi else f"{lo:.3g}-{hi:.3g} logits"

    def worst(ds: list[Any]) -> str:
        d = max(ds, key=lambda x: x.gap_logits)
        return (
            f"worst: {d.where}, token {d.draft_token} where {other} is {d.target_token}, "
            f"{d.gap_logits:.3g} logits below the target's top"
        )

    parts = []
    if faults:
        parts.append(
            f"{requests(faults)} of {rec.compared} requests committed tokens more than "
            f"{max(rule.tie_tolerance, control):.3g} logits below the target's top ({worst(faults)})"
        )
    elif not noise:
        against = "the fallback runner's output" if served else "the target's argmax"
        parts.append(
            f"every committed token of {rec.compared} requests matches {against}"
            + (f" or lies within the {rule.tie_tolerance:g}-logit tie tolerance of the target's top" if ties else "")
        )
    if noise and faults:
        parts.append(
            f"{requests(noise)} more diverged with tokens {span(noise)} below the top, within the {control:.3g} "
            "logits by which the fallback runner's own tokens stray from the local target (the server's "
            "numerics could explain those)"
        )
    elif noise:
        parts.append(
            f"{requests(noise)} of {rec.compared} requests diverged from the fallback runner with tokens "
            f"{span(noise)} below the local target's top ({worst(noise)}): beyond the rule's "
            f"{rule.tie_tolerance:g}-logit tie tolerance, but within the {control:.3g} logits by which the "
            "fallback runner's own tokens stray from the local target (the server's dtype and kernels), so the "
            f"server's numerics could explain them and this cannot be decided; a token more than {control:.3g} "
            "logits below the top would fail"
        )
    if ties:
        parts.append(f"{len(ties)} near-tie(s) within the {rule.tie_tolerance:g}-logit tie tolerance (not faults)")
    if served and not noise:
        parts.append(
            "the fallback runner's own tokens are the local target's argmax throughout"
            if control == 0
            else f"the fallback runner's own tokens stray at most {control:.3g} logits from the local target"
        )
    return "; ".join(parts)


def _sampling(
    rule: RuleSpec,
    key: tuple[str, str],
    tests: list[ExactnessTest],
    base: dict[str, Any],
    served: ServedReference | None = None,
    rec: ExactnessRecord | None = None,
    looked: str = "",
) -> Outcome:
    d, law = key
    scope = f"{d}/{law}"
    details = [asdict(t) for t in tests]
    if not tests:
        return Outcome(
            **base,
            scope=scope,
            draft=d,
            law=law,
            status=Status.ERROR,
            measured=None,
            samples=0,
            message="exactness (sampling): no sampled token to test",
            details=details,
        )
    verdict = overall(tests)
    status = verdict if verdict != Status.FAIL or rule.level == "error" else Status.WARN
    parts = []
    for t in tests:
        effect = "PIT CDF distance" if t.kind == "ks" else "TV"
        part = (
            f"{t.name} {t.verdict}: statistic {t.statistic:.4g}, p {t.pvalue:.3g} (Holm {t.adjusted_pvalue:.3g}) over "
            f"{t.n} samples, {'detects' if t.role == CLAIM else 'evidence only, would detect'} {effect} >= "
            f"{t.detectable:.3f} at power {t.power:g}"
        )
        if t.note:
            part += f" ({t.note})"
        parts.append(part)
    if not any(t.role == CLAIM for t in tests) and verdict != Status.FAIL:
        parts.append(_no_claim(rule, tests, served is not None))
    if served is not None and rec is not None:
        parts.append(served.text)
        parts.append(
            f"cost: {rec.sample_requests} sample requests of this runner, {rec.sample_tokens} output tokens, "
            f"{rec.sample_wall_s:.1f} s"
        )
    worst = min(t.adjusted_pvalue for t in tests if t.adjusted_pvalue is not None)
    return Outcome(
        **base,
        scope=scope,
        draft=d,
        law=law,
        status=status,
        measured=worst,
        samples=sum(t.n for t in tests),
        message=f"exactness (sampling, required TV {rule.detect_tv:g}, {looked}significance {rule.significance:.3g}): "
        + "; ".join(parts)
        + f": {status}",
        details=details,
    )


def _no_claim(rule: RuleSpec, tests: list[ExactnessTest], served: bool = False) -> str:
    """Why a sampling verdict without a first-position next-token test cannot pass."""
    m = len(tests) + 1
    needed = gtest_samples_needed(rule.detect_tv, 20, rule.significance / m, rule.power)
    if served:
        return (
            f"no output prefix was shared by enough samples for a next-token test at a speculative position (a "
            f"served engine's first token is the prefill's): a pass needs about {needed} samples after one "
            f"prefix, more sample requests per prompt than that (next_token_samples; about 20 degrees of freedom "
            "assumed)"
        )
    return (
        f"no prompt was sampled often enough for a next-token test, and no other test bounds the TV of the law "
        f"at any context (the PIT over all tokens pools prompts and positions): a pass needs a prompt sampled "
        f"about {needed} times (next_token_samples: {needed} in gate check; {needed} samples of one prompt in "
        f"gate exactness; about 20 degrees of freedom assumed)"
    )


def _kind(m: Measurements, draft: str) -> str | None:
    """The measured draft's kind (None when the measurements do not describe it)."""
    info = m.drafts.get(draft)
    return info.kind if info is not None else None
