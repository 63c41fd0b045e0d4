"""The client's worker processes, driven from gate's own process: one scheduler (this
module's WorkerPool.run and the split of a load point into Jobs), several workers (each its
own process, event loop and connections: gate.runners.client.worker), so that sends and
byte arrivals are stamped where they happen, not behind other streams' parsing (guidellm and
NVIDIA's AIPerf drive their loads the same way). The workers parse nothing; gate's process
reads the raw chunks they hand back.

How many: client_workers (the cores gate may use and the streams in flight, at most
STREAMS_PER_WORKER each), or the policy's runner.client_workers. One pool per gate process,
started on first use and kept (a worker costs ~0.3 s to start), grown on demand.

A closed loop's concurrency is split over the workers (slots); every slot takes the next
request index from one shared pipe, so the order and the total in flight are the loop's. An
open loop's arrivals go round-robin to the workers, each sent at its absolute time; a
concurrency cap is one shared pipe of slot tokens (first come first served within a
worker, across workers as their loops reach it).
"""

from __future__ import annotations

import atexit
import fcntl
import math
import os
import queue
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.records import ClientWorkerRecord
from gate.runners.client.transport import TRANSPORT_KINDS, ServedError
from gate.runners.client.worker import Job, read_frame, write_frame

# Streams per worker before another worker is worth its CPU: at concurrency 8 on 2 cores one worker's median TTFT
# error was 2.31 ms, two workers' 1.28 ms; at 4, 1.55 and 1.22; at 2, 1.24 and 1.20 (6 runs each, stub at 40 ms).
STREAMS_PER_WORKER = 2
START_LEAD_S = 0.05  # a load point begins this long after its jobs are handed out (every worker has its share)
DISPATCH_BYTES_PER_S = 50e6  # and later by its bodies' bytes at this rate (pickled, piped, unpickled: a slow machine's)
READY_S = 30.0  # a new worker's start and priming
F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032  # Linux fcntl: a pipe's capacity
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class PoolError(RuntimeError):
    """The workers could not run a job: one died (its exit code and last stderr lines), or
    none answered within the job's time limit (`timed_out`)."""

    def __init__(self, what: str, timed_out: bool = False):
        super().__init__(what)
        self.timed_out = timed_out


def _widen(fd: int) -> None:
    """A pipe's capacity raised to 1 MiB where the system allows it (Linux; else left)."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, 1 << 20)
    except OSError:
        pass


def _room(fd: int) -> int:
    """A pipe's capacity in bytes (Linux F_GETPIPE_SZ; 16 KiB, the least of the others, where unknown)."""
    try:
        return fcntl.fcntl(fd, F_GETPIPE_SZ)
    except OSError:
        return 16384


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def client_workers(in_flight: int, cpus: int | None = None) -> int:
    """Worker processes for `in_flight` streams at most: one per STREAMS_PER_WORKER streams,
    at most one per usable CPU (`cpus`, default usable_cpus()), at least 1."""
    cpus = cpus or usable_cpus()
    return max(1, min(cpus, math.ceil(max(1, in_flight) / STREAMS_PER_WORKER)))


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen
    stderr: list[str]


class WorkerPool:
    """Client worker processes and the two pipes they share (request indices, slot
    tokens). run() hands one Job to each of the first len(jobs) workers and reports each
    request's result as it ends; stop() stops a job's sending; close() ends the workers."""

    def __init__(self) -> None:
        self.workers: list[_Worker] = []
        self.inbox: queue.Queue[tuple[_Worker, Any]] = queue.Queue()
        self.index_r, self.index_w = os.pipe()
        self.slot_r, self.slot_w = os.pipe()
        for fd in (self.index_r, self.index_w, self.slot_r, self.slot_w):
            os.set_blocking(fd, False)
        for fd in (self.index_w, self.slot_w):
            _widen(fd)  # 1 MiB where allowed: 262,144 indices, 131,072 slot tokens
        self.lock = threading.Lock()
        self.job_id = 0
        self.stopped = 0  # the last job stopped
        self.closed = False

    def ensure(self, n: int) -> None:
        """Start workers until there are `n`, each ready (primed) before this returns.
        A worker that ended since the last job ends them all first (the next job starts on
        fresh ones; what the shared pipes hold is left as it is).
        Raises PoolError when one cannot start or is not ready within READY_S."""
        if any(w.proc.poll() is not None for w in self.workers):
            self.terminate()
        new = set(range(len(self.workers), n))
        while len(self.workers) < n:
            fds = (self.index_r, self.slot_r, self.slot_w)
            path = os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
            env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "gate.runners.client.worker", *map(str, fds)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=fds,
                    env=env,
                )
            except OSError as e:
                raise PoolError(f"a client worker process could not start: {e}") from None
            assert proc.stdout is not None
            _widen(proc.stdout.fileno())  # a worker's result frames rarely wait for this process's reader
            w = _Worker(proc, [])
            self.workers.append(w)
            threading.Thread(target=self._read, args=(w,), name=f"gate-client-worker-{proc.pid}", daemon=True).start()
            threading.Thread(target=self._errors, args=(w,), daemon=True).start()
        deadline = time.monotonic() + READY_S
        while new:
            got = self._next(max(0.01, deadline - time.monotonic()))
            if got is None:
                self.terminate()
                raise PoolError(f"client worker(s) {sorted(new)} did not start within {READY_S:g} s")
            k, msg = got
            if msg[0] == "ready":
                new.discard(k)
            elif msg[0] == "died":
                w = msg[1]
                self.terminate()
                raise PoolError(
                    f"client worker {k} could not start (exit code {w.proc.poll()})"
                    + (f": {' | '.join(w.stderr[-3:])}" if w.stderr else "")
                )

    def _read(self, w: _Worker) -> None:
        """Frames of worker `w` into the inbox, as (w, frame); ("died", w) at its end."""
        assert w.proc.stdout is not None
        while True:
            try:
                msg = read_frame(w.proc.stdout)
            except Exception as e:  # noqa: BLE001 - a broken frame ends this worker
                msg = None
                w.stderr.append(f"unreadable frame: {e}")
            if msg is None:
                self.inbox.put((w, ("died", w)))
                return
            self.inbox.put((w, msg))

    def _next(self, timeout_s: float) -> tuple[int, Any] | None:
        """The next frame of a current worker as (its index, frame), waiting up to
        `timeout_s`; None when none came. Frames of workers ended before are dropped."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                w, msg = self.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if w in self.workers:
                return self.workers.index(w), msg

    @staticmethod
    def _errors(w: _Worker) -> None:
        assert w.proc.stderr is not None
        for line in w.proc.stderr:
            w.stderr.append(line.decode("utf-8", "replace").rstrip())
            del w.stderr[:-20]

    def put_indices(self, indices: range) -> None:
        """Queue a closed loop's request indices for the slots to take (all of them now: a
        slot that finds the pipe empty is done). Raises PoolError when they do not fit the
        index pipe (262,144 where pipes may grow to 1 MiB, else 16,384)."""
        data = b"".join(struct.pack(">I", i) for i in indices)
        room = _room(self.index_w)
        if len(data) > room:
            raise PoolError(
                f"a closed loop of {len(indices)} requests does not fit the client's index pipe "
                f"({room // 4} requests): split the load point (fewer prompts or repetitions)"
            )
        view = memoryview(data)
        while view:  # at most PIPE_BUF (4 KiB) per write: never part of an index, and the pipe has the room
            view = view[os.write(self.index_w, view[:4096]) :]

    def drain_indices(self) -> list[int]:
        """The indices no slot took (a stopped job), removed from the pipe."""
        out = []
        while True:
            try:
                data = os.read(self.index_r, 4096)
            except BlockingIOError:
                return out
            if not data:
                return out
            out += [struct.unpack(">I", data[j : j + 4])[0] for j in range(0, len(data), 4)]

    def put_slots(self, n: int, at_s: float) -> None:
        """Make `n` slot tokens free from `at_s` (an open loop's cap). Raises PoolError when
        the slot pipe cannot hold `n` (a cap above 131,072, or 8,192 where pipes stay 64 KiB)."""
        self.drain_slots()
        data = struct.pack("d", at_s) * n
        room = _room(self.slot_w)
        if len(data) > room:
            raise PoolError(f"a concurrency cap of {n} does not fit the client's slot pipe ({room // 8} slots)")
        view = memoryview(data)
        while view:  # at most PIPE_BUF (4 KiB) per write: never part of a token
            view = view[os.write(self.slot_w, view[:4096]) :]

    def drain_slots(self) -> None:
        while True:
            try:
                if not os.read(self.slot_r, 65536):
                    return
            except BlockingIOError:
                return

    def next_job_id(self) -> int:
        self.job_id += 1
        return self.job_id

    def _send(self, k: int, frame: Any) -> None:
        try:
            stdin = self.workers[k].proc.stdin
            assert stdin is not None
            write_frame(stdin, frame)
        except (OSError, ValueError, IndexError):
            pass  # a worker that is gone says so on its own ("died")

    def stop(self, job_id: int) -> None:
        """Tell every worker to begin nothing more of job `job_id`."""
        self.stopped = job_id
        for w in self.workers:
            try:
                assert w.proc.stdin is not None
                write_frame(w.proc.stdin, ("stop", job_id))
            except (OSError, ValueError):
                pass

    def run(self, jobs: list[Job], on_result: Callable[[int, Any], None], limit_s: float) -> list[ClientWorkerRecord]:
        """Hand jobs[k] to worker k (all of one job id) and call on_result(index, result) in
        this thread as each request ends (result: a RawStream, a ServedError, or
        worker.NOT_SENT); the workers' stats once all are done. After a transport failure
        the worker's slot waits for a verdict: a go unless on_result stopped the job
        (stop(): the breaker opened). Raises PoolError when a
        worker dies or the job is not done within `limit_s` (the workers are then ended:
        the next run starts fresh ones); KeyboardInterrupt propagates, the workers ended."""
        if len(self.workers) < len(jobs) or any(w.proc.poll() is not None for w in self.workers[: len(jobs)]):
            self.terminate()  # ensure() came first, and its workers are no longer all there
            raise PoolError("a client worker ended before it took its share")
        job_id = jobs[0].job_id
        while True:  # frames of an earlier job (stopped, interrupted) are not this one's
            try:
                w, msg = self.inbox.get_nowait()
            except queue.Empty:
                break
            if msg[0] == "died" and w in self.workers[: len(jobs)]:
                self.terminate()
                raise PoolError(
                    f"client worker {self.workers.index(w) if w in self.workers else '?'} ended before "
                    "it took its share"
                )
        for k, job in enumerate(jobs):
            try:
                assert self.workers[k].proc.stdin is not None
                write_frame(self.workers[k].proc.stdin, ("job", job))
            except (OSError, ValueError) as e:
                self.terminate()
                raise PoolError(f"client worker {k} could not take its share: {e}") from None
        pending = set(range(len(jobs)))
        stats: list[ClientWorkerRecord] = []
        deadline = time.monotonic() + limit_s
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolError(
                        f"the client did not finish within {limit_s:.0f} s (it stopped making progress)", timed_out=True
                    )
                got = self._next(min(left, 1.0))  # polled once a second at most: an interrupt is never held up
                if got is None:
                    continue
                k, msg = got
                if msg[0] == "result" and msg[1] == job_id:
                    on_result(msg[2], msg[3])
                    failed = isinstance(msg[3], ServedError) and msg[3].kind in TRANSPORT_KINDS
                    if failed and self.stopped != job_id:  # the breaker is still closed: that slot may go on
                        self._send(k, ("go", job_id))
                elif msg[0] == "done" and msg[1] == job_id:
                    pending.discard(k)
                    stats.append(msg[2])
                elif msg[0] == "died" and k in pending:  # one that had finished, or had no share, is replaced next time
                    w = msg[1]
                    raise PoolError(
                        f"client worker {k} ended (exit code {_exit_code(w.proc)})"
                        + (f": {' | '.join(w.stderr[-3:])}" if w.stderr else "")
                    )
        except BaseException:
            self.terminate()
            raise
        return sorted(stats, key=lambda s: s.worker)

    def terminate(self) -> None:
        """End every worker now (the next run starts fresh ones)."""
        workers, self.workers = self.workers, []
        for w in workers:
            try:
                w.proc.kill()
            except OSError:
                pass
        for w in workers:
            try:
                w.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """Ask the workers to exit, then end them."""
        for w in self.workers:
            try:
                assert w.proc.stdin is not None
                write_frame(w.proc.stdin, ("exit",))
                w.proc.stdin.close()
            except (OSError, ValueError):
                pass
        for w in self.workers:
            try:
                w.proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
        self.terminate()


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def shared_pool() -> WorkerPool:
    """This process's worker pool (started on first use, closed at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkerPool()
            atexit.register(_POOL.close)
        return _POOL


def _exit_code(proc: subprocess.Popen) -> int | None:
    """A worker's exit code once its pipe closed: it may not be reaped yet, so wait for it
    briefly (0.5 s); None when it has still not exited."""
    try:
        return proc.wait(timeout=0.5)
    except subprocess.TimeoutExpired:  # still running: reported as None
        return proc.poll()
