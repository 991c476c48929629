"""``--profile STEPS`` on an engine: record the first STEPS optimizer steps with torch.profiler.

The profiler starts just before the cell's body and stops after the STEPS-th ``opt.step()``
(counted by a global optimizer step hook, so it needs nothing from the loop and nothing from
phalanx's own hooks), or at the end of the cell if the loop takes fewer steps.  Each step is
marked (``ProfilerStep#N``) in the trace; a step still open when the cell ends is closed there.  CPU activity is always recorded, CUDA activity when
the run's device is a GPU.

What comes back to the kernel is the Chrome trace (gzip-compressed JSON) and this rank's top
operators by self time; the kernel merges the ranks into one trace (``fit/telemetry/_profile.py``).

A CUDA profile detaches NVIDIA's tracing library (CUPTI) from the engine when it stops.  Torch's
profiler leaves it attached unless ``TEARDOWN_CUPTI=1`` (pytorch/pytorch#144455), and an engine
outlives its runs: on an H200 a host-bound loop in an engine ran at about 0.8x its earlier
speed in the runs measured after one ``--profile`` (CUPTI stays for the engine's life).  A
``TEARDOWN_CUPTI`` the person set is kept (torch sets ``0`` itself where CUDA graphs need CUPTI
to stay).
"""

from __future__ import annotations

import gzip
import os
import tempfile
from typing import TYPE_CHECKING, MutableMapping

if TYPE_CHECKING:
    import torch
    import torch.autograd.profiler
    from torch.utils.hooks import RemovableHandle

TOP_OPERATORS = 10


class StepProfiler:
    """torch.profiler around the first ``steps`` optimizer steps of this rank."""

    def __init__(self, steps: int, device: torch.device | None) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.cuda = getattr(device, "type", "cpu") == "cuda"
        if self.cuda:
            detach_cupti_when_stopped(os.environ)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.steps = steps
        self.recorded = 0
        self._profile = profile(activities=activities)
        self._hook: RemovableHandle | None = None
        self._running = False
        # the open ProfilerStep#N range
        self._mark: torch.autograd.profiler.record_function | None = None

    def start(self) -> "StepProfiler":
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._profile.start()
        self._running = True
        self._open_mark()
        self._hook = register_optimizer_step_post_hook(self._after_step)
        return self

    def _after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not self._running:
            return
        self.recorded += 1
        self._close_mark()
        if self.recorded >= self.steps:
            self.stop()
        else:
            self._open_mark()

    # torch.profiler marks steps itself only under a schedule; these are the same ranges.
    def _open_mark(self) -> None:
        from torch.autograd.profiler import record_function

        self._mark = record_function(f"ProfilerStep#{self.recorded + 1}")
        self._mark.__enter__()

    def _close_mark(self) -> None:
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None

    def stop(self) -> None:
        """Stop recording (idempotent; also what a failing cell's cleanup calls)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._running:
            self._running = False
            self._close_mark()
            self._profile.stop()

    def result(self) -> dict:
        """``{"trace": gzip JSON bytes, "top": [...], "steps": recorded, "cuda": bool}``."""
        self.stop()
        handle, path = tempfile.mkstemp(prefix="phalanx-profile-", suffix=".json")
        os.close(handle)
        try:
            self._profile.export_chrome_trace(path)
            with open(path, "rb") as f:
                trace = gzip.compress(f.read(), compresslevel=5)
        finally:
            os.unlink(path)
        return {"trace": trace, "top": self.top_operators(), "steps": self.recorded,
                "cuda": self.cuda}

    def top_operators(self, limit: int = TOP_OPERATORS) -> list[dict]:
        """The operators that took the most self time (device time first on a GPU)."""
        rows = []
        for event in self._profile.key_averages():
            if event.key.startswith("ProfilerStep"):
                continue  # the step markers span everything: not an operator
            rows.append({"name": event.key, "calls": int(event.count),
                         "self_cpu_ms": event.self_cpu_time_total / 1000.0,
                         "cpu_total_ms": event.cpu_time_total / 1000.0,
                         "self_cuda_ms": (getattr(event, "self_device_time_total", 0.0) or 0.0) / 1000.0})
        key = "self_cuda_ms" if self.cuda else "self_cpu_ms"
        rows.sort(key=lambda r: (r[key], r["self_cpu_ms"]), reverse=True)
        return rows[:limit]


def detach_cupti_when_stopped(environ: MutableMapping[str, str]) -> None:
    """Ask torch's profiler to detach CUPTI when it stops (read by it at that moment), unless the
    person chose otherwise.

    >>> env = {}; detach_cupti_when_stopped(env); env
    {'TEARDOWN_CUPTI': '1'}
    >>> env = {"TEARDOWN_CUPTI": "0"}; detach_cupti_when_stopped(env); env
    {'TEARDOWN_CUPTI': '0'}
    """
    environ.setdefault("TEARDOWN_CUPTI", "1")


def start_profiler(steps: int | None, device: torch.device | None) -> StepProfiler | None:
    """A running profiler when the run asked for one (``--profile STEPS``)."""
    return StepProfiler(steps, device).start() if steps else None
