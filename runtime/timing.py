"""Timing device work honestly: one timer abstraction for every timed region.

A CUDA call returns to the host as soon as its kernel is queued, so a host clock around it
measures launch overhead, not the work. On CUDA a region is timed by two CUDA events recorded
on the current stream, and the host synchronizes on the end event before reading the elapsed
time; on the CPU the work is done when the call returns and the host's monotonic clock times it.

Every timer says which clock it used (``timer.clock``); records carry that name.

``instant(device)`` is for code that sums many small regions (the trainer's per-region clock):
on CUDA it synchronizes the device before reading the host clock, so every region boundary is a
point where the device work before it has finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable

HOST_CLOCK = "host perf_counter"
CUDA_EVENTS = "cuda events"
SYNCED_HOST_CLOCK = "host perf_counter after cuda synchronize"


class HostTimer:
    """CPU work: the host's monotonic high-resolution clock. ``seconds`` is the clock read (any
    callable returning seconds): tests pass a fake one to check timing logic exactly."""

    clock = HOST_CLOCK

    def __init__(self, seconds: Callable[[], float] = time.perf_counter):
        self._seconds = seconds
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = self._seconds()

    def stop(self) -> float:
        """Seconds since :meth:`start`."""
        return self._seconds() - self._t0


class CudaEventTimer:
    """CUDA work: events recorded on the device's current stream; ``stop`` synchronizes on the
    end event (the host must not read the time before the work is done)."""

    clock = CUDA_EVENTS

    def __init__(self, device=None):
        import torch

        self.device = device
        self._cuda = torch.cuda
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._start.record(self._cuda.current_stream(self.device))

    def stop(self) -> float:
        self._end.record(self._cuda.current_stream(self.device))
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3  # elapsed_time is in milliseconds


def timer_for(device) -> HostTimer | CudaEventTimer:
    """The timer for work on ``device`` (a torch.device, a name, or None for host-only work)."""
    if device is not None and str(getattr(device, "type", device)).startswith("cuda"):
        return CudaEventTimer(device)
    return HostTimer()


def clock_name(device) -> str:
    return timer_for(device).clock if device is not None else HOST_CLOCK


def synchronize(device) -> None:
    """Wait for the device's queued work (no-op on the CPU)."""
    if device is not None and str(getattr(device, "type", device)).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def instant(device=None) -> float:
    """A host time stamp at which ``device``'s queued work has finished (seconds)."""
    synchronize(device)
    return time.perf_counter()


def instant_clock(device=None) -> str:
    """The name of the clock :func:`instant` reads for ``device``."""
    is_cuda = device is not None and str(getattr(device, "type", device)).startswith("cuda")
    return SYNCED_HOST_CLOCK if is_cuda else HOST_CLOCK


def host_seconds() -> float:
    """The host clock, for host-only work (planning, file reads): never around device work."""
    return time.perf_counter()


def thread_cpu_seconds() -> float:
    """CPU seconds this thread has run, for pricing host-only work per core: on a shared machine
    the time other processes hold the core is left out (the wall clock counts it)."""
    return time.thread_time()


def reset_peak_memory(device) -> int | None:
    """On CUDA: start a new high-water mark; returns the bytes allocated now (None on CPU)."""
    if device is not None and str(getattr(device, "type", device)).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    return None


def peak_memory_bytes(device) -> int | None:
    """On CUDA: ``torch.cuda.max_memory_allocated`` since the last reset (None on CPU, where the
    callers measure the process's peak RSS instead; see components/training/peak_memory.py)."""
    if device is not None and str(getattr(device, "type", device)).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return None
