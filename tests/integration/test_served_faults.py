"""The tests of tests/unit/test_served_faults.py's subject that need stub servers, tiny random-weight models or subprocesses; the subject and
what it must do are described there."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import write_policy
from served_stub import FIRST_ID, Stub
from unit.test_served_faults import free_port

from gate.load.closed import ClosedLoop
from gate.load.open import OpenLoop
from gate.runners.interface import StreamResult
from gate.runners.netstat import listen_counters
from gate.runners.openai import ServedError
from unit.test_served_faults import errors, req, reqs, runner  # noqa: F401 - shared with that tier
from unit.test_served_faults import GATE


def test_reset_before_the_response() -> None:
    with Stub(fault_all="reset") as stub:
        out = errors(runner(stub.url, request_timeout_s=2.0, max_consecutive_failures=5).run(
            reqs(2), ClosedLoop(concurrency=1)))
        assert len(stub.requests) == 2  # each was read by the server (and not sent twice)
    for e in out:
        assert e.kind == "reset_before_response"
        assert re.fullmatch(r"connection reset before the response \(ReadError: ECONNRESET \(Connection reset by peer\); "
                            r"after the request was sent, no response byte, [0-9.]+ s after the send\)", e.what), e.what


def test_reset_mid_stream_says_what_had_arrived() -> None:
    with Stub(fault_all="drop") as stub:
        (e,) = errors(runner(stub.url, request_timeout_s=2.0).run(reqs(1), ClosedLoop(concurrency=1)))
    assert e.kind == "reset_mid_stream"
    assert re.fullmatch(r"connection reset mid-stream \(RemoteProtocolError: peer closed connection without sending "
                        r"complete message body \(incomplete chunked read\); after the response headers and 2 event\(s\), "
                        r"2 token\(s\), [0-9.]+ s after the send\)", e.what), e.what


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_stalling_server_costs_max_consecutive_failures_timeouts_not_one_per_request(concurrency: int) -> None:
    with Stub(fault_all="stall") as stub:
        t = time.perf_counter()
        out = errors(runner(stub.url, request_timeout_s=1.0, max_consecutive_failures=3).run(
            reqs(20), ClosedLoop(concurrency=concurrency)))
        wall = time.perf_counter() - t
        sent = len(stub.requests)
    # c=1: 3 timeouts in a row (3 s). c=4: the first 4 time out together (1 s); as the first two of them end
    # (streak 1, 2) their workers send 2 more, which time out at 2 s; the third opens the stop. Not 20 s or 5 s.
    assert wall < 8, wall
    timed_out = [e for e in out if e.kind == "timeout_before_first_byte"]
    assert len(timed_out) == sent == {1: 3, 4: 6}[concurrency]
    for e in timed_out:
        assert e.what == ("timed out before the first byte after 1 s (the request's time limit of 1 s; the request was "
                          "sent, no response byte)"), e.what
    not_sent = [e for e in out if e.kind == "not_sent"]
    assert len(not_sent) == 20 - sent
    assert not_sent[0].what == ("not sent: 3 requests in a row failed at "
                                f"this load point (concurrency {concurrency}; last: {timed_out[-1].what}); the rest are "
                                "errors at once (runner.max_consecutive_failures: 3)")


def test_an_open_loop_stops_without_waiting_for_its_later_arrivals() -> None:
    load = OpenLoop(request_rate=2.0, seed=3)
    span = load.arrival_offsets(20)[-1]
    assert span > 6  # without the stop the run lasts at least the arrivals' span, plus a timeout
    with Stub(fault_all="stall") as stub:
        t = time.perf_counter()
        out = errors(runner(stub.url, request_timeout_s=1.0, max_consecutive_failures=3).run(reqs(20), load))
        wall = time.perf_counter() - t
        sent = len(stub.requests)
    assert wall < span - 1, (wall, span)  # once the requests in flight ended, the later arrivals failed at once
    assert sum(e.kind == "timeout_before_first_byte" for e in out) == sent >= 3
    assert sum(e.kind == "not_sent" for e in out) == 20 - sent
    assert all("at this load point (request rate 2/s; last: timed out before the first byte" in e.what
               for e in out if e.kind == "not_sent")


def test_timed_out_mid_stream_after_events() -> None:
    with Stub(fault_all="stall_mid", ttft_s=0.01, itl_s=0.01) as stub:
        (e,) = errors(runner(stub.url, request_timeout_s=1.0).run(reqs(1), ClosedLoop(concurrency=1)))
    assert e.kind == "timeout_mid_stream"
    assert re.fullmatch(r"timed out mid-stream after 1 s \(the request's time limit of 1 s; the response headers, then "
                        r"2 event\(s\), 2 token\(s\); the last byte 0\.[5-9][0-9] s before\)", e.what), e.what


def test_answers_with_an_error_status_do_not_stop_the_load_point() -> None:
    # HTTP 5xx is the server answering, malformed streams are the server's bug: neither means the runner is gone
    with Stub(faults={20: "http500", 21: "malformed"}) as stub:
        out = runner(stub.url, request_timeout_s=2.0, max_consecutive_failures=1).run(
            [req(first=20 + i % 2, rep=i) for i in range(6)] + [req(rep=9)], ClosedLoop(concurrency=1))
    assert all(isinstance(e, ServedError) and e.kind is None for e in out[:6])
    assert [e.what.split(":")[0] for e in out[:6]] == ["HTTP 500", "malformed SSE event"] * 3
    assert isinstance(out[6], StreamResult) and out[6].output_ids == list(range(FIRST_ID, FIRST_ID + 6))


def test_a_success_resets_the_streak() -> None:
    # stall, ok, stall, ok, ...: never 2 transport failures in a row, so every request is sent
    with Stub(faults={30: "stall"}) as stub:
        batch = [req(first=30 if i % 2 == 0 else 5, rep=i) for i in range(4)]
        out = runner(stub.url, request_timeout_s=0.5, max_consecutive_failures=2).run(batch, ClosedLoop(concurrency=1))
        assert len(stub.requests) == 4
    assert [type(r).__name__ for r in out] == ["ServedError", "StreamResult"] * 2
    assert all(r.kind == "timeout_before_first_byte" for r in out[::2])


def gate_check(tmp_path: Path, model_dir: Path, prompts: Path, url: str, lengths: str) -> tuple[subprocess.CompletedProcess,
                                                                                                float, Path, Path]:
    """`gate check` as a subprocess on test_served_check's served policy with both runners at `url`,
    request_timeout_s 1, max_consecutive_failures 3, no warm-up, max_new_tokens `lengths`:
    (the process, its wall time in s, the JSON and JUnit report paths)."""
    from integration.test_served_check import policy

    text = (policy(model_dir, prompts, url, url)
            .replace("  request_timeout_s: 5\n", "  request_timeout_s: 1\n  max_consecutive_failures: 3\n")
            .replace("max_new_tokens: 12", f"max_new_tokens: {lengths}")
            .replace("warmup_requests: 1", "warmup_requests: 0"))
    path = write_policy(tmp_path, text)
    out_json, out_xml = tmp_path / "out.json", tmp_path / "out.xml"
    t = time.perf_counter()
    proc = subprocess.run([str(GATE), "check", str(path), "--json", str(out_json), "--junit", str(out_xml),
                           "--no-progress"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    return proc, time.perf_counter() - t, out_json, out_xml


def test_gate_check_against_a_stalling_server_ends_in_bounded_time_with_both_reports(tmp_path, tiny_model_dir,
                                                                                    prompts_file) -> None:
    with Stub(fault_all="stall") as stub:
        proc, wall, out_json, out_xml = gate_check(tmp_path, tiny_model_dir, prompts_file, stub.url, "[8, 9, 10, 11]")
        sent = len(stub.requests)
    # 2 runners x 2 load points x 20 requests: 80 timeouts of 1 s without the stop (60 s of waiting: c=1 20 s,
    # c=2 10 s, per runner); with it 3 (c=1) and 2 (c=2) waves per runner, about 10 s, plus gate's start-up.
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert wall < 50, wall
    assert sent == 2 * (3 + 4)  # c=1: 3 sent; c=2: 4 sent (2 waves of 2, the 3rd failure ended the second wave)
    report = json.loads(out_json.read_text())
    assert out_xml.read_text().startswith("<?xml")
    messages = [f["message"] for f in report["measurements"]["failures"]]
    not_sent = [m for m in messages if "not sent: " in m]
    assert len(not_sent) == 80 - sent and all("requests in a row failed at this load point" in m for m in not_sent)
    assert sum("timed out before the first byte after 1 s" in m for m in messages if m not in not_sent) == sent
    assert any("(concurrency 2; last: timed out before the first byte after 1 s" in m for m in messages)
    assert report["measurements"]["requests"] == []


def test_gate_check_reports_the_kernels_listen_queue_overflows(tmp_path, tiny_model_dir, prompts_file) -> None:
    # A listener that never accepts: once its accept queue holds 2 connections every SYN is dropped
    if listen_counters() is None:
        pytest.skip("/proc/net/netstat is not readable here")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        proc, wall, out_json, _ = gate_check(tmp_path, tiny_model_dir, prompts_file, url, "12")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert wall < 50, wall  # 4 windows of 5 requests: 3 s at c=1 and 2 s at c=2 each, plus gate's start-up
    report = json.loads(out_json.read_text())
    notes = [n for n in report["notes"] if n.startswith("the kernel counted ")]
    assert notes and all("listen-queue overflow(s) (TcpExt ListenOverflows" in n for n in notes), report["notes"]
    assert any("while runner 'fallback' ran at concurrency 1 (5 requests)" in n for n in notes), notes
    messages = [f["message"] for f in report["measurements"]["failures"]]
    assert any("timed out before the first byte after 1 s (the request's time limit of 1 s; connecting, no response "
               "byte)" in m for m in messages), messages


def test_a_client_worker_killed_mid_run_fails_what_had_not_ended_at_once_and_the_next_run_starts_afresh() -> None:
    import os
    import signal
    import threading

    from gate.runners.client.workers import shared_pool

    pool = shared_pool()
    pool.ensure(1)
    with Stub(fault_all="stall") as stub:  # every request would wait out its 30 s time limit
        victim = pool.workers[0].proc.pid
        threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
        t = time.perf_counter()
        out = errors(runner(stub.url, request_timeout_s=30.0).run(reqs(4), ClosedLoop(concurrency=2)))
        wall = time.perf_counter() - t
    assert wall < 10, wall  # not the requests' 30 s time limit
    assert len(out) == 4
    for e in out:
        assert "client worker 0 ended (exit code -9)" in e.what and "the requests that had not ended are errors" in e.what
    assert victim not in [w.proc.pid for w in pool.workers]
    with Stub() as stub:
        fresh = runner(stub.url).run(reqs(2), ClosedLoop(concurrency=2))
    assert all(isinstance(r, StreamResult) for r in fresh)


def test_a_client_worker_that_died_between_runs_is_replaced_before_the_next_run_queues_its_requests() -> None:
    """A worker killed while idle: the next run (closed loop, and an open loop with a cap)
    starts fresh workers before it queues its indices and slot tokens, so none is lost."""
    import os
    import signal

    from gate.load.open import OpenLoop
    from gate.runners.client.workers import shared_pool

    pool = shared_pool()
    pool.ensure(2)
    with Stub() as stub:
        for load in (ClosedLoop(concurrency=4), OpenLoop(request_rate=50.0, seed=0, concurrency=2)):
            victim = pool.workers[0].proc
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(5)
            t = time.perf_counter()
            out = runner(stub.url, request_timeout_s=10.0).run(reqs(6), load)
            assert time.perf_counter() - t < 8
            assert all(isinstance(r, StreamResult) for r in out), out
            assert victim.pid not in [w.proc.pid for w in pool.workers]


def test_refused_at_connect_names_the_errno_and_the_rest_are_not_sent() -> None:
    port = free_port()
    out = errors(runner(f"http://127.0.0.1:{port}", request_timeout_s=2.0, max_consecutive_failures=3).run(
        reqs(8), ClosedLoop(concurrency=1)))
    for e in out[:3]:
        assert e.kind == "refused" and f":{port}" in str(e)
        assert re.fullmatch(r"connection refused at connect \(ConnectError: ECONNREFUSED \(Connection refused\); "
                            r"[0-9.]+ s after the send: nothing listens on that port\)", e.what), e.what
    for e in out[3:]:
        assert e.kind == "not_sent"
        assert e.what.startswith("not sent: 3 requests in a row failed at this load point (concurrency 1; last: "
                                 "connection refused at connect (ConnectError: ECONNREFUSED")
        assert e.what.endswith("); the rest are errors at once (runner.max_consecutive_failures: 3)")


def test_a_full_listen_backlog_times_out_and_the_kernel_counts_it() -> None:
    # A listener that never accepts: listen(1) holds 2 handshaken connections in its accept queue; the
    # kernel drops the others' SYNs (TcpExt ListenOverflows), so their connect never completes.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        r = runner(f"http://127.0.0.1:{port}", request_timeout_s=1.5, max_consecutive_failures=6)
        before = listen_counters()
        t = time.perf_counter()
        out = errors(r.run(reqs(6), ClosedLoop(concurrency=6)))
        wall = time.perf_counter() - t
        after = listen_counters()
    assert wall < 6, wall  # all 6 in flight at once, each ends at its 1.5 s limit
    assert all(e.kind == "timeout_before_first_byte" for e in out), [e.what for e in out]
    phases = sorted(re.search(r"; ([a-z ,]+), no response byte\)$", e.what).group(1) for e in out)
    assert "connecting" in phases, phases  # SYN dropped: the handshake never completed
    notes = r.observed().notes
    assert r.observed().notes == []  # returned once, then cleared
    if before is None or after is None or not (after.overflows or 0) > (before.overflows or 0):
        pytest.skip("this machine's /proc/net/netstat shows no ListenOverflows (unreadable, or another namespace)")
    (note,) = notes
    assert re.match(r"the kernel counted [0-9]+ listen-queue overflow\(s\) \(TcpExt ListenOverflows, each dropped SYN or "
                    r"handshake, a retransmitted one again; [0-9]+ ListenDrops\) "
                    r"while runner 'fallback' ran at concurrency 6 \(6 requests\): connections were dropped at SYN "
                    r"because a server's accept backlog \(its listen queue\) was full; requests that got through waited "
                    r"for SYN retransmits \(1 s, 3 s, 7 s, \.\.\. after the first SYN\), which their TTFT includes", note), note
