"""The tests of tests/unit/test_client_check.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from conftest import stub_policy, write_policy
from gate.cli import cli
from gate.runners.client.workers import shared_pool
from served_stub import Stub
from threaded_stub import Server as ThreadedStub
from unit.test_client_check import _resume_workers  # noqa: F401 - shared with that tier
from unit.test_client_check import TTFT_RULE

# A TTFT ceiling the stub's 20 ms first token cannot meet: decided as a fail on honest
# requests, inconclusive when the requests the client delayed must be left out.


class Stopper:
    """Stops every client worker process for `stop_s` out of every `period_s` (SIGSTOP /
    SIGCONT), from a thread, until stopped: a client that does not get its CPU."""

    def __init__(self, stop_s: float = 0.04, period_s: float = 0.05):
        self.stop_s, self.period_s = stop_s, period_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            pids = [w.proc.pid for w in list(shared_pool().workers)]
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:
                    pass
            time.sleep(self.stop_s)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
            time.sleep(self.period_s - self.stop_s)

    def __enter__(self) -> "Stopper":
        shared_pool().ensure(1)  # the workers exist before the run, so they are stopped from its first request
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join(5)
        for w in shared_pool().workers:
            try:
                os.kill(w.proc.pid, signal.SIGCONT)
            except OSError:
                pass


def check(tmp_path: Path, tiny_model_dir: Path, prompts_file: Path, slowed: bool) -> tuple[int, dict[str, Any], Path]:
    with Stub(ttft_s=0.02, itl_s=0.005) as fallback, Stub(ttft_s=0.02, itl_s=0.005) as draft:
        text = stub_policy(tiny_model_dir, prompts_file, fallback.url, draft.url, load="{concurrency: [1]}",
                           max_new_tokens=8, rules=TTFT_RULE,
                           measurement="repetitions: 2, warmup_requests: 0, max_cpu_stall: null, max_client_lag_ms: 10")
        path = write_policy(tmp_path, text)
        args = ["check", str(path), "--json", str(tmp_path / "out.json"), "--markdown", str(tmp_path / "out.md"),
                "--html", str(tmp_path / "out.html"), "--no-progress"]
        if slowed:
            with Stopper():
                result = CliRunner().invoke(cli, args)
        else:
            result = CliRunner().invoke(cli, args)
    assert "Traceback" not in result.output, result.output
    assert (tmp_path / "out.json").exists(), (result.output, result.exception)
    return result.exit_code, json.loads((tmp_path / "out.json").read_text()), tmp_path


def test_a_slowed_client_makes_its_timing_verdicts_inconclusive_and_says_so_in_every_report(
        tmp_path: Path, tiny_model_dir: Path, prompts_file: Path) -> None:
    code, report, folder = check(tmp_path, tiny_model_dir, prompts_file, slowed=True)
    ttft = [o for o in report["outcomes"] if o["rule_id"] == "ttft"]
    assert ttft and all(o["status"] == "inconclusive" for o in ttft), [(o["status"], o["message"]) for o in ttft]
    assert all("client delayed: schedule or event-loop lag over 10 ms on" in o["message"] for o in ttft), ttft
    assert code == 3  # inconclusive at error level: the gate could not decide
    checks = report["client"]
    assert checks and {c["runner"] for c in checks} == {"fallback", "fast"}
    for c in checks:
        assert c["workers"] >= 1 and c["max_client_lag_ms"] == 10
        assert c["delayed"] > c["requests"] / 2, c
        assert c["loop_lag_max_ms"] > 10, c
        assert any("client delayed" in w for w in c["warnings"]), c
    requests = report["measurements"]["requests"]
    assert requests and all(r["loop_lag_ms"] is not None and r["schedule_lag_ms"] is not None for r in requests)
    assert all(r["send_ms"] >= 0 and r["client_worker"] is not None for r in requests)
    md = (folder / "out.md").read_text()
    assert "### Client self-check" in md and "client: fallback greedy c=1" in md
    html = (folder / "out.html").read_text()
    assert '<section id="client">' in html and "client delayed" in html


def test_the_same_rule_on_a_client_that_gets_its_cpu_is_decided(tmp_path: Path, tiny_model_dir: Path,
                                                                 prompts_file: Path) -> None:
    code, report, _ = check(tmp_path, tiny_model_dir, prompts_file, slowed=False)
    ttft = [o for o in report["outcomes"] if o["rule_id"] == "ttft"]
    assert ttft and all(o["status"] == "fail" for o in ttft), [(o["status"], o["message"]) for o in ttft]
    assert code == 1
    for c in report["client"]:
        assert c["delayed"] <= c["requests"] / 2, c  # a busy test machine may delay a few, never most
        assert c["token_mismatches"] == 0  # the stub's tokens_predicted is the count it streamed


def test_a_threaded_server_that_holds_requests_is_reported_as_the_servers_time(tmp_path: Path, tiny_model_dir: Path,
                                                                             prompts_file: Path) -> None:
    # two thread-per-connection servers (tests/threaded_stub.py): the draft's holds each request 30 ms before it answers
    # its headers, the fallback's sends its headers with its first token (nothing to tell apart from the prefill)
    servers = {"fast": ThreadedStub(("127.0.0.1", 0), 0.02, 0.005, 1, hold_s=0.03),
               "fallback": ThreadedStub(("127.0.0.1", 0), 0.02, 0.005, 1, headers_with_first=True)}
    for srv in servers.values():
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    urls = {name: f"http://127.0.0.1:{srv.server_address[1]}" for name, srv in servers.items()}
    path = write_policy(tmp_path, stub_policy(
        tiny_model_dir, prompts_file, urls["fallback"], urls["fast"], load="{concurrency: [2]}", max_new_tokens=8,
        rules=TTFT_RULE, api="completions",
        measurement="repetitions: 2, warmup_requests: 0, max_cpu_stall: null, max_client_lag_ms: null, sequential: false"))
    try:
        result = CliRunner().invoke(cli, ["check", str(path), "--json", str(tmp_path / "out.json"), "--no-progress"])
    finally:
        for srv in servers.values():
            srv.shutdown()
            srv.server_close()
    assert "Traceback" not in result.output and (tmp_path / "out.json").exists(), result.output
    report = json.loads((tmp_path / "out.json").read_text())
    requests = report["measurements"]["requests"]
    held = [r for r in requests if r["draft"] == "fast"]
    assert held and all(30.0 <= r["headers_ms"] < r["token_times_ms"][0] for r in held), [r["headers_ms"] for r in held]
    first = [r for r in requests if r["draft"] == "fallback"]
    assert first and all(r["headers_ms"] >= r["token_times_ms"][0] for r in first)  # with the first token
    # one self-check per window: each of the draft's holds its requests at least the 30 ms (more on a busy machine:
    # the stub's threads share this process), the fallback's tells none apart
    checks = report["client"]
    held = [c for c in checks if c["runner"] == "fast"]
    assert held and all(30.0 <= c["server_headers_p50_ms"] for c in held), held
    assert all(any("the server answered the requests' headers" in w for w in c["warnings"]) for c in held), held
    assert all(c["server_headers_p50_ms"] is None for c in checks if c["runner"] == "fallback")
    (ttft,) = [o for o in report["outcomes"] if o["rule_id"] == "ttft"]
    assert ttft["status"] == "fail" and "of it, the server's time to its response headers" in ttft["message"], ttft["message"]
    assert "over 10 requests (server_headers_ms)" in ttft["message"], ttft["message"]


# -- the checks on synthetic records (gate.measure.client_check) -----------------------------


# -- timing rules on client-delayed requests (gate.rules.kinds.metric) -----------------------


