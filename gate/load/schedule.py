"""Drive a load: send requests 0..n-1 as a LoadStrategy says, without knowing the protocol.

The send function (one request, given its index and the time.perf_counter() it was
scheduled at) belongs to the runner; this module only decides when each send starts (vLLM's
serving benchmark keeps the arrival process and the concurrency semaphore apart from the
request function the same way, benchmarks/benchmark_serving.py). A runner measures queue
time as its send time minus the scheduled time.

  closed loop (request_rate None): `concurrency` workers (None: all at once) take the next
      index in order as soon as their previous request ends; scheduled = the time it is taken.
  open loop (request_rate set, e.g. gate.load.open.OpenLoop): request i is scheduled at the
      window start plus arrival_offsets(n)[i] (a strategy without arrival_offsets gets
      evenly spaced arrivals at 1/request_rate s); with a concurrency cap it then waits for
      a free slot, first come first served.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar, Union

from gate.load.interface import LoadStrategy

R = TypeVar("R")  # what one request gives (a runner's StreamResult, gate.runners.interface)


async def drive(n: int, load: LoadStrategy, send: Callable[[int, float], Awaitable[R]],
                done: Callable[[int, Union[R, Exception]], None] | None = None) -> list[Union[R, Exception]]:
    """Run send(i, scheduled_s) for i in 0..n-1 under `load` (`scheduled_s`: the
    time.perf_counter() the request was scheduled at); return the results in index
    order. An Exception raised by send(i) becomes request i's result (the others go on);
    BaseExceptions (KeyboardInterrupt, cancellation) propagate. `done(i, result)` is called
    as each request ends. Raises ValueError for n < 0 or a concurrency below 1."""
    if n < 0:
        raise ValueError(f"number of requests must be >= 0, got {n}")
    if load.concurrency is not None and load.concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {load.concurrency}")
    results: list[Union[R, Exception, None]] = [None] * n
    if n == 0:
        return []

    async def one(i: int, scheduled_s: float) -> None:
        try:
            result: Union[R, Exception] = await send(i, scheduled_s)
        except Exception as e:  # noqa: BLE001 - the request's result; the others go on
            result = e
        results[i] = result
        if done is not None:
            done(i, result)

    if load.request_rate is None:
        await _closed(n, load.concurrency, one)
    else:
        await _open(n, load, one)
    return [r if r is not None else RuntimeError(f"request {i} produced no result") for i, r in enumerate(results)]


async def _closed(n: int, concurrency: int | None, one: Callable[[int, float], Awaitable[None]]) -> None:
    next_index = iter(range(n))

    async def worker() -> None:
        for i in next_index:  # shared iterator: each index is taken once, in order
            await one(i, time.perf_counter())

    workers = min(n, concurrency or n)
    await _gather([worker() for _ in range(workers)])


def _offsets_s(n: int, load: LoadStrategy) -> list[float]:
    arrivals = getattr(load, "arrival_offsets", None)
    if callable(arrivals):
        return list(arrivals(n))
    assert load.request_rate is not None
    return [i / load.request_rate for i in range(n)]


async def _open(n: int, load: LoadStrategy, one: Callable[[int, float], Awaitable[None]]) -> None:
    offsets_s = _offsets_s(n, load)
    slots = asyncio.Semaphore(load.concurrency) if load.concurrency is not None else None

    async def capped(i: int, scheduled_s: float) -> None:
        if slots is None:
            await one(i, scheduled_s)
            return
        async with slots:
            await one(i, scheduled_s)

    start_s = time.perf_counter()
    tasks: list[asyncio.Task[None]] = []
    try:
        for i, offset_s in enumerate(offsets_s):
            scheduled_s = start_s + offset_s
            delay_s = scheduled_s - time.perf_counter()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            tasks.append(asyncio.ensure_future(capped(i, scheduled_s)))
        await _gather(tasks)
    finally:
        for t in tasks:
            t.cancel()


async def _gather(aws: list) -> None:
    """Await all; on the first BaseException cancel the rest and re-raise it."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
