"""The tests of tests/unit/test_device_memory.py's subject that need tiny random-weight models;
the subject and what it must do are described there."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner

from conftest import tiny_llama, tiny_policy, write_policy
from gate.cli import cli
from gate.core.requests import Request
from gate.drafts.model import ModelDraft
from gate.load.sequential import SEQUENTIAL
from gate.measure.device_memory import CudaPeaks
from gate.models.loading import weight_bytes
from gate.records import FALLBACK
from gate.runners.transformers import TransformersRunner
from unit.test_device_memory import FakeCuda
from unit.test_runners import CPU, GREEDY, PROMPT

GiB = 2**30


def test_each_runner_gets_its_own_peak_less_the_drafts_it_does_not_use() -> None:
    target, near, far = tiny_llama(0), tiny_llama(1), tiny_llama(2)
    runner = TransformersRunner(target, set(), CPU, drafts={"near": ModelDraft("near", "model", near, 3, CPU),
                                                           "far": ModelDraft("far", "model", far, 3, CPU)})
    cuda = FakeCuda()
    runner._peaks = CudaPeaks(CPU, cuda)  # the allocator's answers scripted: this machine has no GPU
    cuda.allocated, cuda.reserved = 5 * GiB, 6 * GiB
    with runner:
        runner.run([Request(FALLBACK, GREEDY, PROMPT, 4, 0, 1), Request("near", GREEDY, PROMPT, 4, 0, 1)], SEQUENTIAL)
        cuda.allocated = 7 * GiB  # a later request of "near" peaks higher: the highest is kept
        runner.run([Request("near", GREEDY, PROMPT, 4, 0, 1)], SEQUENTIAL)
    assert cuda.resets == 3  # before every request
    records = {(d.runner, d.law): d for d in runner.device_memory()}
    assert set(records) == {(FALLBACK, GREEDY.name), ("near", GREEDY.name)}
    one_draft = weight_bytes(near)
    assert weight_bytes(far) == one_draft > 0  # same architecture
    assert records["near", GREEDY.name].others_bytes == one_draft  # "far" is resident, not used
    assert records[FALLBACK, GREEDY.name].others_bytes == 2 * one_draft  # both drafts
    assert records["near", GREEDY.name].allocated_bytes == 7 * GiB - one_draft
    assert records["near", GREEDY.name].reserved_bytes == 6 * GiB - one_draft and records["near", GREEDY.name].requests == 2
    assert records[FALLBACK, GREEDY.name].allocated_bytes == 5 * GiB - 2 * one_draft
    assert records[FALLBACK, GREEDY.name].device == "Fake H100"


def test_on_cpu_device_memory_rules_are_skipped_and_the_reports_say_why(tmp_path, tiny_model_dir, prompts_file) -> None:
    rules = ("  - id: peak\n    metric: device_peak_allocated_bytes\n    aggregation: max\n    comparison: '<='\n"
             "    threshold: 1 GiB\n"
             "  - id: gap\n    metric: unaccounted_device_bytes\n    aggregation: max\n    comparison: '<='\n"
             "    threshold: 100 MiB\n")
    policy = write_policy(tmp_path, tiny_policy(tiny_model_dir, prompts_file, rules))
    out = {k: tmp_path / f"r.{k}" for k in ("json", "md", "html")}
    result = CliRunner().invoke(cli, ["check", str(policy), "--json", str(out["json"]), "--markdown", str(out["md"]),
                                      "--html", str(out["html"]), "--no-warmup"])
    assert result.exit_code != 2, result.output
    report = json.loads(out["json"].read_text())
    device = [o for o in report["outcomes"] if o["rule_id"] in ("peak", "gap")]
    assert device and {o["status"] for o in device} == {"skipped"}
    assert all("not measured: no accelerator" in o["message"] for o in device)
    assert report["measurements"]["device_memory"] == [] and report["measurements"]["accelerator"] is None
    assert {r["device_memory_note"] for r in report["summary"]} == {"not measured: no accelerator"}
    assert not [f for f in report["measurements"]["failures"] if f["stage"] == "device memory"]
    assert "Device peak memory: not measured: no accelerator." in out["md"].read_text()
    assert "Device peak memory: not measured: no accelerator." in out["html"].read_text()
    assert "device peak memory: not measured: no accelerator" in result.output
