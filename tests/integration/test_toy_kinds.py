"""Every axis of variation takes a new kind from one class (or object) plus one registration
line, with nothing changed in gate/: this file declares a toy runner kind, engine, draft
kind, workload source, report format, metric and rule kind, and a fresh interpreter
registers them (register_toys, before gate.policy is imported: the policy's unions and
Literals are built then) and runs `gate check` on a policy that uses all of them.

The toy runner is not in-process (Capabilities.in_process False), so gate loads no weights
for it and it takes gate.loop.run's one loop the way a served engine does: a window per load point
and repetition, a counter scrape before and after each (read with its engine's counter
names), the law's wire fields and refusals from its engine. The tiny model of
tests/conftest.py is the target only for its tokenizer and config (validation, the bill).
The toy engine also serves the real openai runner: an endpoint of `engine: toy` is refused
a law the engine cannot apply, at validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar, Literal, Sequence

import pytest

from gate.drafts import registry as drafts
from gate.drafts.interface import BuiltDraft, DraftKind, DraftSpecBase
from gate.metrics.catalogue import SAMPLE_AGGREGATIONS, Metric
from gate.records import FALLBACK, Measurements, SpecDecodeCounters
from gate.report import registry as reports
from gate.report.interface import ReportFormat
from gate.rules.kinds import registry as rule_kinds
from gate.rules.kinds.interface import RuleKind, Settings
from gate.rules.outcome import Outcome
from gate.rules.samples import register_metric
from gate.rules.status import Status
from gate.runners import registry as runners
from gate.runners.engines import registry as engines
from gate.runners.engines.interface import Engine, ServerSnapshot
from gate.runners.interface import Capabilities, Done, Ended, RequestResult, Runner, RunnerSpecBase, StreamResult
from gate.core.units import Dimension
from gate.workloads import registry as workloads
from gate.workloads.interface import Prompt, WorkloadSource

OUTPUT_IDS = [10, 11, 12, 13, 14, 15]  # what the toy runner streams for every request (cut at max_new_tokens)


class ToyEngine(Engine):
    """An engine whose server counts proposals as toy:draft_tokens_total and toy:accepted_tokens_total,
    takes the temperature as `toy_temperature` and cannot apply top-k."""

    name = "toy"

    def spec_counters(self, before: ServerSnapshot, after: ServerSnapshot) -> SpecDecodeCounters | None:
        drafted, accepted = (after.increase(before, f"toy:{n}_tokens_total") for n in ("draft", "accepted"))
        return SpecDecodeCounters(num_drafts=drafted or 0, num_draft_tokens=drafted or 0, num_accepted_tokens=accepted or 0)

    def sampling_fields(self, law: Any, penalty_window: int | None = None) -> dict[str, Any]:
        return {"toy_temperature": law.temperature}

    def law_refusals(self, law: Any, fmt: Any = None) -> list[tuple[str, str]]:
        return [("top_k", "the toy engine has no top-k")] if law.top_k else []


class ToyRunnerSpec(RunnerSpecBase):
    """runner.kind toy: streams `output_ids` for every request, speaking `engine`'s dialect."""

    kind: Literal["toy"]
    engine: str = "toy"
    output_ids: list[int] = OUTPUT_IDS


class ToyRunner(Runner):
    """Serves the fallback and every draft at the policy's load points (concurrency 1: one
    request at a time) by streaming fixed ids, 1 ms apart; a draft proposes one token per
    output token and half of them are accepted (its engine's counters). `sent` keeps the
    wire fields of every request (the test reads them)."""

    capabilities = Capabilities(token_ids=True, server_counters=True, max_concurrency=1, load_points=True)
    spec: ClassVar[type[RunnerSpecBase]] = ToyRunnerSpec
    sent: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, engine_name: str, output_ids: list[int]):
        self.engine = engines.engine(engine_name)
        self.output_ids = list(output_ids)
        self.proposed: Counter = Counter()

    @classmethod
    def from_plan(cls, plan: Any, local: Any = None) -> "ToyRunner":
        return cls(plan.policy.runner.engine, plan.policy.runner.output_ids)

    @classmethod
    def check_plan(cls, plan: Any) -> None:
        from gate.runners.refusals import check_law_refusals

        check_law_refusals(plan, cls.from_plan(plan))

    def run(self, requests: Sequence[Any], load: Any, done: Done | None = None, ended: Ended | None = None) -> list[RequestResult]:
        self.check_load(load)
        out: list[RequestResult] = []
        for i, req in enumerate(requests):
            ToyRunner.sent.append({"runner": req.draft, "prompt": req.prompt.id, **self.engine.sampling_fields(req.law)})
            ids = self.output_ids[:req.max_new_tokens]
            if req.draft != FALLBACK:
                self.proposed[req.draft] += len(ids)
            result = StreamResult(ids, [float(k + 1) for k in range(len(ids))], "length", float(len(ids)), time.time())
            out.append(result)
            if done is not None:
                done(i, result)
            if ended is not None:
                ended(i)
        return out

    def counters(self, runner: str) -> ServerSnapshot:
        n = self.proposed[runner]
        return ServerSnapshot(self.engine.name, {"toy:draft_tokens_total": n, "toy:accepted_tokens_total": n // 2})

    def law_refusals(self, runner: str, law: Any, fmt: Any = None) -> list[tuple[str, str]]:
        return self.engine.law_refusals(law, fmt)


class ToyDraftSpec(DraftSpecBase):
    """drafts.<name>.kind toy: a draft only a served runner runs (gate builds nothing for it)."""

    kind: Literal["toy"]


TOY_DRAFT = DraftKind("toy", ToyDraftSpec, "point_mass", build=lambda name, spec, ctx: BuiltDraft(None))  # type: ignore[arg-type]


class ToyWords(WorkloadSource):
    """Five one-turn prompts over the tiny tokenizer's words, category "toy"."""

    def load(self) -> list[Prompt]:
        return [Prompt(f"toy{i}", "toy", [{"role": "user", "content": f"w{i} w{i + 1} w{i + 2}"}]) for i in range(5)]


TOY_WORDS = workloads.SourceKind("toy_words", ToyWords, "this test: five fixed prompts")


class ToyReport(ReportFormat):
    """One line per outcome: rule id, scope, status, measured value."""

    name = "toy"

    def render(self, report: Any) -> str:
        return "".join(f"{o.rule_id} {o.scope} {o.status} {o.measured}\n" for o in report.outcomes)


TOY_METRIC = Metric("output_length", Dimension.TOKENS, SAMPLE_AGGREGATIONS, "one request", True,
                    "tokens in a request's output", sampling="request", timed=False, repeatable=True, better="higher")


class ToyWindows(RuleKind):
    """rules[].kind windows: every draft and law in scope has at least `threshold` measured windows."""

    name = "windows"
    keys = ("kind", "threshold", "scope", "level")

    def spec_problem(self, rule: Any) -> tuple[str, str] | None:
        return ("threshold", "a windows rule needs a threshold (the fewest windows)") if rule.threshold is None else None

    def evaluate(self, rule: Any, m: Measurements, drafts: list[str], laws: list[str], settings: Settings) -> list[Outcome]:
        out = []
        for draft in drafts:
            for law in laws:
                n = sum(1 for w in m.runs if (w.runner, w.law) == (draft, law))
                status = Status.PASS if n >= rule.threshold_value else Status.FAIL
                out.append(Outcome(rule.id, f"{draft}/{law}", draft, law, "windows", "count", ">=", rule.threshold_value,
                                   None, rule.level, status, float(n), n, None, f"{n} measured windows"))
        return out


def register_toys() -> None:
    """The seven registration lines, one per axis (a fresh interpreter runs them before
    gate.policy is imported)."""
    engines.register(ToyEngine)
    runners.register("toy")(ToyRunner)
    drafts.register(TOY_DRAFT)
    workloads.register(TOY_WORDS)
    reports.register(ToyReport, "this test: one line per outcome")
    register_metric(TOY_METRIC, lambda r: [float(len(r.output_ids))])
    rule_kinds.register(ToyWindows())


def policy(model_dir: Path, law: str = "{temperature: 0}", runner: str = "{kind: toy}") -> str:
    """A policy on the tiny target using every toy: runner, draft, workload, a rule on the toy
    metric, one on acceptance (the toy engine's counters) and one of the toy rule kind."""
    return textwrap.dedent(f"""\
        version: 1
        target: {{model: {model_dir}, device: cpu}}
        drafts:
          t: {{kind: toy, num_draft_tokens: 2}}
        law: {law}
        runner: {runner}
        workload: {{source: toy_words, max_new_tokens: 4, seed: 0}}
        measurement: {{repetitions: 5, warmup_requests: 1, max_cpu_stall: null}}
        rules:
          - {{id: length, metric: output_length, aggregation: mean, comparison: '>=', threshold: 3 tokens}}
          - {{id: accepted, metric: acceptance_rate, aggregation: pooled, comparison: '>=', threshold: 0.5}}
          - {{id: windowed, kind: windows, threshold: 5}}
        """)


SCRIPT = """\
import json, os, sys
sys.path.insert(0, {tests!r})
import test_toy_kinds as toys
toys.register_toys()
from click.testing import CliRunner
from gate.cli import cli
out = {{}}
r = CliRunner().invoke(cli, ["check", {policy!r}, "--json", {report!r}, "--junit", {junit!r}, "--report", "toy=" + {toy!r},
                             "--no-progress"])
out["check"] = [r.exit_code, r.output]
out["sent"] = toys.ToyRunner.sent
for name, path in (("top_k", {top_k!r}), ("openai_top_k", {openai_top_k!r})):
    r = CliRunner().invoke(cli, ["validate", path])
    out[name] = [r.exit_code, r.output]
print(json.dumps(out))
"""


def test_a_toy_of_every_axis_runs_through_gate_check(tmp_path: Path, tiny_model_dir: Path) -> None:
    main, top_k, openai_top_k = tmp_path / "policy.yaml", tmp_path / "top_k.yaml", tmp_path / "openai_top_k.yaml"
    main.write_text(policy(tiny_model_dir))
    top_k.write_text(policy(tiny_model_dir, "{temperature: 0.7, top_k: 5}"))
    endpoint = "{base_url: 'http://127.0.0.1:9', engine: toy}"
    served = f"{{kind: openai, endpoints: {{fallback: {endpoint}, t: {endpoint}}}}}"
    openai_top_k.write_text(policy(tiny_model_dir, "{temperature: 0.7, top_k: 5}", served))
    report, toy = tmp_path / "report.json", tmp_path / "report.toy"
    script = SCRIPT.format(tests=str(Path(__file__).parent), policy=str(main), report=str(report), junit=str(tmp_path / "j.xml"),
                           toy=str(toy), top_k=str(top_k), openai_top_k=str(openai_top_k))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    code, shown = out["check"]
    assert code == 0, shown
    m = json.loads(report.read_text())["measurements"]
    # The toy runner's requests went through the loop: one record per runner, prompt (the toy workload's ids) and
    # repetition, its fixed ids cut at max_new_tokens, a measured window per runner and repetition, each draft window
    # with the toy engine's counters over its 5 requests (4 proposals each, half accepted).
    assert sorted((r["draft"], r["prompt_id"], r["repetition"]) for r in m["requests"]) == sorted(
        (name, f"toy{i}", rep) for name in ("fallback", "t") for i in range(5) for rep in range(5))
    assert all(r["output_ids"] == OUTPUT_IDS[:4] and r["concurrency"] == 1 for r in m["requests"])
    assert sorted((w["runner"], w["repetition"], w["requests"]) for w in m["runs"]) == sorted(
        (name, rep, 5) for name in ("fallback", "t") for rep in range(5))
    assert all(w["counters"]["num_draft_tokens"] == 20 and w["counters"]["num_accepted_tokens"] == 10
               for w in m["runs"] if w["runner"] == "t")
    assert m["drafts"]["t"]["kind"] == "toy"
    # The toy engine's wire fields were asked for every request (warm-up included), and its refusal stops validation.
    assert {s["runner"] for s in out["sent"]} == {"fallback", "t"} and all(s["toy_temperature"] == 0 for s in out["sent"])
    assert len(out["sent"]) == 2 * 5 * (5 + 1)  # 2 runners x 5 repetitions x (5 prompts + 1 warm-up request)
    # The same refusal through the real served runner: an openai endpoint of `engine: toy` (the policy's engine
    # Literal is built from the engine registry) is refused the law at validation, before anything is sent.
    for name in ("top_k", "openai_top_k"):
        code, shown = out[name]
        assert code == 2 and "law.top_k" in shown and "the toy engine has no top-k" in shown, shown
    # The toy metric's rule, the acceptance rule on the toy engine's counters and the toy rule kind's outcome.
    outcomes = {o["rule_id"]: o for o in json.loads(report.read_text())["outcomes"]}
    assert outcomes["length"]["status"] == "pass" and outcomes["length"]["measured"] == 4.0
    # resampled by request, like the built-in request metrics (gate.metrics.catalogue.RESAMPLED includes it): an interval
    assert outcomes["length"]["samples"] == 25 and outcomes["length"]["interval"]["units"] == 25
    assert outcomes["accepted"]["status"] == "pass" and outcomes["accepted"]["measured"] == 0.5
    assert outcomes["windowed"]["status"] == "pass" and outcomes["windowed"]["measured"] == 5.0
    # The toy report format's file, written by --report toy=PATH.
    assert toy.read_text().splitlines() == [f"{o['rule_id']} {o['scope']} {o['status']} {o['measured']}"
                                            for o in outcomes.values()]


def test_a_metric_name_is_registered_once_and_a_pooled_metric_needs_its_case() -> None:
    from gate.metrics.catalogue import METRICS

    before = dict(METRICS)
    with pytest.raises(ValueError, match="'ttft_ms' is already in the catalogue"):
        register_metric(METRICS["ttft_ms"], lambda r: [r.ttft_ms])
    pooled = Metric("toy_pooled", Dimension.RATIO, ("pooled",), "pooled counters", False, "a toy pooled metric",
                    sampling="pooled", timed=False, repeatable=True, better="higher")
    with pytest.raises(ValueError, match="a pooled metric needs its case"):
        register_metric(pooled, lambda r: [0.0])
    assert METRICS == before
