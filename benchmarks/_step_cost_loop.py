"""The loop whose per-step CPU cost bench_step_cost measures, imported on the engines (and in
the benchmark's own process for the plain loop), so the three places run the same code.

CPU time, not wall time: interference from other work on the machine makes a step wait, which
wall time counts and the process's CPU time does not (it still raises the CPU time a little,
through caches, so the benchmark alternates the places in pairs).

The process's CPU time is also split by thread: torch's collective threads (gloo's) spin while
they wait for the peer, so their CPU time is the peer's lateness, not work of this process, and
it moves with the scheduling of the other rank (measured: about 820 of a 2,300 us DDP step, and
the process's total moved by 15% between blocks of the same loop).  ``own_us`` is every other
thread: the training thread, phalanx's and ipykernel's.
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


# torch's collective threads, by the name the kernel shows (comm, 15 characters at most)
COLLECTIVE_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop", "pt_nccl", "nccl")


def thread_cpu_ns() -> dict[int, tuple[str, int]]:
    """Each thread of this process: its name and the nanoseconds it has run (the scheduler's
    count, finer than /proc's clock ticks)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = (name, int(f.read().split()[0]))
        except OSError:  # a thread that ended meanwhile
            continue
    return out


def collective_share_ns(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]
                        ) -> int:
    """CPU nanoseconds torch's collective threads ran between two snapshots.

    >>> collective_share_ns({1: ("python", 5), 2: ("gloo_tcp_loop", 10)},
    ...                     {1: ("python", 9), 2: ("gloo_tcp_loop", 30), 3: ("pt_gloo_runloop", 7)})
    27
    """
    return sum(ns - before.get(tid, (name, 0))[1] for tid, (name, ns) in after.items()
               if name.startswith(COLLECTIVE_THREADS))


def per_thread_us(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]],
                  steps: int) -> dict[str, float]:
    """CPU microseconds per step of each thread name between two snapshots (0.5 us or more):
    which threads besides the training one a place adds.

    >>> per_thread_us({1: ("python", 0)}, {1: ("python", 3000), 2: ("ZMQbg/IO/0", 400)}, 2)
    {'python': 1.5}
    """
    spent: dict[str, float] = {}
    for tid, (name, ns) in after.items():
        spent[name] = spent.get(name, 0.0) + (ns - before.get(tid, (name, 0))[1]) / steps / 1e3
    return {name: us for name, us in sorted(spent.items(), key=lambda kv: -kv[1]) if us >= 0.5}


def timed_loop(net: Any, X: Any, y: Any, steps: int, batch: int) -> dict[str, Any]:
    """Train ``net`` for ``steps`` steps of ``batch`` rows; per-step costs of this process."""
    import torch

    torch.set_num_threads(1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    fd = _instruction_counter()
    counted = _instructions(fd)
    threads = thread_cpu_ns()
    wall, process, thread = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
    for i in range(steps):
        xb, yb = X[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()
    ended = _instructions(fd)
    process_us = (time.process_time_ns() - process) / steps / 1e3
    after = thread_cpu_ns()
    collective_us = collective_share_ns(threads, after) / steps / 1e3
    return {"process_us": process_us,
            "threads_us": per_thread_us(threads, after, steps),
            "own_us": process_us - collective_us,
            "collective_threads_us": collective_us,
            "thread_us": (time.thread_time_ns() - thread) / steps / 1e3,
            "wall_us": (time.perf_counter_ns() - wall) / steps / 1e3,
            "instructions": None if counted is None or ended is None
            else (ended - counted) / steps}


def tiny_step_parts(net: Any) -> tuple[Any, Any, Any, Any]:
    """The optimizer, loss and one-row batch of the fixed-cost step (``net``: the MLP with
    layers two wide), on one thread: what :func:`tiny_step_us` times and ``_step_trace``
    counts, so both read the same step."""
    import torch

    torch.set_num_threads(1)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    return opt, torch.nn.CrossEntropyLoss(), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long)


def tiny_step_us(net: Any, steps: int, reps: int) -> float:
    """The training thread's CPU microseconds per step of ``net`` (the benchmark's MLP with
    layers two wide: the same parameters and hooks, next to no arithmetic), fastest of ``reps``
    loops of ``steps``.  What a run adds to such a step is what it adds to any step of that
    model: a fixed cost, read here where nothing else hides it."""
    opt, loss_fn, xb, yb = tiny_step_parts(net)
    fastest = float("inf")
    for _ in range(reps):
        started = time.thread_time_ns()
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(net(xb), yb).backward()
            opt.step()
        fastest = min(fastest, (time.thread_time_ns() - started) / steps / 1e3)
    return fastest


def timed_device_loop(net: Any, steps: int, batch: int, profile: bool = False,
                      inputs: int = 64, classes: int = 10) -> dict[str, Any]:
    """``net`` trained ``steps`` steps on one batch kept on its device, after 10 unmeasured ones:
    per-step wall and CPU microseconds of this process and thread.  On a GPU a small model's
    step is bound by the host (launches, hooks), so what a run adds shows.  With ``profile``
    the loop runs under cProfile and ``top`` lists the functions with at least 0.2 us of
    their own per step (the profiler's own cost included, alike in every place)."""
    import cProfile
    import pstats

    import torch

    device = next(net.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    g = torch.Generator(device=device).manual_seed(1)
    xb = torch.randn(batch, inputs, device=device, generator=g)
    yb = torch.randint(0, classes, (batch,), device=device, generator=g)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()

    for _ in range(10):
        step()
    sync()
    profiler = cProfile.Profile() if profile else None
    wall, process, thread = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
    if profiler is not None:
        profiler.enable()
    for _ in range(steps):
        step()
    sync()
    if profiler is not None:
        profiler.disable()
    figure: dict[str, Any] = {
        "wall_us": (time.perf_counter_ns() - wall) / steps / 1e3,
        "process_us": (time.process_time_ns() - process) / steps / 1e3,
        "thread_us": (time.thread_time_ns() - thread) / steps / 1e3}
    if profiler is not None:
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        rows = sorted(((tottime, calls, f"{os.path.basename(f)}:{line}:{name}")
                       for (f, line, name), (_, calls, tottime, _, _) in stats.items()
                       if tottime / steps >= 0.2e-6), reverse=True)[:200]
        figure["top"] = [{"function": where, "us": tottime / steps * 1e6, "calls": calls / steps}
                         for tottime, calls, where in rows]
    return figure
