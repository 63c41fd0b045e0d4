"""The environment a run was measured in: versions, device, seed, model fingerprints."""

from __future__ import annotations

import platform
import resource
import sys

import torch

import gate
from gate.records import Environment


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
    )


def process_peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (bytes; Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
