"""The kernel's view of each rank's memory during a run: latest sample, peaks, and OOM signs.

Engines send memory samples with their metric batches (about one a second, see
``runtime/telemetry/_memory.py``); :class:`RunMemory` keeps the latest per rank and the run's peaks, which
go to the ``memory`` events, ``phalanx.last_run().memory`` and the manifest.

:func:`oom_hint` judges whether a dead rank was likely killed for memory: it says so only when
the signs are there (the kernel log names the process, the engine's last RSS was a large share
of the machine's memory, or memory pressure was high), and always gives the figures it used.

Example::

    >>> m = RunMemory()
    >>> m.add(0, [{"t": 1.0, "rss_mb": 500.0}, {"t": 2.0, "rss_mb": 700.0}])
    True
    >>> m.peaks()[0]["rss_mb"]
    700.0
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
from typing import Any, Mapping

PEAK_KEYS = ("rss_mb", "cuda_allocated_mb", "cuda_reserved_mb", "cuda_peak_mb")
SAMPLE_KEYS = ("t", "rss_mb", "cuda_allocated_mb", "cuda_reserved_mb", "cuda_peak_mb",
               "cuda_total_mb")
# Share of the machine's (or cgroup's) memory an engine must have held to call a SIGKILL "likely
# out of memory" without the kernel log saying so.
HIGH_RSS_SHARE = 0.5


class RunMemory:
    """Latest memory sample and run peaks per rank; thread-safe (the receiver thread adds)."""

    def __init__(self) -> None:
        self._latest: dict[int, dict] = {}
        self._peaks: dict[int, dict[str, float]] = {}
        self._fresh = False
        self._lock = threading.Lock()

    def add(self, rank: int, samples: list, peak: Mapping[str, float] | None = None) -> bool:
        """Take a batch's samples (and the engine's own peaks on its final batch)."""
        clean = [{k: float(s[k]) for k in SAMPLE_KEYS if isinstance(s.get(k), (int, float))}
                 for s in samples if isinstance(s, Mapping)]
        with self._lock:
            peaks = self._peaks.setdefault(rank, {})
            for sample in clean + ([dict(peak)] if peak else []):
                for key in PEAK_KEYS:
                    if isinstance(sample.get(key), (int, float)):
                        peaks[key] = max(peaks.get(key, 0.0), float(sample[key]))
            if clean:
                self._latest[rank] = clean[-1]
                self._fresh = True
        return bool(clean)

    def latest(self) -> dict[int, dict]:
        with self._lock:
            return {r: dict(s) for r, s in self._latest.items()}

    def peaks(self) -> dict[int, dict[str, float]]:
        with self._lock:
            return {r: dict(p) for r, p in self._peaks.items() if p}

    def take_fresh(self) -> list[dict] | None:
        """The latest sample of every rank if any arrived since the last call, else ``None``."""
        with self._lock:
            if not self._fresh:
                return None
            self._fresh = False
            return [{"rank": r, **s} for r, s in sorted(self._latest.items())]


# --- out of memory ------------------------------------------------------------------------------


def cuda_oom_text(error: str | None, memory: Mapping[str, Any] | None) -> str | None:
    """A line for a rank that raised torch's CUDA out-of-memory error (or a plain MemoryError);
    ``error`` is the exception's type name, ``memory`` the rank's figures when it failed."""
    memory = memory or {}
    if error == "OutOfMemoryError":
        figures = _cuda_figures(memory)
        return "it ran out of GPU memory (torch.OutOfMemoryError)" + (f": {figures}" if figures else "")
    if error == "MemoryError":
        rss = memory.get("rss_mb")
        return "it ran out of host memory (MemoryError)" + (
            f" with {fmt_gib(rss)} resident" if rss else "")
    return None


def _cuda_figures(memory: Mapping[str, Any]) -> str:
    parts = [f"{label} {fmt_gib(memory[key])}" for key, label in
             (("cuda_allocated_mb", "allocated"), ("cuda_reserved_mb", "reserved"),
              ("cuda_peak_mb", "peak"), ("cuda_total_mb", "of"))
             if isinstance(memory.get(key), (int, float))]
    return ", ".join(parts)


def oom_hint(exit_code: Any, pid: int | None, last_rss_mb: float | None,
             total_mb: float | None = None, kernel_log: str | None = None,
             pressure_avg10: float | None = None) -> str | None:
    """Why a dead engine likely died, when it was SIGKILLed; ``None`` for other exits.

    Example::

        >>> oom_hint(-9, 42, 6000.0, total_mb=8000.0)
        'killed by SIGKILL, last RSS 5.86 GiB (75% of 7.81 GiB): likely out of memory'
        >>> oom_hint(-9, 42, 100.0, total_mb=8000.0)
        'killed by SIGKILL, last RSS 0.10 GiB (1% of 7.81 GiB)'
    """
    if exit_code not in (-signal.SIGKILL, signal.SIGKILL, 128 + signal.SIGKILL):
        return None
    text = "killed by SIGKILL"
    if last_rss_mb is not None:
        text += f", last RSS {fmt_gib(last_rss_mb)}"
        if total_mb:
            text += f" ({last_rss_mb / total_mb:.0%} of {fmt_gib(total_mb)})"
    if pid and kernel_log and _names_oom_kill(kernel_log, pid):
        return text + ": the kernel's OOM killer ended it (kernel log), out of memory"
    high_rss = bool(last_rss_mb and total_mb and last_rss_mb >= HIGH_RSS_SHARE * total_mb)
    pressured = pressure_avg10 is not None and pressure_avg10 >= 10.0
    if high_rss or pressured:
        why = "" if high_rss else f" (memory pressure {pressure_avg10:.0f}% in the last 10 s)"
        return text + why + ": likely out of memory"
    return text


def _names_oom_kill(kernel_log: str, pid: int) -> bool:
    return re.search(rf"(Out of memory|oom-kill|Killed process)\D*\b{pid}\b", kernel_log) is not None


def fmt_gib(mb: float) -> str:
    return f"{mb / 1024:.2f} GiB"


def host_signs() -> dict:
    """What this host can tell about memory: total (cgroup limit if lower), the kernel log where
    readable, and memory pressure (PSI).  Each is ``None`` where it cannot be read."""
    return {"total_mb": _total_mb(), "kernel_log": _kernel_log(), "pressure_avg10": _pressure()}


def _total_mb() -> float | None:
    try:
        import psutil

        total = psutil.virtual_memory().total
    except Exception:
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total / 2**20


def _kernel_log() -> str | None:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout[-200_000:] if out.returncode == 0 else None


def _pressure() -> float | None:
    try:
        with open("/proc/pressure/memory") as f:
            first = f.readline()  # "some avg10=0.00 avg60=0.00 ..."
        return float(first.split("avg10=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None
