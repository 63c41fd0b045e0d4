"""Peak accelerator memory, measured beside the bill (gate bill predicts it; this measures it).

In-process (CUDA): the caching allocator's own peaks, `torch.cuda.max_memory_allocated` and
`max_memory_reserved`, reset before each request and read after it, so each runner and law
gets the highest peak over its own requests. Every draft of a policy is loaded in the same
process, so the weights of the drafts a runner does not use are resident during its
requests too: they are counted exactly (gate.models.loading.weight_bytes: the unique
storages of their parameters and buffers, shared tensors once) and subtracted, so a runner's peak is what the
target and its own draft needed, which is what the bill predicts.

Served (a server process gate started): the device memory NVML (`nvidia-ml-py`) says the
server's process tree uses, summed over the GPUs that run it. It is sampled when the server
is ready, after each run and before each stop (as its peak RSS is): engines preallocate
their KV pool at start, so the samples see it; a transient allocation inside a run that is
freed before the run ends is not seen.

Neither is measured without an accelerator; the reason is a sentence (NO_ACCELERATOR), and
a rule on these metrics is then skipped, saying so, never failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

NO_ACCELERATOR = "no accelerator"


def no_accelerator(why: str) -> bool:
    """Whether a reason a device memory figure is missing (nvml_process_bytes) is that the
    machine has no accelerator: its rules are then skipped, not failed."""
    return why.startswith(NO_ACCELERATOR)


@dataclass
class Peak:
    """One request's allocator peaks on a CUDA device, bytes (torch.cuda.max_memory_allocated /
    max_memory_reserved since the reset before it)."""

    allocated: int
    reserved: int


class CudaPeaks:
    """Resets the CUDA allocator's peak statistics before a request and reads them after it.
    `device` must be a CUDA device; torch's functions raise what they raise otherwise."""

    def __init__(self, device: torch.device, cuda: Any = None):
        self.device = device
        self.cuda = cuda if cuda is not None else torch.cuda  # injectable: tests on CPU machines

    def name(self) -> str:
        """The device's name ("NVIDIA H100 80GB HBM3")."""
        return str(self.cuda.get_device_name(self.device))

    def reset(self) -> None:
        """Start a new peak at what is allocated now."""
        self.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> Peak:
        """The peaks since the last reset()."""
        return Peak(int(self.cuda.max_memory_allocated(self.device)), int(self.cuda.max_memory_reserved(self.device)))


def nvml_process_bytes(pids: Iterable[int], nvml: Any = None) -> tuple[int | None, str | None]:
    """The device memory NVML says the processes `pids` use now, bytes, summed over every GPU
    (nvmlDeviceGetComputeRunningProcesses and the graphics processes). Returns (bytes, None),
    or (None, why) when it cannot be read: NO_ACCELERATOR where NVML or its library is missing
    (a machine with no NVIDIA GPU), else NVML's error. A process NVML lists without a figure
    (no permission to read it) makes the whole reading (None, why)."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return None, f"{NO_ACCELERATOR} (nvidia-ml-py is not installed)"
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVML's errors are one class per code; none of them is a bug here
        return None, f"{NO_ACCELERATOR} (NVML: {e})"
    try:
        wanted, total = set(pids), 0
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            procs = [*nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            procs += [*nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)]
            for p in procs:
                if p.pid not in wanted:
                    continue
                if p.usedGpuMemory is None:
                    return None, f"NVML gives no memory figure for process {p.pid} (no permission to read it)"
                total += int(p.usedGpuMemory)
        return total, None
    except Exception as e:  # noqa: BLE001 - as above: NVML's error, said in the report
        return None, f"NVML: {e}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting NVML down cannot change the reading
            pass
