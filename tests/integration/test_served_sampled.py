"""The tests of tests/unit/test_served_sampled.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from click.testing import CliRunner
from conftest import write_policy
from sampler_server import Sampler, SamplerServer
from unit.test_served_sampled import served_records

from gate.cli import cli
from gate.core.law import Law
from gate.exactness.verdict import evaluate_exactness
from gate.policy.model import RuleSpec
from unit.test_served_sampled import DETECT_TV, FAULTS, PROMPT


@pytest.fixture(scope="module")
def served(tmp_path_factory, sharp_pair):
    """One gate check of the correct sampler and every fault as draft runners of one server
    (law temperature 0.5, top-k 5; gate chooses the samples), and the server's Sampler."""
    from transformers import AutoModelForCausalLM

    target_dir, draft_dir = sharp_pair
    sampler = Sampler(AutoModelForCausalLM.from_pretrained(target_dir).eval(),
                      AutoModelForCausalLM.from_pretrained(draft_dir).eval())
    folder = tmp_path_factory.mktemp("served-sampled")
    prompts = folder / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "c", "prompt": PROMPT}) + "\n"
                       + json.dumps({"id": "b", "category": "c", "prompt": "w5 w6 w7 w5"}) + "\n")
    with SamplerServer(sampler) as server:
        endpoints = "\n".join(f"    {f}: {{base_url: '{server.url}/{f}', api: completions, engine: vllm}}" for f in FAULTS)
        drafts = "\n".join(f"  {f}: {{kind: early_exit, num_layers: 1, num_draft_tokens: 3}}" for f in FAULTS)
        path = write_policy(folder, f"""\
version: 1
target: {{model: {target_dir}, device: cpu}}
drafts:
{drafts}
law: {{temperature: 0.5, top_k: 5}}
runner:
  kind: openai
  endpoints:
    fallback: {{base_url: '{server.url}/fallback', api: completions, engine: vllm}}
{endpoints}
load: {{concurrency: [1, 4]}}
workload: {{source: jsonl, path: {prompts}, max_new_tokens: 4, seed: 0}}
measurement: {{repetitions: 1, warmup_requests: 0, max_cpu_stall: null}}
rules:
  - {{id: exact, kind: exactness, detect_tv: {DETECT_TV}, next_token_prompts: 1}}
""")
        validated = CliRunner().invoke(cli, ["validate", str(path)])
        result = CliRunner().invoke(cli, ["check", str(path), "--json", str(folder / "r.json"), "--no-progress"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return validated, result, json.loads((folder / "r.json").read_text()), sampler, target_dir


def prompt_ids(tokenizer) -> list[int]:
    """PROMPT's token ids as gate's workload feeds them (the chat template: workload.chat_template's default)."""
    from gate.plan.matrix import encoder

    return encoder(tokenizer, True)([{"role": "user", "content": PROMPT}])


def claim_context(report: dict, runner: str) -> list[int]:
    (o,) = [o for o in report["outcomes"] if o["draft"] == runner]
    (claim,) = [t for t in o["details"] if t["role"] == "claim"]
    return json.loads(claim["name"].split("after output ")[1].split("]")[0] + "]")


def test_a_served_sampled_exactness_rule_validates_and_the_correct_sampler_passes(served):
    validated, result, report, _, _ = served
    assert validated.exit_code == 0, validated.output
    (o,) = [o for o in report["outcomes"] if o["draft"] == "none"]
    assert o["status"] == "pass", o["message"]
    # the pass states its power at the claimed position, the reference it rests on and the cost
    assert "detects TV >= " in o["message"] and "at power 0.9" in o["message"]
    assert "reference: the declared target (one-sample)" in o["message"] and "cost: " in o["message"]
    (claim,) = [t for t in o["details"] if t["role"] == "claim"]
    assert claim["detectable"] <= DETECT_TV and "after output [" in claim["name"]
    # the prefill's position (the first output token) is never a claim: speculation begins after it
    assert all("after output" in t["name"] for t in o["details"] if t["role"] == "claim")
    # samples are kept raw, each with its own seed, spread over both load points
    samples = [s for s in report["measurements"]["samples"] if s["runner"] == "none"]
    assert len({s["seed"] for s in samples}) == len(samples) > 100
    assert {s["concurrency"] for s in samples} == {1, 4}
    assert any("served exactness plan" in n for n in report["measurements"]["notes"])


@pytest.mark.parametrize("fault", FAULTS[1:])
def test_every_fault_whose_law_differs_by_detect_tv_fails(served, fault):
    _, _, report, sampler, target_dir = served
    (o,) = [o for o in report["outcomes"] if o["draft"] == fault]
    # the fault's exact law at the claim context (the first token of the first speculative step)
    from transformers import AutoTokenizer

    ids = prompt_ids(AutoTokenizer.from_pretrained(target_dir))
    ctx = ids + claim_context(report, "none")
    law = Law("t0.5-k5", 0.5, 5)
    tv = 0.5 * float((sampler.first_step_law(ctx, law, fault) - sampler.first_step_law(ctx, law, "fallback")).abs().sum())
    assert tv >= DETECT_TV  # each fault here moves the law that far (else the test would claim nothing)
    assert o["status"] == "fail", (fault, tv, o["message"])


def test_gate_exactness_tests_recorded_samples_of_a_served_engine(served, tmp_path):
    # the same sampler's outputs recorded as JSONL (a correct one, accept_all, and the reference with speculation off)
    _, _, _, sampler, target_dir = served
    from transformers import AutoTokenizer

    ids = prompt_ids(AutoTokenizer.from_pretrained(target_dir))
    law = Law("t0.5-k5", 0.5, 5)
    rows = []
    for k, (source, fault) in enumerate((("fallback", "fallback"), ("spec", "none"), ("relaxed", "accept_all"))):
        for i in range(1000):
            out = sampler.generate(ids, 4, law, 100_000 * (k + 1) + i, fault)  # fixed seeds: the same samples every run
            rows.append({"prompt_ids": ids, "output_ids": out, "law": {"temperature": 0.5, "top_k": 5}, "source": source})
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    policy = write_policy(tmp_path, f"version: 1\ntarget: {{model: {target_dir}, device: cpu}}\n"
                                    "rules:\n  - {id: exact, kind: exactness, detect_tv: 0.1}\n")
    out = tmp_path / "e.json"
    result = CliRunner().invoke(cli, ["exactness", str(policy), str(samples), "--served", "fallback", "--json", str(out),
                                      "--junit", str(tmp_path / "j.xml")])
    assert result.exit_code == 1, result.output
    status = {o["draft"]: o for o in json.loads(out.read_text())["outcomes"]}
    assert set(status) == {"spec", "relaxed"}
    assert status["spec"]["status"] == "pass" and "after output [" in status["spec"]["message"], status["spec"]["message"]
    assert status["relaxed"]["status"] == "fail"
    # a reference source that is not in the file: one clear error
    bad = CliRunner().invoke(cli, ["exactness", str(policy), str(samples), "--served", "vllm-off"])
    assert bad.exit_code == 2 and "vllm-off" in bad.output and "Traceback" not in bad.output


def test_the_reference_is_the_declared_target_only_while_the_fallback_runner_passes_it():
    rule = RuleSpec(id="x", kind="exactness", detect_tv=0.1)
    (o,) = evaluate_exactness(rule, served_records([800, 600, 400, 200]), ["d"], ["t"])
    assert o.status == "pass" and "reference: the declared target" in o.message, o.message
    assert [t["name"] for t in o.details if t["role"] == "claim"] == ["next-token[a after output [7]]"]
    # the fallback runner itself does not follow the declared target: the draft's one-sample tests are not used
    (o,) = evaluate_exactness(rule, served_records([2000, 0, 0, 0]), ["d"], ["t"])
    assert "reference: the fallback runner" in o.message and "fails the one-sample test" in o.message, o.message
    assert all(t["name"].startswith("two-sample") for t in o.details)
    assert [t["role"] for t in o.details] == ["claim"]
    # 2000 samples per runner (n_eff 1000) detect TV 0.1: the draft that equals its fallback passes
    assert o.status == "pass", o.message


def test_a_served_draft_without_its_fallback_samples_is_an_error():
    m = served_records([800, 600, 400, 200])
    m.exactness = [r for r in m.exactness if r.draft != "fallback"]
    (o,) = evaluate_exactness(RuleSpec(id="x", kind="exactness"), m, ["d"], ["t"])
    assert o.status == "error" and "fallback runner's samples" in o.message


def test_the_samples_are_drawn_in_looks_and_a_fault_stops_early(served):
    """A sequential run (the default) draws the samples in looks (gate.plan.rounds.SAMPLE_LOOKS):
    every fault here fails before the plan is drawn, the correct sampler is drawn to its plan
    (its pass needs the plan's power), and the report's cost says what was spent."""
    _, _, report, _, _ = served
    looks = report["measurements"]["sample_looks"]
    law = report["measurements"]["laws"][0]
    assert looks["taken"] == len(looks["fractions"]) == 4
    assert looks["drawn"][f"none/{law}"] == looks["planned"][f"none/{law}"]
    for fault in FAULTS[1:]:
        assert looks["drawn"][f"{fault}/{law}"] < looks["planned"][f"{fault}/{law}"], (fault, looks)
    # every sample drawn is kept raw, each with its own seed (later looks number on)
    samples = report["measurements"]["samples"]
    assert Counter(f"{s['runner']}/{s['law']}" for s in samples) == looks["drawn"]
    assert len({(s["runner"], s["seed"]) for s in samples}) == len(samples)
    (o,) = [o for o in report["outcomes"] if o["draft"] == "none"]
    assert "sample look 4 of 4" in o["message"]
    assert report["cost"]["samples"] == sum(looks["drawn"].values()) < report["cost"]["samples_planned"]
