"""The loop whose per-step CPU cost bench_step_cost measures, imported on the engines (and in
the benchmark's own process for the plain loop), so the three places run the same code.

CPU time, not wall time: interference from other work on the machine makes a step wait, which
wall time counts and the process's CPU time does not (it still raises the CPU time a little,
through caches, so the benchmark alternates the places and keeps the fastest block of each).
"""

from __future__ import annotations

import ctypes
import os
import struct
import time
from typing import Any

_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
_opened: dict[str, int | None] = {}


def _instruction_counter() -> int | None:
    """A perf counter of this process's user-space instructions, or None where the machine
    has none (a virtual machine without PMU passthrough, perf_event_paranoid > 2)."""
    if "fd" in _opened:
        return _opened["fd"]
    fd = None
    number = _PERF_EVENT_OPEN.get(os.uname().machine)
    if number is not None:
        attr = bytearray(128)
        # type PERF_TYPE_HARDWARE (0), size 128, config PERF_COUNT_HW_INSTRUCTIONS (1)
        struct.pack_into("IIQ", attr, 0, 0, 128, 1)
        # flags: inherit (threads started later count too), exclude_kernel, exclude_hv
        struct.pack_into("Q", attr, 40, (1 << 1) | (1 << 5) | (1 << 6))
        buf = ctypes.create_string_buffer(bytes(attr), 128)
        got = ctypes.CDLL(None, use_errno=True).syscall(number, buf, 0, -1, -1, 0)
        fd = got if got >= 0 else None
    _opened["fd"] = fd
    return fd


def _instructions(fd: int | None) -> int | None:
    return None if fd is None else struct.unpack("Q", os.read(fd, 8))[0]


def timed_loop(net: Any, X: Any, y: Any, steps: int, batch: int) -> dict[str, Any]:
    """Train ``net`` for ``steps`` steps of ``batch`` rows; per-step costs of this process."""
    import torch

    torch.set_num_threads(1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    fd = _instruction_counter()
    counted = _instructions(fd)
    wall, process, thread = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
    for i in range(steps):
        xb, yb = X[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()
    ended = _instructions(fd)
    return {"process_us": (time.process_time_ns() - process) / steps / 1e3,
            "thread_us": (time.thread_time_ns() - thread) / steps / 1e3,
            "wall_us": (time.perf_counter_ns() - wall) / steps / 1e3,
            "instructions": None if counted is None or ended is None
            else (ended - counted) / steps}
