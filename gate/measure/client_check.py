"""Does the served client measure the server, or itself? Per request, how late the client
began it (schedule lag) and how late its worker's event loop ran while it was in flight
(loop lag): a request whose client delay exceeds measurement.max_client_lag_ms is *client
delayed*, and timing verdicts leave it out as they leave out contended requests (gate.rules.
kinds.metric). Per window (ClientCheck): the client's own figures and the validity of the
load run, each a warning that names what it saw:

- schedule lag and event-loop lag (median, p99, max), the workers' CPU (a worker near one
  CPU is saturated), requests delayed beyond the bound;
- client vs server token counts per request (usage.completion_tokens / tokens_predicted);
- the server's time to answer each request's headers (RequestRecord.server_headers_ms: from
  the request leaving to its response's headers, where they came before the first token): a
  thread-per-connection server under a burst holds requests in its accept queue, an API
  server validates and tokenizes before it streams; TTFT includes it, and it is the server's,
  not the client's;
- where the server times itself, gate's TTFT minus the server's: per request against
  llama.cpp's timings.prompt_ms (network, queueing and the client), per window against the
  means of vLLM's TTFT and inter-token-latency histograms; never below zero by more than
  the clock's resolution;
- an open loop's achieved request rate against the offered one (below 90%: the client or the
  server could not keep up, so the load was not the one offered);
- more requests in flight than the server admits (llama.cpp slots, vLLM max-num-seqs, where
  gate started the server): they queue at the server, and TTFT includes that queue;
- prefix-cache hits (llama.cpp timings.cache_n: prompt tokens the server did not compute);
- a window too short for steady state: fewer than STEADY_WINDOWS x the mean number in flight
  (Little's law: sum of E2EL / window duration), so ramp-up and drain are most of it;
- lockstep arrivals: most requests began within LOCKSTEP_MS of another (a closed loop of
  equal output lengths sends in waves), so TTFT measures bursts;
- bursts the client cannot separate: requests whose loop lag exceeded runner.burst_gap_ms,
  so tok/burst (the client's cross-check of acceptance) may split or merge steps;
- repetitions that disagree: the TTFT of the same runner, law and load point differs between
  repetitions beyond chance (Kruskal-Wallis, scipy.stats.kruskal, p < DISAGREE_P).

Pure functions of records.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gate.core.quantiles import order_statistic
from gate.records import RequestRecord, RunRecord

DEFAULT_MAX_CLIENT_LAG_MS = 10.0
SATURATED_CPU = 0.9  # a worker whose CPU time is over this share of its wall time could not keep up
MIN_ACHIEVED = 0.9  # an open loop that achieved less than this share of its offered rate did not run at it
TTFT_CLOCK_SLACK_MS = 1.0  # gate's TTFT may fall below the server's own prefill time by this much (clocks, rounding)
STEADY_WINDOWS = 3.0  # a window shorter than this many times the mean number in flight has no steady middle
LOCKSTEP_MS = 1.0  # requests that began closer than this are in step
LOCKSTEP_SHARE = 0.5  # beyond this share of requests in step, arrivals are in lockstep
UNSEPARATED_SHARE = 0.1  # beyond this share of requests with loop lag over burst_gap_ms, tok/burst is unreliable
DISAGREE_P = 1e-3  # repetitions whose TTFT differ at this p-value disagree
HEADERS_SHARE = 0.1  # a server whose headers took (median) over this share of the median TTFT: a warning


def client_delay_ms(r: RequestRecord) -> float | None:
    """The client's own delay of a request (ms): the larger of its schedule lag and its
    worker's event-loop lag while it was in flight; None where the client did not record
    them (in-process runs, reports from before)."""
    lags = [x for x in (r.schedule_lag_ms, r.loop_lag_ms) if x is not None]
    return max(lags) if lags else None


def is_client_delayed(r: RequestRecord, max_client_lag_ms: float | None) -> bool:
    """Whether the client delayed `r` beyond `max_client_lag_ms` (None: never)."""
    if max_client_lag_ms is None:
        return False
    delay = client_delay_ms(r)
    return delay is not None and delay > max_client_lag_ms


def describe_delayed(delayed: int, total: int, unit: str, max_client_lag_ms: float) -> str:
    """ "client delayed: schedule or event-loop lag over 10 ms on 3 of 24 requests"."""
    return f"client delayed: schedule or event-loop lag over {max_client_lag_ms:g} ms on {delayed} of {total} {unit}"


@dataclass
class ClientCheck:
    """The served client's check of itself over one window (one runner, law, load point and
    repetition). Lags in ms; `worker_cpu_max`: the busiest worker's CPU time over its wall
    time; `delayed`: requests over `max_client_lag_ms`; `token_mismatches`: requests whose
    token count differs from the server's; `ttft_minus_server_prefill_ms`: median of gate's
    TTFT minus the server's own prefill time (None: the server gives none);
    `server_headers_p50_ms` / `server_headers_p99_ms`: the server's time to answer the
    requests' headers (None: its headers came with the first token, or not served);
    `ttft_minus_server_ms` / `itl_minus_server_ms`: gate's mean TTFT / ITL minus the
    server's own over the window (vLLM's histograms; None where it keeps none); `achieved_rate`
    / `offered_rate`: requests/s (open loop); `bursts_separable`: whether the client's
    timing can tell bursts apart (tok/burst); `warnings`: what defeats or weakens timing
    verdicts, each naming its evidence."""

    runner: str
    law: str
    load: str
    repetition: int | None
    requests: int
    workers: int
    max_client_lag_ms: float | None
    schedule_lag_p50_ms: float | None
    schedule_lag_p99_ms: float | None
    schedule_lag_max_ms: float | None
    loop_lag_p99_ms: float | None
    loop_lag_max_ms: float | None
    send_p50_ms: float | None
    connect_p50_ms: float | None
    worker_cpu_max: float | None
    delayed: int
    token_mismatches: int
    ttft_minus_server_prefill_ms: float | None
    ttft_minus_server_ms: float | None = None
    itl_minus_server_ms: float | None = None
    server_headers_p50_ms: float | None = None
    server_headers_p99_ms: float | None = None
    achieved_rate: float | None = None
    offered_rate: float | None = None
    bursts_separable: bool = True  # False: the client's loop lag exceeded burst_gap_ms on too many requests
    warnings: list[str] = field(default_factory=list)


def _load_name(w: RunRecord) -> str:
    if w.load.request_rate is not None:  # as the load-point table labels it (gate.analysis.load_points.LoadPoint.label)
        return f"{w.load.request_rate:g} req/s"
    return f"c={w.load.concurrency}" if w.load.concurrency is not None else "unbounded"


def check_window(
    w: RunRecord,
    records: Sequence[RequestRecord],
    max_client_lag_ms: float | None,
    server_slots: int | None = None,
    burst_gap_ms: float | None = None,
) -> ClientCheck | None:
    """The ClientCheck of window `w` from its requests' records (None: the client recorded
    nothing of itself, an in-process run). `server_slots`: requests the server admits at
    once, where known; `burst_gap_ms`: the runner's burst rule (None: not checked)."""
    mine = [r for r in records if r.schedule_lag_ms is not None]
    if not mine:
        return None
    sched = [r.schedule_lag_ms for r in mine if r.schedule_lag_ms is not None]
    loop = [r.loop_lag_ms for r in mine if r.loop_lag_ms is not None]
    sends = [r.send_ms for r in mine if r.send_ms is not None]
    connects = [r.connect_ms for r in mine if r.connect_ms is not None]
    cpu = [x.cpu_share for x in w.client_workers if x.cpu_share is not None and x.requests]
    delayed = sum(is_client_delayed(r, max_client_lag_ms) for r in mine)
    mismatched = [r for r in mine if r.server_output_tokens is not None and r.server_output_tokens != r.output_tokens]
    gaps = [r.ttft_ms - r.server_prefill_ms for r in mine if r.server_prefill_ms is not None and r.token_times_ms]
    workers = len({r.client_worker for r in mine if r.client_worker is not None}) or len(w.client_workers)
    c = ClientCheck(
        w.runner,
        w.law,
        _load_name(w),
        w.repetition,
        len(mine),
        workers,
        max_client_lag_ms,
        order_statistic(sched, 0.5),
        order_statistic(sched, 0.99),
        max(sched, default=None),
        order_statistic(loop, 0.99),
        max(loop, default=None),
        order_statistic(sends, 0.5),
        order_statistic(connects, 0.5),
        max(cpu, default=None),
        delayed,
        len(mismatched),
        statistics.median(gaps) if gaps else None,
    )
    answered = [x for x in (r.server_headers_ms for r in mine) if x is not None]
    c.server_headers_p50_ms, c.server_headers_p99_ms = order_statistic(answered, 0.5), order_statistic(answered, 0.99)
    ttft_p50 = order_statistic([r.ttft_ms for r in mine if r.token_times_ms], 0.5)
    if c.server_headers_p50_ms is not None and ttft_p50 and c.server_headers_p50_ms > HEADERS_SHARE * ttft_p50:
        c.warnings.append(
            f"the server answered the requests' headers a median {c.server_headers_p50_ms:.1f} ms (p99 "
            f"{c.server_headers_p99_ms:.1f} ms) after they left, of a median TTFT of {ttft_p50:.1f} ms, over "
            f"{len(answered)} requests: the server's time before it streamed (its accept queue, its threads, its "
            "request handling), not the client's, and TTFT includes it"
        )
    if delayed and max_client_lag_ms is not None:
        c.warnings.append(
            describe_delayed(delayed, len(mine), "requests", max_client_lag_ms) + ": timing verdicts leave them out"
        )
    if c.worker_cpu_max is not None and c.worker_cpu_max > SATURATED_CPU:
        c.warnings.append(
            f"a client worker was saturated ({c.worker_cpu_max:.0%} of one CPU over the window): raise "
            "runner.client_workers or give gate more CPUs"
        )
    if mismatched:
        r = mismatched[0]
        c.warnings.append(
            f"client and server token counts differ on {len(mismatched)} of {len(mine)} requests (e.g. "
            f"{r.prompt_id}: gate read {r.output_tokens}, the server counted {r.server_output_tokens})"
        )
    if w.server_ttft_mean_ms is not None:
        ttfts = [r.ttft_ms for r in mine if r.token_times_ms]
        if ttfts:
            c.ttft_minus_server_ms = statistics.fmean(ttfts) - w.server_ttft_mean_ms
    if w.server_itl_mean_ms is not None:
        itls = [x for r in mine for x in r.itl_ms]
        if itls:
            c.itl_minus_server_ms = statistics.fmean(itls) - w.server_itl_mean_ms
    if c.ttft_minus_server_ms is not None and c.ttft_minus_server_ms < -TTFT_CLOCK_SLACK_MS:
        c.warnings.append(
            f"gate's mean TTFT is {-c.ttft_minus_server_ms:.1f} ms below the server's own "
            f"({w.server_ttft_mean_ms:.1f} ms, its histogram): the client's clock or the server's is off"
        )
    under = [g for g in gaps if g < -TTFT_CLOCK_SLACK_MS]
    if under:
        c.warnings.append(
            f"gate's TTFT is below the server's own prefill time on {len(under)} of {len(gaps)} requests "
            f"(by up to {-min(under):.1f} ms): the client's clock or the server's timings are off"
        )
    if w.load.request_rate is not None:
        # Begun against due, over the same requests: the arrivals drawn (Poisson or gamma) are
        # the offer, so a short window's draw is not mistaken for a client that fell behind.
        c.offered_rate = w.load.request_rate
        begun = sorted(r.started_s for r in mine if r.started_s is not None)
        due = sorted(r.started_s - (r.queue_ms or 0.0) / 1e3 for r in mine if r.started_s is not None)
        if len(begun) > 2 and begun[-1] > begun[0] and due[-1] > due[0]:
            c.achieved_rate = (len(begun) - 1) / (begun[-1] - begun[0])
            scheduled = (len(due) - 1) / (due[-1] - due[0])
            if c.achieved_rate < MIN_ACHIEVED * scheduled:
                c.warnings.append(
                    f"achieved {c.achieved_rate:.2f} requests/s against the {scheduled:.2f}/s of its "
                    f"scheduled arrivals ({c.achieved_rate / scheduled:.0%}; offered {c.offered_rate:g}/s): "
                    "the load was not the one offered (requests waited for a slot of the cap, or for "
                    "the client)"
                )
    in_flight = w.load.concurrency
    if server_slots is not None and in_flight is not None and in_flight > server_slots:
        c.warnings.append(
            f"{in_flight} requests in flight, the server admits {server_slots} at once: the rest queue at "
            "the server and their TTFT includes that queue"
        )
    cached = [r for r in mine if r.server_cached_tokens]
    if cached:
        c.warnings.append(
            f"prefix-cache hits on {len(cached)} of {len(mine)} requests "
            f"({sum(r.server_cached_tokens or 0 for r in cached)} "
            "prompt tokens the server did not compute): their TTFT flatters the server"
        )
    elif w.server_cached_tokens:
        c.warnings.append(
            f"prefix-cache hits: the server took {w.server_cached_tokens} prompt tokens from its prefix "
            "cache over the window (vllm:prefix_cache_hits): their TTFT flatters the server"
        )
    busy_s = sum(r.e2el_ms for r in mine) / 1e3
    if w.duration_s > 0 and busy_s > 0:
        in_flight_mean = busy_s / w.duration_s
        if len(mine) < STEADY_WINDOWS * max(1.0, in_flight_mean):
            c.warnings.append(
                f"window too short for steady state: {len(mine)} requests with {in_flight_mean:.1f} in flight "
                f"on average (at least {STEADY_WINDOWS * max(1.0, in_flight_mean):.0f} give a steady middle; "
                "ramp-up and drain are most of it)"
            )
    starts = sorted(r.started_s for r in mine if r.started_s is not None)
    if len(starts) >= 4 and (w.load.concurrency or 0) != 1:
        near = sum(
            1
            for k, t in enumerate(starts)
            if (k > 0 and t - starts[k - 1] < LOCKSTEP_MS / 1e3)
            or (k + 1 < len(starts) and starts[k + 1] - t < LOCKSTEP_MS / 1e3)
        )
        if near / len(starts) > LOCKSTEP_SHARE:
            c.warnings.append(
                f"lockstep arrivals: {near} of {len(starts)} requests began within {LOCKSTEP_MS:g} ms of "
                "another, so the load arrives in waves and TTFT measures bursts (equal output lengths in "
                "a closed loop; an open loop, load.request_rate, spreads arrivals)"
            )
    if burst_gap_ms is not None:
        unseparated = [r for r in mine if r.loop_lag_ms is not None and r.loop_lag_ms > burst_gap_ms]
        if len(unseparated) > UNSEPARATED_SHARE * len(mine):
            c.bursts_separable = False
            c.warnings.append(
                f"the client's timing cannot separate bursts on {len(unseparated)} of {len(mine)} requests "
                f"(event-loop lag above runner.burst_gap_ms, {burst_gap_ms:g} ms): tok/burst may split or "
                "merge verification steps and is no cross-check of acceptance here"
            )
    return c


def disagreement(windows: Sequence[tuple[RunRecord, Sequence[RequestRecord]]]) -> str | None:
    """A warning when the repetitions of one runner, law and load point (`windows`: each
    window with its requests) disagree on TTFT beyond chance (Kruskal-Wallis H test,
    scipy.stats.kruskal; Kruskal & Wallis 1952), None otherwise or with fewer than 2
    repetitions of 3 requests."""
    from scipy import stats

    groups = [[r.ttft_ms for r in reqs if r.token_times_ms] for _, reqs in windows]
    groups = [g for g in groups if len(g) >= 3]
    if len(groups) < 2 or len({x for g in groups for x in g}) < 2:
        return None
    p = float(stats.kruskal(*groups).pvalue)
    if not p < DISAGREE_P:
        return None
    medians = ", ".join(f"{statistics.median(g):.1f}" for g in groups)
    return (
        f"repetitions disagree: TTFT medians {medians} ms over {len(groups)} repetitions (Kruskal-Wallis p = {p:.1g}): "
        "the machine, the load or the server changed between them"
    )


def client_checks(
    runs: Iterable[RunRecord],
    requests: Sequence[RequestRecord],
    max_client_lag_ms: float | None,
    slots: dict[str, int] | None = None,
    burst_gap_ms: float | None = None,
) -> list[ClientCheck]:
    """A ClientCheck per served window of `runs` that the client recorded (its requests:
    those of `requests` with the window's runner, law, load point and repetition);
    `slots`: runner -> requests its server admits at once, where known; `burst_gap_ms`:
    the runner's burst rule. Repetitions that disagree warn on the last of them."""
    out: list[ClientCheck] = []
    groups: dict[
        tuple[str, str, int | None, float | None], list[tuple[RunRecord, list[RequestRecord], ClientCheck]]
    ] = {}
    for w in runs:
        # requests carry a load point's labels (gate.load.points.point_of): an open loop's rate
        # alone, its cap (the window's concurrency) not
        conc = w.load.concurrency if w.load.request_rate is None else None
        mine = [
            r
            for r in requests
            if r.draft == w.runner
            and r.law == w.law
            and r.concurrency == conc
            and r.request_rate == w.load.request_rate
            and (w.repetition is None or r.repetition == w.repetition)
        ]
        c = check_window(w, mine, max_client_lag_ms, (slots or {}).get(w.runner), burst_gap_ms)
        if c is not None:
            out.append(c)
            groups.setdefault((w.runner, w.law, w.load.concurrency, w.load.request_rate), []).append((w, mine, c))
    for group in groups.values():
        if (text := disagreement([(w, mine) for w, mine, _ in group])) is not None:
            group[-1][2].warnings.append(text)
    return out
