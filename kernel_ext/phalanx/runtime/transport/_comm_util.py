"""Helpers shared by the communicators: input checks, numpy views, liveness, waiting.

No torch or MPI import here: torch is only looked up if the caller already imported it.

Example::

    >>> import numpy as np
    >>> views, writebacks = host_views([np.zeros((2, 3))])
    >>> views[0].shape, writebacks
    ((6,), [])
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

OPS = ("sum", "mean", "max", "min")
_UFUNCS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}


def as_list(arrays: Any) -> list:
    """``arrays`` as a list: one tensor/array is wrapped, a list or tuple is copied."""
    if isinstance(arrays, (list, tuple)):
        return list(arrays)
    return [arrays]


def check_op(op: str, dtypes: Sequence[np.dtype] = ()) -> Any:
    """Validate ``op`` (and that ``mean`` only meets floating dtypes); returns its numpy ufunc."""
    if op not in _UFUNCS:
        raise ValueError(f"unknown reduction op {op!r}; expected one of {', '.join(OPS)}")
    if op == "mean":
        bad = sorted({str(d) for d in dtypes if d.kind not in "fc"})
        if bad:
            raise TypeError(f"op='mean' needs floating-point arrays, got {', '.join(bad)}; "
                            "use op='sum' and divide yourself")
    return _UFUNCS[op]


def host_views(arrays: list, reduce: bool = True) -> tuple[list[np.ndarray], list[Callable[[], None]]]:
    """Flat writable numpy views of CPU tensors / numpy arrays, plus write-backs for copies.

    A contiguous array or CPU tensor is viewed without a copy; anything else (non-contiguous,
    CUDA) is staged through a host copy that the returned write-back puts back in place.
    Tensors whose dtype numpy lacks (bfloat16) are staged as float32 for a reduction (rounded
    back once: on two ranks the result is bit-identical to gloo's) and as raw 16-bit words
    when ``reduce`` is false (a broadcast moves bytes).
    """
    views: list[np.ndarray] = []
    writebacks: list[Callable[[], None]] = []
    for x in arrays:
        if isinstance(x, np.ndarray):
            if not x.flags.writeable:
                raise ValueError("collectives work in place: got a read-only numpy array")
            if x.flags.c_contiguous:
                views.append(x if x.ndim == 1 else x.reshape(-1))
                continue
            tmp = np.ascontiguousarray(x)
            writebacks.append(functools.partial(np.copyto, x, tmp))
            views.append(tmp.reshape(-1))
        elif _is_tensor(x):
            views.append(_tensor_view(x, writebacks, reduce))
        else:
            raise TypeError("collectives take torch tensors or numpy arrays, got "
                            f"{type(x).__name__}")
    return views, writebacks


def _is_tensor(x: Any) -> bool:
    # torch is only looked up if the caller already imported it: no tensor can exist otherwise.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _tensor_view(t: Any, writebacks: list, reduce: bool = True) -> np.ndarray:
    if t.requires_grad:  # .numpy() refuses those; writing through the view bypasses autograd
        t = t.detach()
    torch = sys.modules["torch"]
    if t.dtype == torch.bfloat16:
        if reduce:
            wire = t.to("cpu", torch.float32)
            writebacks.append(lambda t=t, wire=wire: t.copy_(wire))
        else:
            wire = t.to("cpu", copy=True).contiguous().view(torch.int16)
            writebacks.append(lambda t=t, wire=wire: t.copy_(wire.view(torch.bfloat16)))
        return wire.numpy().reshape(-1)
    if t.is_cpu and t.is_contiguous():
        try:
            view = t.numpy()
            return view if view.ndim == 1 else view.reshape(-1)
        except TypeError as exc:  # bfloat16 and friends have no numpy dtype
            raise TypeError(f"dtype {t.dtype} is not supported by this transport; "
                            "use TorchCommunicator or cast to float32") from exc
    tmp = t.to("cpu", copy=True).contiguous()
    writebacks.append(lambda t=t, tmp=tmp: t.copy_(tmp))
    return tmp.numpy().reshape(-1)


def allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a bandwidth-optimal allreduce of ``nbytes`` (the busbw factor)."""
    return (2 * (world_size - 1) * nbytes) // world_size if world_size > 1 else 0


def describe(kind: str, nbytes: int, detail: str = "") -> str:
    """A short human description of a collective, e.g. ``allreduce(sum, 4.0 MiB)``."""
    size = f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes} B"
    return f"{kind}({detail + ', ' if detail else ''}{size})"


def process_alive(pid: int, start_time: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie; same process if ``start_time`` from /proc is given).

    ``os.kill(pid, 0)`` alone reports a killed child that its parent has not reaped yet as alive,
    which is exactly the state a SIGKILLed sibling engine sits in; /proc tells them apart.
    """
    stat = _proc_stat(pid)
    if stat is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not os.path.isdir("/proc")  # /proc exists but has no entry: gone
    state, started = stat
    if state in ("Z", "X", "x"):
        return False
    return start_time is None or start_time == started


def process_start_time(pid: int) -> int:
    """The kernel's start time of ``pid`` (clock ticks since boot), 0 where unknown."""
    stat = _proc_stat(pid)
    return stat[1] if stat else 0


def _proc_stat(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()  # the command name may hold spaces
    return fields[0].decode(), int(fields[19])


class Backoff:
    """Spin, then yield, then nap longer and longer: cheap when a wait is short, idle when long.

    Two ranks on two cores must not starve each other, so spinning is capped at ``spin_s``.

    Example::

        >>> b = Backoff(deadline=time.monotonic() + 1)
        >>> b.pause() is None
        True
    """

    def __init__(self, deadline: float, spin_s: float = 50e-6, yield_s: float = 2e-3,
                 max_nap_s: float = 1e-3) -> None:
        self.deadline = deadline
        self.start = time.perf_counter()
        self.spin_until = self.start + spin_s
        self.yield_until = self.start + yield_s
        self.nap = 10e-6
        self.max_nap = max_nap_s

    def pause(self) -> None:
        """Wait a little, longer each call once past the spin and yield phases."""
        now = time.perf_counter()
        if now < self.spin_until:
            return
        if now < self.yield_until:
            os.sched_yield()
            return
        time.sleep(self.nap)
        self.nap = min(self.nap * 2, self.max_nap)

    def expired(self) -> bool:
        now = time.monotonic()
        return now > self.deadline and not DEADLINES.extend(self, now)


class DeadlineHold:
    """While a rank of the run is paused in a debugger, collective deadlines do not run out.

    The kernel holds the deadlines of every other rank while a person types at one rank's
    ``(Pdb)`` (and releases them when the debugger continues): a peer waiting in a collective
    keeps waiting, and once released gets its whole timeout again.  Consulted only once a wait
    has passed its deadline, so a collective pays nothing for it.

    Example::

        >>> DEADLINES.hold(True); DEADLINES.held
        True
        >>> DEADLINES.hold(False); DEADLINES.held
        False
    """

    def __init__(self) -> None:
        self.held = False
        self.released_at: float | None = None  # monotonic

    def hold(self, held: bool) -> None:
        if self.held and not held:
            self.released_at = time.monotonic()
        self.held = held

    def extend(self, backoff: Backoff, now: float) -> bool:
        """Whether ``backoff``'s passed deadline is moved on (held, or released since it began)."""
        # the wait's own timeout: this is first called when it ran out
        span = backoff.__dict__.setdefault("span", time.perf_counter() - backoff.start)
        if self.held:
            backoff.deadline = now + min(span, 1.0)  # looked at again soon
            return True
        if self.released_at is not None and now < self.released_at + span:
            backoff.deadline = self.released_at + span
            return True
        return False


DEADLINES = DeadlineHold()  # one per process: an engine process is one rank
