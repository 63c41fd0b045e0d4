"""Split a load point over the client's worker processes, without knowing the protocol: which
requests each worker sends and when (gate.runners.client.workers runs the shares; vLLM's
serving benchmark keeps the arrival process and the concurrency semaphore apart from the
request function the same way, benchmarks/benchmark_serving.py).

  closed loop (request_rate None): `concurrency` slots (None: every request at once) split
      over the workers as evenly as they go; each slot takes the next request index, in
      order, as soon as its previous request ends (one shared queue of indices), so the
      order and the number in flight are the loop's whatever the split.
  open loop (request_rate set, e.g. gate.load.open.OpenLoop): request i is due at the
      start plus arrival_offsets(n)[i] (a strategy without arrival_offsets gets evenly
      spaced arrivals at 1/request_rate s), the arrivals dealt round-robin to the workers;
      with a concurrency cap each then waits for a free slot of one shared pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from gate.load.interface import LoadStrategy


@dataclass(frozen=True)
class Share:
    """One worker's part of a load point: `slots` (closed loop: streams it keeps in flight),
    or `arrivals` ((request index, perf_counter s due), open loop) and `capped` (each
    waits for a slot of the shared cap)."""

    slots: int = 0
    arrivals: tuple[tuple[int, float], ...] = ()
    capped: bool = False


def arrival_offsets(n: int, load: LoadStrategy) -> list[float]:
    """Seconds from the start at which an open loop's n requests are due."""
    arrivals = getattr(load, "arrival_offsets", None)
    if callable(arrivals):
        return list(arrivals(n))
    assert load.request_rate is not None
    return [i / load.request_rate for i in range(n)]


def split(n: int, load: LoadStrategy, workers: int, start_s: float) -> list[Share]:
    """The shares of `n` requests under `load` for at most `workers` workers (fewer when a
    closed loop has fewer slots), an open loop's arrivals counted from `start_s`
    (perf_counter s). Raises ValueError for n < 1, workers < 1 or a concurrency below 1."""
    if n < 1 or workers < 1:
        raise ValueError(f"need at least one request and one worker, got {n} and {workers}")
    if load.concurrency is not None and load.concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {load.concurrency}")
    if load.request_rate is None:
        slots = min(n, load.concurrency or n)
        workers = min(workers, slots)
        return [Share(slots=slots // workers + (k < slots % workers)) for k in range(workers)]
    due = [(i, start_s + off) for i, off in enumerate(arrival_offsets(n, load))]
    workers = min(workers, n)
    return [Share(arrivals=tuple(due[k::workers]), capped=load.concurrency is not None) for k in range(workers)]
