"""How much memory this engine holds: process RSS, and CUDA allocator figures where CUDA runs.

Sampled by the metrics sender's thread about once a second while a run goes, and answered on
request between runs.  CUDA figures come from torch's caching allocator and only when this
process has *already* initialised CUDA: asking ``torch.cuda`` for memory in a process that never
used the GPU would create a CUDA context (hundreds of MB, seconds) just to report zero.

Example::

    >>> sample = memory_sample()
    >>> sample["rss_mb"] > 0 and "cuda_allocated_mb" not in sample
    True
"""

from __future__ import annotations

import os
import sys
import time

from ..run._device_rule import own_gpu_index

_MB = 2**20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    """Resident set size of this process (``/proc/self/statm``: one read, no psutil object)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def cuda_in_use() -> bool:
    """Whether torch is imported here and has initialised CUDA (never initialises it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def own_device() -> int:
    """This engine's own GPU: from its pinning (the metrics thread's current device is cuda:0
    whatever the run set, since CUDA keeps one per thread), else the current device."""
    import torch

    index = own_gpu_index(os.environ, local_rank=None)
    return torch.cuda.current_device() if index is None else index


def memory_sample() -> dict:
    """``{"t", "rss_mb"}`` plus ``cuda_allocated_mb``, ``cuda_reserved_mb``, ``cuda_peak_mb`` and
    ``cuda_total_mb`` when this process uses CUDA."""
    sample: dict = {"t": time.time()}
    rss = rss_bytes()
    if rss is not None:
        sample["rss_mb"] = round(rss / _MB, 1)
    if cuda_in_use():
        import torch

        try:
            device = own_device()
            sample.update(
                cuda_allocated_mb=round(torch.cuda.memory_allocated(device) / _MB, 1),
                cuda_reserved_mb=round(torch.cuda.memory_reserved(device) / _MB, 1),
                cuda_peak_mb=round(torch.cuda.max_memory_allocated(device) / _MB, 1),
                cuda_total_mb=round(torch.cuda.get_device_properties(device).total_memory / _MB, 1))
        except Exception:  # a broken context must not stop the metrics thread
            pass
    return sample


def reset_cuda_peak() -> None:
    """Start a run's CUDA peak from now (only where CUDA is already in use)."""
    if cuda_in_use():
        import torch

        try:
            torch.cuda.reset_peak_memory_stats(own_device())
        except Exception:
            pass


# A run leaving this much more memory in use than the last collection left is worth a full
# collection (about 0.08 s on an engine with torch loaded, measured), on the GPU or 5% of the
# device where that is less.  The last rule alone (5% of an H200 is 7 GB) let a finished run's
# 0.5 GB model stay on the GPU into the next run, whose peak then counted it (seen: 1172 MB for
# a CPU-offloaded sharded model that needs 658 MB); on CPU engines nothing was collected at all.
COLLECT_AFTER_BYTES = 256 << 20


def worth_collecting(in_use: int, baseline: int, total: int | None = None,
                     min_bytes: int = COLLECT_AFTER_BYTES, max_fraction: float = 0.05) -> bool:
    """Whether ``in_use`` bytes, against ``baseline`` (what the last collection left, or what
    was in use before the first run), hold enough that a run may have left behind; ``total``,
    a device's memory, lowers the bar to ``max_fraction`` of it.

    >>> GB = 1 << 30
    >>> worth_collecting(int(1.2 * GB), 0, 141 * GB)           # a 1.2 GB run on an H200
    True
    >>> worth_collecting(int(10.1 * GB), 10 * GB, 141 * GB)    # a kept 10 GB model, a small run
    False
    >>> worth_collecting(300 << 20, 0, 4 * GB)                 # 5% of a 4 GB card is 205 MB
    True
    >>> worth_collecting(300 << 20, 200 << 20)                 # a process's resident memory
    False
    """
    bar = min_bytes if total is None else min(min_bytes, max_fraction * total)
    return in_use - baseline >= bar


class RunGarbage:
    """After each run: free the memory of what the cell built and nothing reaches any more.

    A cell's functions and classes (through their globals) and torch's optimizers, DDP and FSDP
    modules form reference cycles, so without a full pass of Python's cycle collector, which a
    training loop rarely triggers, a finished run's model, gradients and optimizer state stay in
    memory, on the GPU or the host, into the next run, whose peak counts them.  A full pass is
    made when the CUDA memory allocated or the process's resident memory has grown by
    :data:`COLLECT_AFTER_BYTES` (on the GPU, or 5% of the device) since the last pass left it:
    what a run left below that stays at most until it adds up to that, and a model kept with
    ``--keep`` raises the baseline once instead of costing a pass after every run.
    """

    def __init__(self) -> None:
        self.cuda_baseline = 0  # bytes allocated on the GPU after the last collection
        self.rss_baseline = rss_bytes()  # resident bytes after it (first: before any run)

    def after_run(self) -> bool:
        """Collect if worth it; returns whether it collected."""
        import gc

        cuda = _cuda_allocated()
        rss = rss_bytes()
        on_gpu = cuda is not None and worth_collecting(cuda[0], self.cuda_baseline, cuda[1])
        on_host = (rss is not None and self.rss_baseline is not None
                   and worth_collecting(rss, self.rss_baseline))
        if not (on_gpu or on_host):  # what a collection freed meanwhile lowers the baseline
            if cuda is not None:
                self.cuda_baseline = min(self.cuda_baseline, cuda[0])
            if rss is not None and self.rss_baseline is not None:
                self.rss_baseline = min(self.rss_baseline, rss)
            return False
        gc.collect()
        after = _cuda_allocated()
        self.cuda_baseline = after[0] if after is not None else 0
        self.rss_baseline = rss_bytes()
        return True


def _cuda_allocated() -> tuple[int, int] | None:
    """Bytes allocated on this engine's GPU and the device's total; None without CUDA in use."""
    if not cuda_in_use():
        return None
    import torch

    try:
        device = own_device()
        return (torch.cuda.memory_allocated(device),
                torch.cuda.get_device_properties(device).total_memory)
    except Exception:  # a broken context: nothing to free through it
        return None


class MemoryTracker:
    """Samples at most every ``interval_s`` seconds; keeps the run's peaks.

    ``interval_s`` of 0 turns sampling off (``due`` never says yes).
    """

    def __init__(self, interval_s: float = 1.0, clock=time.monotonic) -> None:
        self.interval_s = interval_s
        self.peak: dict[str, float] = {}
        self.last: dict | None = None
        self._clock = clock
        self._next = clock()

    def due(self) -> bool:
        return self.interval_s > 0 and self._clock() >= self._next

    def next_at(self) -> float:
        """When the next sample is due, on this tracker's clock (monotonic by default)."""
        return self._next

    def take(self) -> dict:
        """A new sample; the run's peaks follow it."""
        self._next = self._clock() + self.interval_s
        sample = memory_sample()
        for key in ("rss_mb", "cuda_allocated_mb", "cuda_reserved_mb", "cuda_peak_mb"):
            if key in sample:
                self.peak[key] = max(self.peak.get(key, 0.0), sample[key])
        self.last = sample
        return sample
