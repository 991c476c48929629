"""The resident-memory probe bench_sharded's memory cells run on each engine.

:class:`PeakRSS` measures how far a block of code raised its process's resident memory above
what the process held when the block began, two ways:

* the kernel's own high-water mark: ``VmHWM`` in ``/proc/self/status``, reset to the current
  resident size on entry by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0).  A warm
  engine's lifetime peak (``getrusage``'s max RSS, ``VmHWM`` unreset) says nothing about one
  cell; the reset one counts every page the block touched, however briefly;
* a thread that reads the resident size every ``interval`` seconds (psutil), which needs no
  ``clear_refs`` and can miss a spike shorter than its interval; kept beside as a cross-check.

On entry, before the starting figure is read, garbage is collected and glibc's ``malloc_trim(0)``
hands back the heap pages earlier cells freed but the allocator kept: without it the block could
reuse them without its resident size growing, and a mode run after a larger one would look
smaller than it is.

Example (in a cell)::

    with PeakRSS() as memory:
        model = build(); train(model)
    memory.figure()   # {"start_mb": ..., "peak_mb": ..., "sampled_peak_mb": ..., ...}
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import threading
import time
from typing import Any

import psutil

MB = 2**20


def _trim() -> bool:
    """Return the allocator's free heap pages to the system (glibc); whether it could."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_high_water() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


class PeakRSS:
    """Peak resident memory of this process over a ``with`` block, above its start."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._peak = 0
        self.samples = 0

    def __enter__(self) -> "PeakRSS":
        gc.collect()
        self.trimmed = _trim()
        self.start = self._process.memory_info().rss
        self.high_water_reset = _reset_high_water()
        self._peak = self.start
        self._thread = threading.Thread(target=self._sample, daemon=True, name="bench-rss")
        self._thread.start()
        self._started = time.perf_counter()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            rss = self._process.memory_info().rss
            if rss > self._peak:
                self._peak = rss
            self.samples += 1
            time.sleep(self.interval)

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self._started
        high_water = _status_kb("VmHWM")
        self._stop.set()
        self._thread.join()
        self.end = self._process.memory_info().rss
        self.high_water = high_water * 1024 if high_water is not None and self.high_water_reset \
            else None

    def figure(self) -> dict[str, Any]:
        """The block's figures in MB: the start, the peak above it (kernel high-water mark where
        it could be reset, else the sampled one), the sampled peak, what it still held at its
        end; how many samples, over how many seconds; the glibc mmap threshold this process was
        started with (None: glibc's own, which rises as large blocks are freed)."""
        sampled = (self._peak - self.start) / MB
        peak = (self.high_water - self.start) / MB if self.high_water is not None else sampled
        return {"start_mb": self.start / MB, "peak_mb": peak, "sampled_peak_mb": sampled,
                "end_mb": (self.end - self.start) / MB, "samples": self.samples,
                "seconds": self.seconds, "high_water_reset": self.high_water_reset,
                "trimmed": self.trimmed,
                "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_")}
