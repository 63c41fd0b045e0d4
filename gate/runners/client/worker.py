"""A client worker process: one event loop, its own connections, a share of a load point's
requests (gate.runners.client.workers drives several). It sends, stamps the bytes as they
arrive and hands them back raw (gate.runners.client.transfer); it parses nothing.

    python -m gate.runners.client.worker INDEX_FD SLOT_READ_FD SLOT_WRITE_FD

Frames (4-byte big-endian length, then a pickle) on stdin: ("job", Job), ("stop", job_id):
begin nothing more of that job (its requests not yet begun come back as NOT_SENT), ("go",
job_id): after a transport failure, the slot that had it may send again (gate's breaker,
which counts the failures of every worker, is still closed), ("exit",).
On stdout: ("ready", pid) once primed, then per job ("result", job_id, index, RawStream |
ServedError | NOT_SENT) as each request ends and ("done", job_id, gate.records.ClientWorkerRecord).

Shared with the other workers (inherited file descriptors, O_NONBLOCK set by the pool):
  the index pipe: a closed loop's request indices, 4 bytes each; a slot takes the next as
      its previous request ends (a pipe read of 4 bytes is atomic: each index is taken once,
      in order, by whichever worker's slot is free first);
  the slot pipe: an open loop's concurrency cap, one 8-byte token per free slot holding
      the perf_counter time it came free (the request that takes it is due from then).

Each worker also runs a timer due every TICK_S and keeps how late it ran (event-loop lag):
a request's loop_lag_ms is the largest lag while it was in flight, how late a byte's
arrival could have been stamped. Its CPU time over the job is in its ClientWorkerRecord.
"""

from __future__ import annotations

import asyncio
import io
import os
import pickle
import signal
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, BinaryIO

from gate.core.quantiles import order_statistic
from gate.records import ClientWorkerRecord
from gate.runners.client.protocol import PROTOCOLS
from gate.runners.client.transfer import RawStream, Transfer
from gate.runners.client.transport import TRANSPORT_KINDS, ServedError
from gate.runners.client.wire import Connections

TICK_S = 0.002  # the event-loop lag timer's period (s)
NOT_SENT = "not_sent"  # a request the worker did not begin: its job was stopped (the breaker opened)


@dataclass(frozen=True)
class Job:
    """One load point's share for one worker. `bodies`: request index -> JSON body (every
    request's, for a closed loop: any slot may take any index); `slots`: a closed loop's
    streams this worker keeps in flight (each takes the next index from the index pipe);
    `arrivals`: an open loop's (index, perf_counter s due) for this worker, `capped`: each
    waits for a token of the slot pipe; `start_s`: perf_counter s the closed loop's slots
    begin (every worker's at once)."""

    job_id: int
    worker: int
    runner: str
    url: str
    api: str
    headers: dict[str, str]
    timeout_s: float
    bodies: dict[int, bytes]
    start_s: float = 0.0
    slots: int = 0
    arrivals: tuple[tuple[int, float], ...] = ()
    capped: bool = False


# What a frame may hold besides plain data (tuples, lists, dicts, bytes, str, numbers): the
# frames pass only between gate's process and its own workers, over pipes gate made, and
# anything else in one is refused rather than built (no pickle of arbitrary classes).
FRAME_CLASSES = frozenset(
    {
        ("gate.runners.client.worker", "Job"),
        ("gate.runners.client.transfer", "RawStream"),
        ("gate.records.windows", "ClientWorkerRecord"),
        ("gate.runners.client.transport", "ServedError"),
    }
)


class _FrameUnpickler(pickle.Unpickler):
    """An unpickler that builds only FRAME_CLASSES (and frozensets); any other global is an
    UnpicklingError."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in FRAME_CLASSES or (module, name) == ("builtins", "frozenset"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a client frame may not hold {module}.{name}")


def loads_frame(data: bytes) -> Any:
    """The object of one frame's payload (only FRAME_CLASSES and plain data).
    Raises pickle.UnpicklingError for anything else."""
    return _FrameUnpickler(io.BytesIO(data)).load()


def write_frame(out: BinaryIO, obj: Any) -> None:
    """One frame (length-prefixed pickle) on `out`, flushed."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()


def _exactly(inp: BinaryIO, n: int) -> bytes | None:
    """`n` bytes from `inp` (a pipe may return fewer per read); None at end of file."""
    parts, got = [], 0
    while got < n:
        part = inp.read(n - got)
        if not part:
            return None
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def read_frame(inp: BinaryIO) -> Any:
    """The next frame from `inp`; None at end of file."""
    head = _exactly(inp, 4)
    if head is None:
        return None
    data = _exactly(inp, struct.unpack(">I", head)[0])
    return None if data is None else loads_frame(data)


class Lag:
    """The event loop's lag: a timer due every TICK_S, how late each ran (s)."""

    def __init__(self) -> None:
        self.lags: list[float] = []

    async def run(self) -> None:
        due = time.perf_counter() + TICK_S
        while True:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            now = time.perf_counter()
            self.lags.append(max(0.0, now - due))
            due = now + TICK_S

    def since(self, mark: int) -> float:
        """The largest lag (ms) of the timers run since len(self.lags) was `mark` (0 when none)."""
        return max(self.lags[mark:], default=0.0) * 1e3

    def stats(self) -> tuple[float, float, float]:
        """Median, 99th percentile and max lag in ms (0s without a timer)."""
        median, p99 = order_statistic(self.lags, 0.5), order_statistic(self.lags, 0.99)
        if median is None or p99 is None:
            return 0.0, 0.0, 0.0
        return median * 1e3, p99 * 1e3, max(self.lags) * 1e3


class Slots:
    """The slot pipe's tokens, waited for on this worker's loop first come first served."""

    def __init__(self, fd: int, write_fd: int):
        self.fd, self.write_fd = fd, write_fd
        self.waiters: deque[asyncio.Future[float]] = deque()
        self.watching = False

    def _take(self) -> float | None:
        try:
            data = os.read(self.fd, 8)
        except BlockingIOError:
            return None
        return struct.unpack("d", data)[0]

    async def acquire(self) -> float:
        """A free slot: the perf_counter time it came free."""
        if not self.waiters:
            token = self._take()
            if token is not None:
                return token
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        self.waiters.append(fut)
        if not self.watching:
            loop.add_reader(self.fd, self._readable)
            self.watching = True
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())  # taken for a waiter that left: back to the others
            raise

    def _readable(self) -> None:
        while self.waiters:
            if self.waiters[0].done():
                self.waiters.popleft()
                continue
            token = self._take()
            if token is None:
                return
            self.waiters.popleft().set_result(token)
        asyncio.get_running_loop().remove_reader(self.fd)
        self.watching = False

    def release(self, at_s: float) -> None:
        """Free a slot, due to the next request from `at_s`."""
        os.write(self.write_fd, struct.pack("d", at_s))


def take_index(fd: int) -> int | None:
    """The closed loop's next request index from the index pipe (None: none left)."""
    try:
        data = os.read(fd, 4)
    except BlockingIOError:
        return None
    return struct.unpack(">I", data)[0] if len(data) == 4 else None


async def run_job(job: Job, index_fd: int, slot_fds: tuple[int, int], stdin_fd: int, out: BinaryIO) -> None:
    """Run `job` to its end, writing a result frame per request and the done frame. A
    ("stop", job_id) frame on stdin stops it: what has not begun comes back NOT_SENT."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    go = asyncio.Semaphore(0)  # gate's verdicts after transport failures: go on (the breaker is still closed)
    pending = bytearray()

    def control() -> None:
        """Frames on stdin during the job: a stop of this job, or the end of gate's process."""
        try:
            data = os.read(stdin_fd, 65536)
        except BlockingIOError:
            return
        if not data:  # gate's process is gone: nobody waits for these results
            os._exit(0)
        pending.extend(data)
        while len(pending) >= 4:
            (n,) = struct.unpack(">I", pending[:4])
            if len(pending) < 4 + n:
                return
            msg = loads_frame(bytes(pending[4 : 4 + n]))
            del pending[: 4 + n]
            if msg[0] == "exit" or (msg[0] == "stop" and msg[1] == job.job_id):
                stopped.set()
            elif msg[0] == "go" and msg[1] == job.job_id:
                go.release()

    loop.add_reader(stdin_fd, control)
    lag = Lag()
    ticker = asyncio.ensure_future(lag.run())
    wall0, cpu0 = time.perf_counter(), time.process_time()
    transfer = Transfer(
        job.runner, job.url, PROTOCOLS[job.api], {**job.headers, "Content-Type": "application/json"}, job.timeout_s
    )
    conns = Connections(job.url)
    begun = 0

    def emit(i: int, result: Any) -> None:
        write_frame(out, ("result", job.job_id, i, result))

    async def one(i: int, scheduled_s: float, due_s: float) -> tuple[float, bool]:
        """Send request i; the perf_counter time it ended, and whether gate granted its slot
        one more request after a transport failure (a go)."""
        nonlocal begun
        begun += 1
        mark = len(lag.lags)
        try:
            raw: Any = await transfer.send(conns, job.bodies[i], scheduled_s, due_s)
            raw.loop_lag_ms, raw.worker, raw.index = lag.since(mark), job.worker, i
        except ServedError as e:
            raw = e
        except Exception as e:  # noqa: BLE001 - a request's failure is its result, never the worker's end
            raw = ServedError(job.runner, job.url, f"client error: {type(e).__name__}: {e}")
        emit(i, raw)
        granted = False
        if isinstance(raw, ServedError) and raw.kind in TRANSPORT_KINDS and not stopped.is_set():
            # The breaker counts failures over every worker, in gate's process: wait for its verdict
            # before this slot sends again (a go, or the stop), so a failing server is not sent more.
            # A go that came before the stop still stands: that request was due while the breaker was closed.
            taking = asyncio.ensure_future(go.acquire())
            stopping = asyncio.ensure_future(stopped.wait())
            await asyncio.wait({taking, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if taking.done() and not taking.cancelled():
                granted = True
            else:
                taking.cancel()
                if not go.locked():
                    await go.acquire()
                    granted = True
        return (raw.end_s if isinstance(raw, RawStream) else time.perf_counter()), granted

    async def slot() -> None:
        due, granted = (
            job.start_s,
            False,
        )  # the first request is due at the loop's start, each next one as its previous ended
        while granted or not stopped.is_set():
            i = take_index(index_fd)
            if i is None:
                return
            due, granted = await one(i, time.perf_counter(), due)

    async def arrival(i: int, at_s: float, slots: Slots | None) -> None:
        wait = asyncio.ensure_future(stopped.wait())
        try:
            delay = at_s - time.perf_counter()
            if delay > 0:
                await asyncio.wait({wait}, timeout=delay)
            if stopped.is_set():
                emit(i, NOT_SENT)
                return
            due = at_s
            if slots is not None:
                take = asyncio.ensure_future(slots.acquire())
                await asyncio.wait({take, wait}, return_when=asyncio.FIRST_COMPLETED)
                if not take.done():
                    take.cancel()
                    await asyncio.wait({take})
                    emit(i, NOT_SENT)
                    return
                due = max(at_s, take.result())
            end_s = None
            try:
                end_s, _ = await one(i, at_s, due)
            finally:
                if slots is not None:  # free from when the request ended, not from when its result was written
                    slots.release(end_s if end_s is not None else time.perf_counter())
        finally:
            wait.cancel()

    try:
        if job.slots:
            await asyncio.sleep(max(0.0, job.start_s - time.perf_counter()))
            await asyncio.gather(*(slot() for _ in range(job.slots)))
        else:
            slots = Slots(*slot_fds) if job.capped else None
            await asyncio.gather(*(arrival(i, at, slots) for i, at in job.arrivals))
    finally:
        ticker.cancel()
        loop.remove_reader(stdin_fd)
        os.set_blocking(stdin_fd, True)  # an event loop may leave a watched fd non-blocking (uvloop does)
        conns.close()
    p50, p99, mx = lag.stats()
    write_frame(
        out,
        (
            "done",
            job.job_id,
            ClientWorkerRecord(
                job.worker, time.perf_counter() - wall0, time.process_time() - cpu0, begun, p50, p99, mx, len(lag.lags)
            ),
        ),
    )


async def prime() -> None:
    """One streamed request to a server of this process's own, so that the client's first
    timed request does not pay for the imports and set-up of a first use (tens of ms)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"a\r\ndata: {}\n\n\r\n0\r\n\r\n"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    conns = Connections(url)
    await Transfer("prime", url, PROTOCOLS["completions"], {}).send(
        conns, b"{}", time.perf_counter(), time.perf_counter()
    )
    conns.close()
    server.close()
    await server.wait_closed()


def event_loop_runner() -> Any:
    """asyncio.run on uvloop's event loop where uvloop is installed (Linux, macOS: its
    loop wakes and reads sockets in C, so a byte's stamp waits less), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def main(argv: list[str]) -> int:
    """Serve jobs from stdin until ("exit",) or its end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # gate's own process handles an interrupt and stops its workers
    run = event_loop_runner()
    try:
        run(prime())
    except Exception as e:  # noqa: BLE001 - priming is an optimisation; the jobs will say what fails
        print(f"priming the client failed: {type(e).__name__}: {e}", file=sys.stderr)
    index_fd, slot_fds = int(argv[0]), (int(argv[1]), int(argv[2]))
    stdin_fd = sys.stdin.fileno()
    inp = os.fdopen(os.dup(stdin_fd), "rb", buffering=0)
    out = sys.stdout.buffer
    write_frame(out, ("ready", os.getpid()))
    while True:
        msg = read_frame(inp)
        if msg is None or msg[0] == "exit":
            return 0
        if msg[0] == "job":
            run(run_job(msg[1], index_fd, slot_fds, stdin_fd, out))


if __name__ == "__main__":
    # Run from the module imported by its name, so that what it pickles (its Slots, Job) is
    # gate.runners.client.worker's and not __main__'s.
    from gate.runners.client.worker import main as _main

    sys.exit(_main(sys.argv[1:]))
