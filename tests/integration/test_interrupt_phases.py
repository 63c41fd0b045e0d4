"""The tests of tests/unit/test_interrupt_phases.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from click.testing import CliRunner

from conftest import WORDS, stub_policy, tiny_llama, tiny_tokenizer, write_policy
from gate.cli import cli
from served_stub import Stub
from unit.test_interrupt_phases import GATE, WIDE


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory) -> Path:
    """A random Llama over the tiny vocabulary, wide enough (19M parameters) that a
    teacher-forced pass over a few dozen sequences takes seconds on one CPU thread."""
    path = tmp_path_factory.mktemp("wide-llama")
    tiny_llama(0, **WIDE).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def long_prompts(folder: Path, n: int, words: int) -> Path:
    """`n` prompts of `words` words each over the tiny vocabulary."""
    path = folder / "prompts.jsonl"
    rows = [{"id": f"p{i}", "category": "long", "prompt": " ".join(WORDS[(i * 7 + j) % 40] for j in range(words))}
            for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def served_policy(model_dir: Path, prompts: Path, fallback: str, draft: str, extra: str = "") -> str:
    return stub_policy(model_dir, prompts, fallback, draft, timeout_s=10, load="{concurrency: [4]}", max_new_tokens=48,
                       extra=extra)


def in_process_policy(model_dir: Path, prompts: Path, max_new_tokens: int = 8) -> str:
    return f"""\
version: 1
target: {{model: {model_dir}, dtype: float32, device: cpu}}
drafts:
  lookup: {{kind: prompt_lookup, max_ngram_size: 2, num_draft_tokens: 3}}
law: {{temperature: 0}}
workload: {{source: jsonl, path: {prompts}, max_new_tokens: {max_new_tokens}, seed: 0, chat_template: true}}
measurement: {{repetitions: 1, warmup_requests: 0, max_cpu_stall: null, sequential: false}}
rules:
  - {{id: overlap-floor, metric: overlap, aggregation: mean, comparison: '>=', threshold: 0.0}}
  - {{id: itl, metric: itl_ms, aggregation: mean, comparison: '<=', threshold: 10 s}}
  - {{id: exact, kind: exactness}}
"""


def signalled(folder: Path, policy: Path, trigger: Callable[[str], bool], then: Callable[[], None] = lambda: None,
              signum: int = signal.SIGTERM) -> tuple[int, str, float]:
    """Run `gate check policy` as a subprocess; once a stderr line satisfies `trigger`, call
    `then()` (a wait) and send `signum`. Returns (exit code, stderr, seconds from the
    signal to the exit). Fails when no line triggered before gate ended."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    proc = subprocess.Popen([*GATE, "check", str(policy), "--json", str(folder / "out.json"), "--junit",
                             str(folder / "out.xml"), "--markdown", str(folder / "out.md")], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        for line in proc.stderr:  # type: ignore[union-attr]
            seen.append(line)
            if trigger(line):
                break
        else:
            out, err = proc.communicate(timeout=60)
            raise AssertionError(f"no progress line triggered the signal: {''.join(seen)}{err}{out}")
        then()
        assert proc.poll() is None, "gate ended before the signal: the phase was too short"
        proc.send_signal(signum)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=180)
        after = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(seen) + err + out, after


def reports(folder: Path) -> tuple[dict[str, Any], ET.Element]:
    """Both reports, parsed (a malformed file fails here)."""
    return json.loads((folder / "out.json").read_text()), ET.parse(folder / "out.xml").getroot()


def starts(phase: str) -> Callable[[str], bool]:
    return lambda line: line.startswith(f"gate: {phase} ")


def assert_interrupted(folder: Path, code: int, text: str, phase: str, signame: str = "SIGTERM") -> dict[str, Any]:
    expected = 128 + int(getattr(signal, signame))
    assert code == expected, text
    assert "Traceback" not in text and "nothing written" not in text, text
    report, junit = reports(folder)
    assert report["exit_code"] == expected
    assert any(n.startswith(f"interrupted by {signame} during {phase}: ") for n in report["notes"]), report["notes"]
    assert junit.tag == "testsuites" and int(junit.get("errors")) > 0  # the missing measurements are errors
    assert f"interrupted by {signame} during {phase}" in (folder / "out.md").read_text()  # every report asked for
    assert not any(o["status"] == "pass" for o in report["outcomes"] if o["rule_id"] == "exact")
    return report


# --- served runs ------------------------------------------------------------------------

def test_sigterm_during_served_requests_keeps_the_requests_measured(tmp_path: Path, wide_model_dir: Path) -> None:
    prompts = long_prompts(tmp_path, 24, 80)
    with Stub(ttft_s=0.05, itl_s=0.01) as fallback, Stub(ttft_s=0.05, itl_s=0.01) as draft:
        policy = write_policy(tmp_path, served_policy(wide_model_dir, prompts, fallback.url, draft.url))

        def some_ended() -> None:  # 4 in flight: once 9 were sent, at least 5 have ended
            deadline = time.monotonic() + 60
            while len(fallback.requests) + len(draft.requests) < 9 and time.monotonic() < deadline:
                time.sleep(0.02)

        code, text, after = signalled(tmp_path, policy, starts("requests"), some_ended)
    report = assert_interrupted(tmp_path, code, text, "the requests")
    requests = report["measurements"]["requests"]
    assert 5 <= len(requests) < 48  # what ended before the signal is kept
    missing = [f for f in report["measurements"]["failures"] if f["stage"] == "request"]
    assert missing and all(f["message"].startswith("interrupted by SIGTERM after ") and "not measured" in f["message"]
                           for f in missing)
    assert sum(int(f["what"].split()[0]) for f in missing) == 48 - len(requests)  # every request not measured is named
    assert any("during the requests" in f["message"] and f["stage"] == "exactness" for f in report["measurements"]["failures"])
    assert after < 60


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_during_the_served_exactness_pass_writes_every_request(tmp_path: Path, wide_model_dir: Path,
                                                                        signame: str) -> None:
    prompts = long_prompts(tmp_path, 24, 400)  # a teacher-forced pass long enough for the signal to land in it
    with Stub(ttft_s=0.02, itl_s=0.002) as fallback, Stub(ttft_s=0.02, itl_s=0.002, draft_n=8, draft_n_accepted=4) as draft:
        policy = write_policy(tmp_path, served_policy(wide_model_dir, prompts, fallback.url, draft.url))
        code, text, after = signalled(tmp_path, policy, starts("exactness"), signum=getattr(signal, signame))
    report = assert_interrupted(tmp_path, code, text, "the served exactness pass", signame)
    m = report["measurements"]
    assert len(m["requests"]) == 48 and all(len(r["output_ids"]) == 48 for r in m["requests"])  # all measured
    (failure,) = [f for f in m["failures"] if f["stage"] == "exactness"]
    assert failure["message"] == f"interrupted by {signame} during the served exactness pass: not measured"
    assert not any(f["stage"] == "request" for f in m["failures"])
    assert m["bills"], "the bill (from configs) is still made after the interrupt"
    (exact,) = [o for o in report["outcomes"] if o["rule_id"] == "exact"]
    assert exact["status"] == "error"
    speedup = [o for o in report["outcomes"] if o["rule_id"] == "speedup"]
    assert speedup and all(o["status"] != "error" for o in speedup)  # decided on the requests measured
    assert after < 60


# --- in-process runs --------------------------------------------------------------------

def test_sigterm_during_in_process_requests_keeps_the_requests_measured(tmp_path: Path, wide_model_dir: Path) -> None:
    policy = write_policy(tmp_path, in_process_policy(wide_model_dir, long_prompts(tmp_path, 10, 250)))
    code, text, after = signalled(tmp_path, policy, starts("requests"), lambda: time.sleep(2.0))
    report = assert_interrupted(tmp_path, code, text, "the requests")
    m = report["measurements"]
    assert 1 <= len(m["requests"]) < 20
    missing = [f for f in m["failures"] if f["stage"] == "request"]
    assert missing and all(f["message"].startswith("interrupted by SIGTERM after ") for f in missing)
    assert {f["stage"] for f in m["failures"]} >= {"request", "overlap", "exactness"}  # the passes that did not run
    assert after < 60


@pytest.mark.parametrize("phase,progress", [("the overlap pass", "overlap"), ("the exactness pass", "exactness")])
def test_sigterm_during_an_in_process_pass_keeps_every_request(tmp_path: Path, wide_model_dir: Path, phase: str,
                                                               progress: str) -> None:
    policy = write_policy(tmp_path, in_process_policy(wide_model_dir, long_prompts(tmp_path, 10, 250)))
    code, text, after = signalled(tmp_path, policy, starts(progress))
    report = assert_interrupted(tmp_path, code, text, phase)
    m = report["measurements"]
    assert len(m["requests"]) == 20 and not any(f["stage"] == "request" for f in m["failures"])
    stage = progress
    assert any(f["stage"] == stage and f["message"] == f"interrupted by SIGTERM during {phase}: not measured"
               for f in m["failures"]), m["failures"]
    itl = [o for o in report["outcomes"] if o["rule_id"] == "itl"]
    assert itl and all(o["status"] == "pass" for o in itl)  # decided on the requests measured
    if progress == "overlap":
        assert any(f["stage"] == "exactness" and f["message"].endswith("before the exactness pass: not measured")
                   for f in m["failures"])
    assert m["bills"]
    assert after < 60


# --- the bill: the signal from gate's own process as the bill starts --------------------

def _sigterm_first(real: Callable[..., Any]) -> Callable[..., Any]:
    def bill(*args: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # CI cancels the job as the bill is made
        time.sleep(5)  # never reached: the handler raises first
        return real(*args)

    return bill


def test_sigterm_during_the_in_process_bill(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path, in_process_main,
                                           monkeypatch) -> None:
    import gate.loop.run

    monkeypatch.setattr(gate.loop.run, "_bills", _sigterm_first(gate.loop.run._bills))
    policy = write_policy(tmp_path, in_process_policy(tiny_model_dir, prompts_file, 6))
    code = in_process_main("check", str(policy), "--json", str(tmp_path / "out.json"), "--junit", str(tmp_path / "out.xml"),
                     "--no-progress")
    assert code == 143
    report, junit = reports(tmp_path)
    assert any(n.startswith("interrupted by SIGTERM during the bill: ") for n in report["notes"])
    m = report["measurements"]
    assert len(m["requests"]) == 10 and m["overlaps"] and m["exactness"]  # every phase before the bill
    assert [f["message"] for f in m["failures"]] == ["interrupted by SIGTERM during the bill: not measured"]
    assert int(junit.get("errors")) >= 1


def test_sigterm_during_the_served_bill(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path, in_process_main,
                                        monkeypatch) -> None:
    import gate.loop.run

    monkeypatch.setattr(gate.loop.run, "_config_bills", _sigterm_first(gate.loop.run._config_bills))
    with Stub() as fallback, Stub() as draft:
        policy = write_policy(tmp_path, served_policy(tiny_model_dir, prompts_file, fallback.url, draft.url)
                              .replace("max_new_tokens: 48", "max_new_tokens: 8"))
        code = in_process_main("check", str(policy), "--json", str(tmp_path / "out.json"), "--junit", str(tmp_path / "out.xml"),
                         "--no-progress")
    assert code == 143
    report, _ = reports(tmp_path)
    assert any(n.startswith("interrupted by SIGTERM during the bill: ") for n in report["notes"])
    m = report["measurements"]
    assert len(m["requests"]) == 10 and m["exactness"] and m["exactness"][0]["compared"] == 5
    assert [f["message"] for f in m["failures"]] == ["interrupted by SIGTERM during the bill: not measured"]


# --- the served exactness pass: batched, and skipped when there is nothing to compare ---

def test_batched_teacher_forcing_gives_the_logits_of_one_at_a_time() -> None:
    from gate.exactness.oracle import TargetOracle
    from gate.exactness.fallback import teacher_forced

    oracle = TargetOracle(tiny_llama(0), torch.device("cpu"))
    forwards = []
    oracle.model.register_forward_hook(lambda mod, args, out: forwards.append(1))
    g = torch.Generator().manual_seed(0)
    shapes = [(20, 5), (31, 12), (9, 3), (50, 40), (110, 60), (12, 11), (2, 1), (64, 30)] * 3
    seqs = [(torch.randint(4, 96, (n,), generator=g).tolist(), start) for n, start in shapes]
    one_at_a_time = [oracle.target_logits(ids, start).float() for ids, start in seqs]
    forwards.clear()
    batched = dict(teacher_forced(oracle, seqs))
    assert sorted(batched) == list(range(len(seqs)))
    assert len(forwards) <= len(seqs) // 4  # several sequences per forward (8 at most)
    for i, ref in enumerate(one_at_a_time):
        assert batched[i].shape == ref.shape == (len(seqs[i][0]) - seqs[i][1], 96)
        torch.testing.assert_close(batched[i], ref, atol=1e-5, rtol=1e-4)


def _served_check(tmp_path: Path, text: str) -> tuple[int, dict[str, Any]]:
    path = write_policy(tmp_path, text)
    result = CliRunner().invoke(cli, ["check", str(path), "--json", str(tmp_path / "out.json"), "--junit",
                                      str(tmp_path / "out.xml"), "--no-progress"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads((tmp_path / "out.json").read_text())


@pytest.fixture
def counted_forwards(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """Forwards of the local target that served exactness loads (a hook on its model)."""
    import gate.loop.session

    real = gate.loop.session.open_target
    forwards: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        target = real(*args, **kwargs)
        target.oracle.model.register_forward_hook(lambda mod, a, out: forwards.append(1))
        return target

    monkeypatch.setattr(gate.loop.session, "open_target", counting)
    return forwards


def test_the_served_exactness_pass_runs_when_there_are_outputs_to_compare(tmp_path: Path, tiny_model_dir: Path,
                                                                         prompts_file: Path, counted_forwards) -> None:
    with Stub() as fallback, Stub() as draft:
        code, report = _served_check(tmp_path, served_policy(tiny_model_dir, prompts_file, fallback.url, draft.url))
    (rec,) = report["measurements"]["exactness"]
    assert rec["compared"] == 5 and rec["numerical_tolerance"] is not None
    assert 1 <= len(counted_forwards) < 5  # five fallback outputs, batched


def test_the_served_exactness_pass_does_not_run_when_every_draft_request_failed(tmp_path: Path, tiny_model_dir: Path,
                                                                               prompts_file: Path,
                                                                               counted_forwards) -> None:
    with Stub() as fallback, Stub() as draft:
        draft.fault_all = "http500"
        code, report = _served_check(tmp_path, served_policy(tiny_model_dir, prompts_file, fallback.url, draft.url))
    assert code == 3
    assert len(report["measurements"]["requests"]) == 5  # the fallback's
    assert counted_forwards == []  # the local target's pass did not run
    (exact,) = [o for o in report["outcomes"] if o["rule_id"] == "exact"]
    assert exact["status"] == "error"


def test_the_served_exactness_pass_does_not_run_without_token_ids(tmp_path: Path, tiny_model_dir: Path,
                                                                 prompts_file: Path, counted_forwards) -> None:
    with Stub(with_ids=False) as fallback, Stub(with_ids=False) as draft:
        text = served_policy(tiny_model_dir, prompts_file, fallback.url, draft.url).replace("api: llama_cpp", "api: completions")
        code, report = _served_check(tmp_path, text)
    (rec,) = report["measurements"]["exactness"]
    assert rec["compared"] == 0 and "without token ids" in rec["note"]
    assert counted_forwards == []


