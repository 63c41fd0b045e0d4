"""vLLM server runner lifecycle with a stand-in binary: a server that failed to start is not started again, one that exits leaves no child behind."""

from __future__ import annotations

import pytest

from gate.runners import vllm_server as vs


def test_a_server_that_failed_to_start_is_not_started_again(tmp_path):
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\necho 'ValueError: invalid literal for int()' >&2\nexit 1\n")
    fake.chmod(0o755)
    r = vs.VLLMServerRunner({"fallback": vs.VLLMServerConfig(str(tmp_path))}, str(fake), {2}, startup_timeout_s=30)
    try:
        with pytest.raises(vs.ServedError, match=r"(?s)exited before it was ready, with status 1.*invalid literal") as first:
            r.start("fallback")
        with pytest.raises(vs.ServedError, match="not started again") as again:
            r.start("fallback")
        assert first.value.what in again.value.what and r._spawns == 1
    finally:
        r.close()


def test_a_server_that_exits_leaves_no_child_behind(tmp_path, monkeypatch):
    from gate.runners import process

    monkeypatch.setattr(process, "STOP_GRACE_S", 1.0)  # the child ignores SIGTERM: SIGKILL after the grace
    # vLLM runs its engine core as a child process: when the API server exits, the child is stopped too
    fake = tmp_path / "vllm"
    marker = tmp_path / "child-alive"
    fake.write_text(f"#!/bin/sh\n(trap '' TERM; while true; do touch {marker}; sleep 0.1; done) &\nsleep 0.3\nexit 1\n")
    fake.chmod(0o755)
    r = vs.VLLMServerRunner({"fallback": vs.VLLMServerConfig(str(tmp_path))}, str(fake), {2}, startup_timeout_s=30)
    try:
        with pytest.raises(vs.ServedError, match="exited before it was ready"):
            r.start("fallback")
    finally:
        r.close()
    marker.unlink(missing_ok=True)
    import time

    time.sleep(0.5)
    assert not marker.exists(), "the server's child process outlived it"
