"""Peak host-memory measurement of a code region, from the kernel's own high-water mark.

Why this and not tracemalloc: tracemalloc only sees Python's allocators (PyMem_*); torch's CPU
tensors come from c10's allocator (malloc/posix_memalign), which tracemalloc never sees. torch
has no CPU allocator statistics (torch.cuda.max_memory_allocated has no CPU twin), and the
profiler's memory events attribute frees outside operators poorly. So we measure what the
process really holds resident:

1. ``mallopt(M_MMAP_THRESHOLD, 64 KiB)`` pins glibc's mmap threshold (it otherwise grows
   dynamically after a large free), so every tensor buffer above 64 KiB is its own mmap and
   goes back to the kernel on free: resident memory then follows live tensor bytes;
2. writing "5" to /proc/self/clear_refs resets the peak resident set size (VmHWM, Linux >= 4.0)
   to the current one; 3. the region's peak is VmHWM after the region minus VmRSS before it.

The number includes everything the region makes resident (tensors, allocator slack, stacks of
threads it starts), i.e. what an out-of-memory would be judged by. Pages are 4 KiB, so it
is exact to a page per buffer. Linux only; elsewhere :func:`peak_supported` is False.
"""

from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager

_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 64 * 1024


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"{key} not in /proc/self/status")


def peak_supported() -> bool:
    return os.path.exists("/proc/self/clear_refs") and os.access("/proc/self/clear_refs", os.W_OK)


def return_freed_memory_to_os() -> bool:
    """Make glibc hand large freed buffers back at once (see module docstring). True if set."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES))
    except OSError:
        return False


class PeakResult:
    """Filled in when the ``with`` block ends: ``peak_bytes`` above the RSS at its start."""

    def __init__(self):
        self.baseline_rss_bytes = 0
        self.peak_bytes = 0


@contextmanager
def measure_peak_rss():
    """``with measure_peak_rss() as m: ...``; then ``m.peak_bytes`` is the region's peak RSS rise."""
    if not peak_supported():
        raise RuntimeError("peak RSS measurement needs Linux /proc/self/clear_refs")
    result = PeakResult()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    result.baseline_rss_bytes = _status_bytes("VmRSS:")
    try:
        yield result
    finally:
        result.peak_bytes = max(0, _status_bytes("VmHWM:") - result.baseline_rss_bytes)
