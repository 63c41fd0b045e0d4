"""Sampled-law exactness of served engines (gate.exactness.sampled, gate.exactness.verdict):
mutation tests against a speculative-sampling server with injectable sampler faults
(tests/sampler_server.py, first token from the prefill as real engines do), one `gate check`
for the whole module, and the reference logic on hand-made records."""

from __future__ import annotations


import torch

from gate.records import DraftInfo, ExactnessRecord, Measurements, NextTokenCounts, TwoSampleCounts

FAULTS = ("none", "no_temperature", "no_top_k", "residual_p", "accept_all")
DETECT_TV = 0.1
PROMPT = "w1 w2 w3 w4 w1 w2"


def counts(pid: str, prefix: list[int], n: list[int], p: list[float]) -> NextTokenCounts:
    return NextTokenCounts(pid, list(range(len(p))), p, 0.0, n, 0, 0, prefix)


def served_records(fallback_counts: list[int]) -> Measurements:
    """A fallback runner with `fallback_counts` at the prefill position and a draft whose
    one-sample counts fit the law; their two-sample counts agree."""
    from gate.measure.environment import environment

    p = [0.4, 0.3, 0.2, 0.1]
    fb = ExactnessRecord("fallback", "t", False, speculative_from=1,
                         next_token=[counts("a", [], fallback_counts, p)])
    d = ExactnessRecord("d", "t", False, speculative_from=1, next_token=[
        counts("a", [], [800, 600, 400, 200], p), counts("a", [7], [800, 600, 400, 200], p)])
    d.two_sample = [TwoSampleCounts("a", [7], [0, 1, 2, 3], [800, 600, 400, 200], [800, 600, 400, 200])]
    m = Measurements(environment=environment(torch.device("cpu"), 0), laws=["t"],
                     drafts={"d": DraftInfo("model", 3, "distribution")})
    m.exactness = [fb, d]
    return m


