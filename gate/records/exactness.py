"""The raw material of the exactness tests: greedy divergences, next-token counts, served samples."""

from __future__ import annotations

from dataclasses import dataclass, field

from gate.records.run import at_load_point


@dataclass
class Divergence:
    """A position where a greedy speculative output is not the target's argmax.

    Teacher-forced on the output's own prefix; gap_logits = the target's top logit minus
    the logit of the token the speculative run committed (the top-1 minus top-2 gap when
    that token is the runner-up). A gap within the rule's tie tolerance is a numerical
    near-tie (e.g. bfloat16 or batch-shape rounding), not a fault."""

    prompt_id: str
    position: int  # output position
    target_token: int  # the target's argmax there
    draft_token: int  # the token the speculative run committed
    gap_logits: float
    repetition: int | None = None  # the request's repetition (None: recorded samples)
    concurrency: int | None = None  # served: the closed-loop load point it ran at
    request_rate: float | None = None  # served: the open-loop load point it ran at

    @property
    def where(self) -> str:
        """'mt_bench-137 repetition 1 at concurrency 2, output position 27'."""
        rep = f" repetition {self.repetition}" if self.repetition is not None else ""
        point = at_load_point(self.concurrency, self.request_rate)
        return f"{self.prompt_id}{rep}{point}, output position {self.position}"


@dataclass
class NextTokenCounts:
    """Next tokens sampled many times at one context, and the target's law there.

    The context is a prompt plus `prefix`, output tokens shared by every counted sample
    (empty: the first output position). The law is stored sparsely: `support_ids`/
    `support_probs` hold the most likely tokens covering all but `rest_prob` of the mass;
    `counts` counts samples per support id and `rest_count` the samples outside it (tokens
    with probability 0 count in `zero_count`)."""

    prompt_id: str
    support_ids: list[int]
    support_probs: list[float]
    rest_prob: float
    counts: list[int]
    rest_count: int
    zero_count: int
    prefix: list[int] = field(default_factory=list)


@dataclass
class TwoSampleCounts:
    """Next-token counts of a draft runner and of the fallback runner (the reference) at one
    context: the same prompt and output prefix, under one law. `token_ids` are the tokens
    either runner drew there; `counts[i]` and `reference_counts[i]` how often each drew
    token_ids[i]."""

    prompt_id: str
    prefix: list[int]
    token_ids: list[int]
    counts: list[int]
    reference_counts: list[int]


@dataclass
class SampleRecord:
    """One short request of the served exactness plan (gate.exactness.sampled.plan_samples):
    runner `runner` under law `law` on prompt `prompt_id` with its own `seed` (distinct per
    sample, so a verdict can be replayed), at load point (`concurrency`, `request_rate`);
    `output_ids` the token ids it returned, in order."""

    runner: str
    law: str
    prompt_id: str
    seed: int
    output_ids: list[int]
    concurrency: int | None = None
    request_rate: float | None = None


@dataclass
class ExactnessRecord:
    """Raw material of the exactness tests for one draft under one law.

    Greedy laws: `compared` speculative requests, every token checked against the target's
    argmax on the output's own prefix, and their `divergences`. Sampling laws: `pit` values of every generated token
    (None for a token the law gives probability 0) and optional next-token counts."""

    draft: str
    law: str
    greedy: bool
    compared: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    pit: list[float | None] = field(default_factory=list)
    next_token: list[NextTokenCounts] = field(default_factory=list)
    # Served greedy runs: the fallback runner as the control for the server's numerics: the largest gap (logits)
    # below the local target's top logit of any token the fallback runner emitted (None: not measured, in-process)
    numerical_tolerance: float | None = None
    note: str | None = None  # why fewer requests were compared than ran (e.g. no token ids came back)
    # Output positions before this one come from the target's prefill, not from speculation (served engines: 1),
    # so a next-token test there tests the server's law, not the speculative sampler's
    speculative_from: int = 0
    # Served sampling laws: the draft runner's next-token counts against the fallback runner's (two-sample)
    two_sample: list[TwoSampleCounts] = field(default_factory=list)
    # Served sampling laws: the cost of this runner's samples (SampleRecord): requests, output tokens, wall seconds
    sample_requests: int = 0
    sample_tokens: int = 0
    sample_wall_s: float = 0.0
