"""Did a draft runner speculate? One check per draft runner, law and load point.

A draft endpoint that serves without speculation (a plain server behind the draft's URL, an
EAGLE-3 checkpoint loaded under the wrong method, an engine that turns speculation off for
some requests) produces tokens at the fallback's speed, so a speedup floor below 1.0x and a
greedy exactness rule pass on it. Its verdicts say nothing about the draft. The check below
tells that apart from a draft that truly had nothing to propose (prompt lookup on outputs
with no repeated n-gram), from the tokens the runner returned and the proposals it counted.

The rule (each draft kind states its floor, gate.drafts.interface.DraftKind.proposal_floor):
a request whose output has N tokens needs at least `floor(output)` verification steps that
carried a proposal, whatever the engine:

- a draft with a model of its own proposes at every step after the prefill, and a step
  commits at most num_draft_tokens + 1 tokens: at least (N - 1) // (K + 1) - 1 proposing
  steps (one step spared for the end, where proposals are capped by max_new_tokens);
- prompt lookup proposes where the last max_ngram_size tokens occurred earlier with enough
  tokens after that occurrence to copy. Engines differ in which occurrence they copy from:
  gate's and transformers' the earliest, llama.cpp's ngram-simple the nearest, and it
  proposes nothing when fewer than max_ngram_size tokens follow that one (a loop with a
  period of n tokens or less never gets a draft). So a position counts only when the
  *nearest* earlier occurrence has max(num_draft_tokens, max_ngram_size) tokens after it:
  every engine proposes there. Counted on the output alone (the prompt can only add
  matches), every such position either starts a step, which then proposes, or lies inside a
  step that committed more than one token, which had a proposal; a step covers at most K + 1
  positions: at least ceil(positions / (K + 1)) proposing steps. Without the output's token
  ids (an API that returns counts only) nothing can be counted: the floor is unknown.

A proposing step proposes at least one token, so over a cell:
- no draft token at all where the floor is at least MIN_FLOOR steps: speculation was off;
- fewer draft tokens than FEW_SHARE of the floor: speculation barely ran;
- with per-request counts, at least MIN_FLOOR requests each with a floor of MIN_FLOOR steps
  or more made none, and they are at least SOME_SHARE of such requests: speculation was off
  for some requests (an engine that turns it off for structured output, penalties, ...);
- no draft token where the floor is below MIN_FLOOR: nothing to propose (verdicts stand:
  the draft ran as it would in production on these prompts).

Pure: records in, records out; no model, no rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gate.records import FALLBACK, UNKNOWN_ID, Measurements, RequestRecord, SpeculationRecord, SpeculationStatus

MIN_FLOOR = 2  # proposing steps the outputs must imply before zero proposals is called speculation off
FEW_SHARE = 0.1  # draft tokens below this share of the floor: speculation barely ran
SOME_SHARE = 0.25  # share of eligible requests that made no proposal: speculation was off for some requests


@dataclass(frozen=True)
class ProposalFloor:
    """The fewest verification steps with a proposal that a draft must have made for a
    request whose output ids are given, if speculation ran (`steps(output_ids) -> int`, None
    where the ids cannot tell), and the rule in words for messages (`rule`)."""

    rule: str
    steps: Callable[[Sequence[int]], int | None]


def every_step(num_draft_tokens: int) -> ProposalFloor:
    """The floor of a draft that proposes at every step (a model of its own): N output
    tokens need (N - 1) // (K + 1) - 1 proposing steps at least (the first token is the
    prefill's; one step spared for the capped end). Only the length counts."""
    k = num_draft_tokens

    def steps(output_ids: Sequence[int]) -> int:
        return max(0, (len(output_ids) - 1) // (k + 1) - 1)

    return ProposalFloor(
        f"a draft with a model proposes at every verification step, and a step commits at most "
        f"num_draft_tokens + 1 = {k + 1} tokens",
        steps,
    )


def copyable_positions(output_ids: Sequence[int], ngram: int, follow: int) -> int:
    """Output positions i at which the last `ngram` tokens of output_ids[:i] occurred
    earlier in output_ids[:i] and the nearest such occurrence has at least `follow` tokens
    after it, still inside output_ids[:i]: where a prompt-lookup engine of that n-gram size
    finds a match to copy whichever occurrence it takes (the earliest has at least as many
    tokens after it as the nearest), whatever the prompt adds. O(len(output_ids))."""
    last: dict[tuple[int, ...], int] = {}  # n-gram -> where it last started
    count = 0
    for i in range(ngram, len(output_ids)):
        gram = tuple(output_ids[i - ngram : i])
        start = last.get(gram)
        if start is not None and start + ngram + follow <= i:
            count += 1
        last[gram] = i - ngram
    return count


def lookup_floor(max_ngram_size: int, num_draft_tokens: int) -> ProposalFloor:
    """The floor of prompt lookup: ceil(copyable positions / (K + 1)) proposing steps, the
    positions counted on the output alone with max(K, max_ngram_size) tokens to copy after
    the nearest match (copyable_positions); None when the output's ids did not come back."""
    k = num_draft_tokens
    follow = max(k, max_ngram_size)

    def steps(output_ids: Sequence[int]) -> int | None:
        if UNKNOWN_ID in output_ids:
            return None
        return math.ceil(copyable_positions(output_ids, max_ngram_size, follow) / (k + 1))

    return ProposalFloor(
        f"prompt lookup proposes where the output's last {max_ngram_size} tokens occurred earlier in "
        f"it and the nearest such occurrence has {follow} tokens after it, and a step covers at most "
        f"{k + 1} such positions",
        steps,
    )


def proposals(r: RequestRecord) -> int | None:
    """Draft tokens a request's runner proposed: gate's own step counts, else the server's
    per-response count (llama.cpp's draft_n); None where neither was recorded."""
    if r.step_proposed:
        return int(sum(r.step_proposed))
    return r.server_draft_tokens


def check(m: Measurements, floors: Mapping[str, ProposalFloor]) -> list[SpeculationRecord]:
    """One SpeculationRecord per draft runner in `floors` (runner name -> its floor; runners
    that declare no speculation are left out by the caller), law and load point of the timed
    requests in `m` (m.requests; failed requests are not there). Draft tokens are summed
    from per-request counts when every request has one, else from the windows' counter
    deltas (m.runs; an engine that counts only steps, SGLang, moves num_drafts), else not
    counted."""
    cells: dict[tuple[str, str, int | None, float | None], list[RequestRecord]] = {}
    for r in m.requests:
        if r.draft != FALLBACK and r.draft in floors:
            cells.setdefault((r.draft, r.law, r.concurrency, r.request_rate), []).append(r)
    out = []
    for (runner, law, concurrency, rate), reqs in cells.items():
        floor = floors[runner]
        per_request = [floor.steps(r.output_ids) for r in reqs]
        known = None if any(f is None for f in per_request) else [f for f in per_request if f is not None]
        counts = [proposals(r) for r in reqs]
        silent: int | None = None
        eligible: int | None = None
        if all(c is not None for c in counts):
            made: int | None = sum(c for c in counts if c is not None)
            source = "per-request counts"
            if known is not None:
                eligible = sum(1 for f in known if f >= MIN_FLOOR)
                silent = sum(1 for f, c in zip(known, counts, strict=False) if f >= MIN_FLOOR and c == 0)
        else:
            windows = [
                w
                for w in m.runs
                if w.runner == runner
                and w.law == law
                and w.counters is not None
                and w.load.concurrency == concurrency
                and w.load.request_rate == rate
            ]
            made = (
                sum(max(c.num_draft_tokens, c.num_drafts) for c in (w.counters for w in windows) if c is not None)
                if windows
                else None
            )
            source = "server counters"
        rec = SpeculationRecord(
            runner,
            law,
            SpeculationStatus.SPECULATED,
            len(reqs),
            sum(r.output_tokens for r in reqs),
            made,
            None if known is None else sum(known),
            floor.rule,
            source,
            silent,
            eligible,
            concurrency,
            rate,
        )
        rec.status = _status(rec)
        out.append(rec)
    return out


def _status(rec: SpeculationRecord) -> SpeculationStatus:
    if rec.draft_tokens is None or rec.floor_steps is None:
        return SpeculationStatus.NOT_COUNTED
    if rec.draft_tokens == 0:
        return SpeculationStatus.OFF if rec.floor_steps >= MIN_FLOOR else SpeculationStatus.NOTHING_TO_PROPOSE
    if rec.floor_steps >= MIN_FLOOR and rec.draft_tokens < FEW_SHARE * rec.floor_steps:
        return SpeculationStatus.FEW
    if (
        rec.silent_requests is not None
        and rec.eligible_requests
        and rec.silent_requests >= MIN_FLOOR
        and rec.silent_requests >= SOME_SHARE * rec.eligible_requests
    ):
        return SpeculationStatus.SOME_OFF
    return SpeculationStatus.SPECULATED
