"""Is the machine contended? Per request: the process's CPU time and the machine's CPU
pressure over the request's wall time; a request whose wall time was too often spent
waiting for a CPU is *contended*, and timing verdicts must not rest on it.

Signals, best first:
- Linux pressure stall information, `/proc/pressure/cpu` ("some" line, cumulative `total`
  in microseconds): the time at least one runnable task waited for a CPU. Its increase over
  a request divided by the request's wall time is the share of wall time without CPU for
  someone (gate's own threads included: with more compute threads than CPUs gate contends
  with itself, and is told so).
- Without it (macOS, old kernels, some containers): the 1-minute load average against the
  CPU count, `1 - cpus / load` when the load exceeds the CPUs (the share of runnable demand
  that cannot be served). It lags by about a minute, so it is a coarse fallback.
- The process's CPU time (user + system, all threads) over wall time x compute threads is
  recorded beside them (`cpu_share`); it is a diagnostic, not a classifier: a quiet run
  already leaves threads idle between kernels (Python, sampling, synchronisation).

Pure functions of records and texts, plus `Probe`, which reads the clocks and files.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gate.records import RequestRecord

PSI_CPU = Path("/proc/pressure/cpu")


@dataclass(frozen=True)
class Pressure:
    """One reading of /proc/pressure/cpu's "some" line: 10 s average (%) and cumulative total (us)."""

    avg10: float
    total_us: int


def parse_pressure(text: str) -> Pressure | None:
    """The "some" line of a /proc/pressure/cpu text, e.g.
    "some avg10=0.39 avg60=0.16 avg300=0.03 total=1398539"; None when it has none."""
    for line in text.splitlines():
        kind, *fields = line.split()
        if kind != "some":
            continue
        values = dict(f.split("=", 1) for f in fields if "=" in f)
        try:
            return Pressure(float(values["avg10"]), int(values["total"]))
        except (KeyError, ValueError):
            return None
    return None


def read_pressure(path: Path = PSI_CPU) -> Pressure | None:
    """The machine's CPU pressure now, None where the kernel does not provide it."""
    try:
        return parse_pressure(path.read_text())
    except OSError:
        return None


def load_average() -> float | None:
    """The 1-minute load average, None where the platform has none."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return None


PROC_STAT = Path("/proc/stat")


def runnable_elsewhere(samples: int = 20, interval_s: float = 0.01, stat: Path = PROC_STAT) -> float | None:
    """How many other tasks want a CPU now: the median over `samples` reads, `interval_s` apart,
    of /proc/stat's procs_running (the runnable tasks, the reading thread among them) less the
    reader itself. Call it while this process computes nothing else. None where /proc/stat
    cannot be read (not Linux)."""
    seen: list[int] = []
    for i in range(samples):
        try:
            text = stat.read_text()
        except OSError:
            return None
        found = re.search(r"^procs_running\s+(\d+)", text, re.MULTILINE)
        if found is None:
            return None
        seen.append(int(found.group(1)) - 1)
        if i + 1 < samples:
            time.sleep(interval_s)
    seen.sort()
    return float(max(0, seen[len(seen) // 2]))


CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def cpu_quota(path: Path = CGROUP_CPU_MAX) -> int | None:
    """The CPUs this process's cgroup (v2) may use, rounded up: its cpu.max quota over its
    period (a container limited to "150000 100000" gets 2); None without a quota ("max"), or
    where the file is missing or unreadable."""
    try:
        quota, _, period = path.read_text().strip().partition(" ")
    except OSError:
        return None
    if quota == "max" or not quota.isdigit() or not period.strip().isdigit() or int(period) <= 0:
        return None
    return max(1, -(-int(quota) // int(period)))


def fitted_threads(cpus: int, elsewhere: float | None, most: int) -> int:
    """Compute threads for the CPUs this process can get: its `cpus` less the ones `elsewhere`
    other runnable tasks keep busy (rounded), at least 1 and at most `most` (the threads it was
    given). Two threads on the one core a steady neighbour leaves run about 10x slower than
    one there (issue 42: a SmolLM2-width matmul loop at 14.3 against 87.3 iterations/s).
    `elsewhere` None (unknown): `most`."""
    if elsewhere is None:
        return max(1, most)
    return max(1, min(most, cpus - round(elsewhere)))


def load_stall_share(load: float | None, cpus: int | None) -> float | None:
    """The share of runnable demand that cannot be served when `load` tasks want `cpus` CPUs."""
    if load is None or not cpus:
        return None
    return max(0.0, 1.0 - cpus / load) if load > 0 else 0.0


@dataclass
class Reading:
    """What a Probe measured over one window (a request)."""

    wall_ms: float
    cpu_time_ms: float
    cpu_stall_ms: float | None  # None without /proc/pressure/cpu
    load_avg_1m: float | None


class Probe:
    """Measures a window: process CPU time and the machine's CPU pressure before and after."""

    def __init__(self, psi: Path = PSI_CPU):
        self.psi = psi
        self.available = read_pressure(psi) is not None

    def start(self) -> tuple[float, float, Pressure | None]:
        return time.perf_counter(), time.process_time(), read_pressure(self.psi) if self.available else None

    def stop(self, started: tuple[float, float, Pressure | None]) -> Reading:
        wall0, cpu0, p0 = started
        p1 = read_pressure(self.psi) if self.available else None
        cpu1, wall1 = time.process_time(), time.perf_counter()
        stall = (p1.total_us - p0.total_us) / 1e3 if p0 is not None and p1 is not None else None
        return Reading((wall1 - wall0) * 1e3, (cpu1 - cpu0) * 1e3, stall, load_average())


def stall_share(record: RequestRecord, cpus: int | None = None) -> float | None:
    """The share of a request's wall time that some runnable task waited for a CPU: from
    /proc/pressure/cpu when it was recorded, else estimated from the load average; None
    when neither was recorded (records from older reports, synthetic records)."""
    wall, stall = record.e2el_ms, record.cpu_stall_ms
    if stall is not None and wall > 0:
        return min(1.0, max(0.0, float(stall) / float(wall)))
    return load_stall_share(record.load_avg_1m, cpus)


def cpu_share(record: RequestRecord) -> float | None:
    """Process CPU time over wall time x compute threads (1.0: every thread busy throughout)."""
    cpu, threads, wall = record.cpu_time_ms, record.threads, record.e2el_ms
    if cpu is None or not threads or wall <= 0:
        return None
    return float(cpu) / (float(wall) * float(threads))


def is_contended(record: RequestRecord, max_cpu_stall: float | None, cpus: int | None = None) -> bool:
    """Whether a request's stalled share of wall time exceeds `max_cpu_stall` (None: never)."""
    if max_cpu_stall is None:
        return False
    share = stall_share(record, cpus)
    return share is not None and share > max_cpu_stall


def pooled_stall_share(records: Iterable[RequestRecord], cpus: int | None = None) -> float | None:
    """The stalled share of the records' summed wall time (each weighted by its wall time)."""
    wall = stalled = 0.0
    for r in records:
        share = stall_share(r, cpus)
        if share is not None:
            wall += r.e2el_ms
            stalled += share * r.e2el_ms
    return stalled / wall if wall > 0 else None


def describe(share: float | None, contended: int, total: int, unit: str) -> str:
    """ "machine contended: 40% of wall time without CPU on 18 of 24 paired requests"."""
    pct = f"{share:.0%} of wall time without CPU" if share is not None else "CPU pressure"
    return f"machine contended: {pct} on {contended} of {total} {unit}"


# Defaults of policy.measurement's contention fields (see docs/concepts/contention.md and gate.policy.model).
DEFAULT_MAX_CPU_STALL = 0.1
DEFAULT_MAX_CONTENDED = 0.5
DEFAULT_CONTENTION_RERUNS = 2
DEFAULT_CONTENTION_RERUN_BUDGET = 0.5  # reruns may add at most half the first attempts' time: 1.5x the run without them
# Reruns stop for good once this many consecutive cells stayed contended (first attempt and every
# rerun), or once at least twice this many cells were rerun and as many stayed contended as came out clean.
BUSY_CELLS = 3


@dataclass(frozen=True)
class Handling:
    """What to do about contended requests while measuring (policy.measurement):
    `max_cpu_stall` the stalled share above which a request is contended (None: never),
    `reruns` how often a cell (the fallback and every draft) with a contended request is rerun,
    `rerun_budget` the largest share of the first attempts' time that reruns may add (0.5:
    a busy run takes at most 1.5x the time of the same run without reruns)."""

    max_cpu_stall: float | None = None
    reruns: int = 0
    cpus: int | None = None
    rerun_budget: float = DEFAULT_CONTENTION_RERUN_BUDGET


@dataclass
class RerunBudget:
    """Whether a contended cell is worth rerunning, as the run goes: reruns help against a
    passing burst of load, not against a machine that stays busy, and they must not multiply
    the run time. A rerun is allowed while (a) fewer than `busy_cells` consecutive cells
    stayed contended through their first attempt and every rerun, (b) of the cells rerun so
    far, fewer stayed contended than came out clean (judged once 2 x `busy_cells` were
    rerun), and (c) the rerun time so far plus the cell's last attempt stays within `budget`
    x the time the first attempts of all `total_cells` cells take (ms of the timed requests;
    cells not yet run are estimated at the mean first attempt so far). (a) and (b) stop reruns
    for the rest of the run; (c) only holds back the cell at hand, and a cell held back says
    nothing about (a). So the timed requests take at most (1 + budget) x their time without
    reruns, give or take the estimate's error and one rerun slower than the attempt before it."""

    total_cells: int
    budget: float = DEFAULT_CONTENTION_RERUN_BUDGET
    busy_cells: int = BUSY_CELLS
    first_ms: float = 0.0  # time of the cells' first attempts
    rerun_ms: float = 0.0  # time of their reruns
    reruns: int = 0  # rerun attempts run
    rerun_cells: int = 0  # cells rerun at least once
    stuck_cells: int = 0  # of them, cells still contended after every rerun
    streak: int = 0  # consecutive such cells (a clean cell, or one a rerun made clean, ends it)
    cells: int = 0  # cells seen
    stopped: str | None = None  # why reruns stopped for good (None: they did not)
    stopped_at: int | None = None  # the cell (1-based) after which they stopped
    not_rerun: int = 0  # contended cells left without a rerun after the stop
    over_budget: int = 0  # contended cells left without (a further) rerun by the time budget

    def first(self, ms: float) -> None:
        """A cell's first attempt took `ms` (its timed requests' wall time)."""
        self.cells += 1
        self.first_ms += ms

    @property
    def planned_ms(self) -> float:
        """The first attempts' time over the whole run: measured so far, the rest at their mean (ms)."""
        if not self.cells:
            return 0.0
        return self.first_ms * max(self.total_cells, self.cells) / self.cells

    def allows(self, last_ms: float) -> bool:
        """Whether the cell at hand, contended, may be rerun once more; `last_ms`: its last
        attempt's time, the estimate of the rerun's."""
        if self.stopped is not None:
            self.not_rerun += self.cells > (self.stopped_at or 0)  # the cells after the one it stopped in
            return False
        if self.rerun_ms + last_ms > self.budget * self.planned_ms:
            self.over_budget += 1
            return False
        return True

    def rerun(self, ms: float) -> None:
        """A rerun took `ms` (its timed requests' wall time)."""
        self.rerun_ms += ms
        self.reruns += 1

    def cell(self, first_contended: bool, kept_contended: bool, reruns: int) -> None:
        """A cell ended: whether its first attempt and the attempt kept were contended, and how
        often it was rerun; decides whether reruns stop for good."""
        if not first_contended or not kept_contended:
            self.streak = 0
        elif reruns:  # contended through every rerun (a cell held back by the budget leaves the streak as it is)
            self.streak += 1
        if reruns:
            self.rerun_cells += 1
            self.stuck_cells += kept_contended
        if self.stopped is not None:
            return
        if self.streak >= self.busy_cells:
            self.stopped = f"the machine stayed busy across {self.streak} consecutive cells"
        elif self.rerun_cells >= 2 * self.busy_cells and 2 * self.stuck_cells >= self.rerun_cells:
            self.stopped = (
                f"{self.stuck_cells} of the {self.rerun_cells} cells rerun so far stayed contended through every rerun"
            )
        if self.stopped is not None:
            self.stopped_at = self.cells

    def note(self, label: str = "") -> str | None:
        """What the reruns did not do and why, for the report (None: every contended cell got its reruns);
        `label` names the requests it covers ("look 2 of 5, t0.7")."""
        parts = []
        if self.stopped is not None:
            parts.append(
                f"{self.stopped}: reruns cannot help, stopped rerunning after cell {self.stopped_at} of "
                f"{self.total_cells} ({self.not_rerun} contended cell(s) after it not rerun)"
            )
        if self.over_budget:
            parts.append(
                f"{self.over_budget} rerun(s) of contended cells held back by the time budget (reruns took "
                f"{self.rerun_ms / 1e3:.1f} s, first attempts {self.first_ms / 1e3:.1f} s; "
                f"measurement.contention_rerun_budget {self.budget:g}: at most {1 + self.budget:g}x the run's "
                "time without reruns)"
            )
        if not parts:
            return None
        head = f"contention reruns ({label}): " if label else "contention reruns: "
        return head + "; ".join(parts) + "; verdicts resting on contended requests are inconclusive"
