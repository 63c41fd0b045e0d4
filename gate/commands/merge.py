"""gate merge: the shard reports of one run joined into one verdict with one set of reports.

A long matrix can be split across CI jobs: `gate check POLICY --shard I/N` measures the I-th
of N shards, a shard being a set of (law, load point) cells, dealt to the shards in turn in
plan order (gate.loop.run.Loop.mine): every runner of a cell (the fallback and every draft, all
repetitions) runs in the same shard, so paired comparisons never pair requests measured on two
machines. Each shard checks its own requests' outputs (greedy equality with the target or the
fallback, PIT values; joined per draft and law by combined_exactness) and computes the overlap
of the laws whose first cell it measures; what is not split (speculative first steps, the bill,
the target identity check, served exactness samples) runs in shard 1, and a law's envelope search in the shard of
its first load point; measurement.extra_repetitions are not run in a shard. `gate merge POLICY
SHARD.json...` checks that the reports are the N shards of one run of POLICY (each once, the
same policy and gate version), joins their raw measurements and decides every rule once, on
all of them, as `gate check` would on one run of the same requests.
"""

from __future__ import annotations

import copy
from dataclasses import fields
from pathlib import Path

from gate.commands.check import CheckResult, Options, finish
from gate.core.errors import InputError, Problem
from gate.policy.baseline import load_baseline
from gate.policy.reader import load_policy
from gate.policy.saved import read_report
from gate.records import PEAK, ExactnessRecord, Measurements

# Fields every shard records alike (the session's): shard 1's stand. Peaks (gate.records.PEAK): the highest.
FIRST = ("environment", "laws", "tokenizers", "workload", "target_identity")


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' as (i, n) with 1 <= i <= n. Raises ValueError saying what is wrong."""
    head, sep, tail = text.partition("/")
    if not sep or not head.strip().isdigit() or not tail.strip().isdigit():
        raise ValueError(f"expected I/N, e.g. 1/4, got {text!r}")
    i, n = int(head), int(tail)
    if n < 1:
        raise ValueError(f"shard {i}/{n}: N, the number of shards, must be at least 1")
    if not 1 <= i <= n:
        raise ValueError(f"shard {i}/{n}: I must be between 1 and N")
    return i, n


def join(parts: list[Measurements]) -> Measurements:
    """The measurements of the shards as one run's: lists (requests, windows, failures, ...)
    concatenated in shard order (the notes without repeats), dicts merged, peaks the highest, the session's fields
    (environment, laws, tokenizers, workload, target identity) shard 1's."""
    out = copy.deepcopy(parts[0])
    for other in parts[1:]:
        for f in fields(Measurements):
            if f.name in FIRST:
                if getattr(out, f.name) is None:
                    setattr(out, f.name, copy.deepcopy(getattr(other, f.name)))
                continue
            mine, theirs = getattr(out, f.name), getattr(other, f.name)
            if f.metadata == PEAK:
                setattr(out, f.name, max((v for v in (mine, theirs) if v is not None), default=None))
            elif isinstance(mine, list):
                mine.extend(copy.deepcopy(theirs))
            elif isinstance(mine, dict):
                setattr(out, f.name, {**theirs, **mine})
            elif mine is None:
                setattr(out, f.name, copy.deepcopy(theirs))
    out.exactness = combined_exactness(out.exactness)
    out.notes = list(dict.fromkeys(out.notes))  # a note every shard made (how a shard measures) once
    return out


def combined_exactness(records: list[ExactnessRecord]) -> list[ExactnessRecord]:
    """One ExactnessRecord per (draft, law) from the shards' (each checks its own requests'
    outputs): compared summed; divergences, PIT values, next-token and two-sample counts
    joined in shard order; sample costs summed; the fallback's numerical tolerance the
    largest; notes joined. In the order each pair first appears."""
    out: dict[tuple[str, str], ExactnessRecord] = {}
    for r in records:
        key = (r.draft, r.law)
        if key not in out:
            out[key] = copy.deepcopy(r)
            continue
        into = out[key]
        into.compared += r.compared
        into.divergences += copy.deepcopy(r.divergences)
        into.pit += list(r.pit)
        into.next_token += copy.deepcopy(r.next_token)
        into.two_sample += copy.deepcopy(r.two_sample)
        into.sample_requests += r.sample_requests
        into.sample_tokens += r.sample_tokens
        into.sample_wall_s += r.sample_wall_s
        tolerances = [t for t in (into.numerical_tolerance, r.numerical_tolerance) if t is not None]
        into.numerical_tolerance = max(tolerances) if tolerances else None
        into.note = "; ".join(dict.fromkeys(n for n in (into.note, r.note) if n)) or None
        into.speculative_from = max(into.speculative_from, r.speculative_from)
    return list(out.values())


def merge(policy_path: str | Path, shard_paths: list[Path], options: Options | None = None) -> CheckResult:
    """Decide POLICY's rules on the joined measurements of its shard reports (module
    docstring) under `options` (default: Options()). Raises InputError (exit code 2) naming
    the file when the policy is invalid, a report cannot be read or is not a shard of this
    run, a shard is given twice or missing."""
    options = options or Options()
    loaded = load_policy(policy_path)
    baseline = load_baseline(loaded)
    expected = loaded.policy.model_dump(mode="json")
    reports = [(Path(p), read_report(Path(p))) for p in shard_paths]
    problems: list[Problem] = []
    seen: dict[int, Path] = {}
    total: int | None = None
    for path, r in reports:
        if r.shard is None:
            problems.append(
                Problem(str(path), "shard", None, "not a shard report (gate check POLICY --shard I/N writes one)")
            )
            continue
        try:
            i, n = parse_shard(r.shard)
        except ValueError as e:
            problems.append(Problem(str(path), "shard", None, str(e)))
            continue
        if total is None:
            total = n
        elif n != total:
            problems.append(
                Problem(str(path), "shard", None, f"shard {i}/{n}, but the other reports are shards of {total}")
            )
        if i in seen:
            problems.append(Problem(str(path), "shard", None, f"shard {i}/{n} is given twice (also {seen[i]})"))
        seen.setdefault(i, path)
        if r.policy != expected:
            keys = sorted(k for k in set(r.policy) | set(expected) if r.policy.get(k) != expected.get(k))
            problems.append(
                Problem(
                    str(path),
                    "policy",
                    None,
                    f"measured under another policy than {policy_path} (differs in: {', '.join(keys)})",
                )
            )
        if r.gate_version != reports[0][1].gate_version:
            problems.append(
                Problem(
                    str(path),
                    "gate_version",
                    None,
                    f"written by gate {r.gate_version}, the first report by gate {reports[0][1].gate_version}",
                )
            )
    if total is not None:
        missing = [f"{i}/{total}" for i in range(1, total + 1) if i not in seen]
        if missing:
            problems.append(
                Problem(
                    str(policy_path),
                    "",
                    None,
                    f"shard reports missing: {', '.join(missing)} (given: {', '.join(str(p) for p, _ in reports)})",
                )
            )
    if problems:
        raise InputError(problems)
    ordered = sorted((r for _, r in reports if r.shard is not None), key=lambda r: parse_shard(r.shard or "")[0])
    m = join([r.measurements for r in ordered])
    notes = [
        f"merged from {total} shards: "
        + ", ".join(
            f"{r.shard} ({path})" for path, r in sorted(reports, key=lambda x: parse_shard(x[1].shard or "")[0])
        )
    ]
    notes += [
        f"shard {r.shard} ({path}) was interrupted (its exit code {r.exit_code}): what it did not measure is a "
        "failure of the merged run"
        for path, r in reports
        if r.exit_code >= 128
    ]
    result = finish(loaded, m, options, notes, baseline=baseline)
    result.report.merged_from = [str(p) for p, _ in reports]
    return result
