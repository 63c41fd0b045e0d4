"""The environment a run was measured in: versions, device, seed, model fingerprints."""

from __future__ import annotations

import os
import platform
import resource
import sys

import torch

import gate
from gate.measure.contention import PSI_CPU, load_average, pooled_stall_share, read_pressure
from gate.records import Environment, RequestRecord


def environment(device: torch.device, seed: int) -> Environment:
    """Versions of python, torch, transformers and gate, the platform and device."""
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    return Environment(
        python=sys.version.split()[0],
        torch=torch.__version__,
        transformers=transformers.__version__,
        gate=gate.__version__,
        platform=platform.platform(),
        device=str(device),
        device_name=name,
        seed=seed,
        cpu_count=cpu_count(),
        threads=torch.get_num_threads(),
        cpu_pressure_source=str(PSI_CPU)
        if read_pressure() is not None
        else "load average"
        if load_average() is not None
        else None,
    )


def cpu_count() -> int | None:
    """CPUs this process may run on (its affinity where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def record_load(env: Environment, requests: list[RequestRecord]) -> None:
    """The machine's load over the timed requests, into the environment: the stalled share of
    their summed wall time and the highest load average seen."""
    env.cpu_stall_share = pooled_stall_share(requests, env.cpu_count)
    loads = [r.load_avg_1m for r in requests if r.load_avg_1m is not None]
    env.load_avg_1m_max = max(loads) if loads else None


def process_peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (bytes; Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
