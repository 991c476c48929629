"""Sleep until a word in shared memory changes, and wake such sleepers: Linux futexes via ctypes.

A rank waiting long for a peer (a slower backward pass, say) sleeps in the kernel on the peer's
sequence counter instead of napping in fixed steps: it wakes microseconds after the peer posts,
not up to a nap later, and burns no CPU meanwhile.  The futexes are *shared* (no
``FUTEX_PRIVATE_FLAG``) because the word lives in memory mapped by several processes.

Waits are always bounded (``timeout_s``) so callers can check abort flags, peer liveness and
deadlines between slices; a wake-up lost to a race therefore costs at most one slice.

Where futexes are unavailable (not Linux x86-64, no libc) :data:`AVAILABLE` is false and callers
fall back to napping.

Example::

    >>> import numpy as np
    >>> word = np.zeros(1, np.int64)
    >>> wait(word.ctypes.data, 1, 0.001) is None  # value is 0, not 1: returns at once
    True
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
from typing import Callable

_SYS_FUTEX = {"x86_64": 202, "amd64": 202}.get(platform.machine().lower())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_INT_MAX = 2**31 - 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_syscall() -> Callable[..., int] | None:
    if sys.platform != "linux" or _SYS_FUTEX is None:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall  # releases the GIL while it sleeps
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_syscall = _load_syscall()
AVAILABLE = _syscall is not None


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the 32-bit word at ``address`` equals ``expected`` (low 32 bits), at most
    ``timeout_s``; returns early when woken, interrupted, or if the word already differs."""
    ts = _Timespec(int(timeout_s), int((timeout_s % 1) * 1e9))
    _futex(address, _FUTEX_WAIT, ctypes.c_uint32(expected & 0xFFFFFFFF), ctypes.byref(ts))


def wake(address: int) -> None:
    """Wake every process sleeping in :func:`wait` on ``address``."""
    _futex(address, _FUTEX_WAKE, ctypes.c_int(_INT_MAX), None)


def waker(address: int) -> Callable[[], object]:
    """:func:`wake` for one ``address`` with its arguments built once: a poster calls it on the
    critical path of a collective (measured 1.7 us a call here against 3.1 us for :func:`wake`).

    Example::

        >>> import numpy as np
        >>> word = np.zeros(1, np.int64)
        >>> waker(word.ctypes.data)() == 0  # nobody sleeps there
        True
    """
    if _syscall is None or _SYS_FUTEX is None:
        raise RuntimeError("futexes are not available here: callers check AVAILABLE first")
    return functools.partial(_syscall, ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(address),
                             ctypes.c_int(_FUTEX_WAKE), ctypes.c_int(_INT_MAX), None, None,
                             ctypes.c_int(0))


def _futex(address: int, op: int, value: object, timeout: object) -> None:
    if _syscall is None or _SYS_FUTEX is None:
        raise RuntimeError("futexes are not available here: callers check AVAILABLE first")
    _syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_int(op), value,
             timeout, None, ctypes.c_int(0))
