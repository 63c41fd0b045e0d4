"""Peak device memory per runner, beside the bill (gate.measure.device_memory; issue 43).

In-process on CUDA each runner's requests reset the allocator's peak and read it after, less
the weights of the drafts loaded beside it that it does not use; a server gate started is read
through NVML. Without an accelerator both say "not measured: no accelerator" and a rule on them
is skipped, never failed. These tests need no GPU: the allocator and NVML are stand-ins with a
known answer."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from gate.analysis.summary import summarize
from gate.measure.device_memory import (
    NO_ACCELERATOR,
    CudaPeaks,
    no_accelerator,
    nvml_process_bytes,
)
from gate.metrics.catalogue import (
    DEVICE_PEAK_ALLOCATED_BYTES,
    METRICS,
    ON_ACCELERATOR,
    SERVER_DEVICE_BYTES,
    UNACCOUNTED_DEVICE_BYTES,
)
from gate.records import BillLine, BillRecord, DeviceMemoryRecord, Environment, Measurements, ServerRecord
from gate.rules.samples import Selection, device_memory_unmeasured, samples

CPU = torch.device("cpu")
GiB = 2**30


class FakeCuda:
    """torch.cuda's peak functions with a scripted allocator."""

    def __init__(self) -> None:
        self.allocated, self.reserved, self.resets = 0, 0, 0

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        self.resets += 1

    def max_memory_allocated(self, device: torch.device) -> int:
        return self.allocated

    def max_memory_reserved(self, device: torch.device) -> int:
        return self.reserved

    def get_device_name(self, device: torch.device) -> str:
        return "Fake H100"


def test_cuda_peaks_reset_and_read_the_allocator() -> None:
    cuda = FakeCuda()
    peaks = CudaPeaks(torch.device("cuda"), cuda)
    peaks.reset()
    cuda.allocated, cuda.reserved = 3 * GiB, 4 * GiB
    assert cuda.resets == 1 and peaks.read().allocated == 3 * GiB and peaks.read().reserved == 4 * GiB
    assert peaks.name() == "Fake H100"


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 - NVML's field name


class FakeNvml:
    """pynvml with two GPUs: the server's process tree (pids 10 and 11) on both, another process on one."""

    def __init__(self, fail_init: Exception | None = None, hidden: bool = False) -> None:
        self.fail_init, self.hidden, self.shutdowns = fail_init, hidden, 0
        self.procs = {0: [Proc(10, 2 * GiB), Proc(99, 5 * GiB)], 1: [Proc(11, None if hidden else GiB)]}

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        if self.fail_init is not None:
            raise self.fail_init

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Proc]:  # noqa: N802
        return self.procs[handle]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Proc]:  # noqa: N802
        return []


def test_nvml_sums_the_server_tree_over_every_gpu_and_leaves_other_processes_out() -> None:
    nvml = FakeNvml()
    assert nvml_process_bytes([10, 11], nvml) == (3 * GiB, None)
    assert nvml.shutdowns == 1
    used, why = nvml_process_bytes([10, 11], FakeNvml(hidden=True))
    assert used is None and "no memory figure for process 11" in why and not no_accelerator(why)


def test_nvml_without_a_gpu_says_no_accelerator() -> None:
    used, why = nvml_process_bytes([10], FakeNvml(fail_init=RuntimeError("NVML Shared Library Not Found")))
    assert used is None and no_accelerator(why) and "Shared Library Not Found" in why
    used, why = nvml_process_bytes([1])  # this machine: no NVIDIA driver (the real nvidia-ml-py)
    assert used is None and why.startswith(NO_ACCELERATOR)


def test_device_memory_metrics_are_catalogued_for_rules() -> None:
    for name in ("device_peak_allocated_bytes", "device_peak_reserved_bytes", "unaccounted_device_bytes",
                 "server_device_bytes"):
        assert name in METRICS and name in ON_ACCELERATOR and METRICS[name].aggregations == ("max",)
    assert DEVICE_PEAK_ALLOCATED_BYTES.measured_by == "in_process" and SERVER_DEVICE_BYTES.measured_by == "load_points"


def measurements(accelerator: str | None = "Fake H100") -> Measurements:
    m = Measurements(environment=Environment("3.11", "2", "5", "0", "linux", "cuda", "Fake H100", 0), laws=["greedy"])
    m.accelerator = accelerator
    m.drafts = {"d": SimpleNamespace(name="d")}  # summarize() reads only the names
    m.bills = [BillRecord("d", 1, 100, [BillLine("weights", "", 3 * GiB)]),
               BillRecord("fallback", 1, 100, [BillLine("weights", "", 2 * GiB)])]
    if accelerator is not None:
        m.device_memory = [DeviceMemoryRecord("d", "greedy", "Fake H100", int(3.2 * GiB), 4 * GiB, GiB, 8),
                           DeviceMemoryRecord("fallback", "greedy", "Fake H100", int(2.1 * GiB), 3 * GiB, 2 * GiB, 8)]
    return m


def test_samples_per_runner_and_law_and_the_unaccounted_gap() -> None:
    m = measurements()
    sel = Selection("d", "greedy", None)
    assert samples(DEVICE_PEAK_ALLOCATED_BYTES.name, m, sel) == [float(int(3.2 * GiB))]
    assert samples(UNACCOUNTED_DEVICE_BYTES.name, m, sel) == [float(int(3.2 * GiB) - 3 * GiB)]
    assert samples(DEVICE_PEAK_ALLOCATED_BYTES.name, m, Selection("d", "t0.7", None)) == []
    assert device_memory_unmeasured(DEVICE_PEAK_ALLOCATED_BYTES.name, m, "d") is None


def test_without_an_accelerator_the_reason_is_no_accelerator_and_the_rule_is_skipped() -> None:
    m = measurements(accelerator=None)
    assert device_memory_unmeasured(DEVICE_PEAK_ALLOCATED_BYTES.name, m, "d") == (True, "not measured: no accelerator")
    assert device_memory_unmeasured("overlap", m, "d") is None  # not a device memory metric
    m.servers = [ServerRecord("d", "vllm", device_memory_note="no accelerator (NVML: Shared Library Not Found)"),
                 ServerRecord("fallback", "openai", device_memory_note="gate did not start this server: ...")]
    skip, why = device_memory_unmeasured(SERVER_DEVICE_BYTES.name, m, "d")
    assert skip and why == "not measured: no accelerator (NVML: Shared Library Not Found)"
    skip, why = device_memory_unmeasured(SERVER_DEVICE_BYTES.name, m, "fallback")
    assert not skip and "gate did not start this server" in why  # measurable in principle: an error, not a skip


def test_summary_rows_carry_the_peak_or_why_not() -> None:
    rows = {r.runner: r for r in summarize(measurements())}
    assert rows["d"].device_peak_bytes == int(3.2 * GiB) and rows["d"].device_reserved_bytes == 4 * GiB
    assert rows["d"].device_memory_note is None
    rows = {r.runner: r for r in summarize(measurements(accelerator=None))}
    assert rows["d"].device_peak_bytes is None and rows["d"].device_memory_note == "not measured: no accelerator"
    served = measurements(accelerator=None)
    served.servers = [ServerRecord("d", "vllm", device_bytes=5 * GiB)]
    assert {r.runner: r for r in summarize(served)}["d"].device_peak_bytes == 5 * GiB
