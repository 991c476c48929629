"""Layout helpers of :mod:`._shm`: cached allreduce plans, arrays seen as one, signatures.

Example::

    >>> import numpy as np
    >>> flat = Flat([np.arange(3.0), np.arange(2.0)])
    >>> [(v.tolist(), pos) for v, pos in flat.spans(2, 4)]
    [([2.0], 0), ([0.0], 1)]
"""

from __future__ import annotations

import bisect
import zlib
from typing import Any, Iterator

import numpy as np

from ._comm_util import allreduce_bytes, check_op, describe

OPS = ("sum", "mean", "max", "min")
ALIGN = 64  # every array starts on its own cache line in a slot
_KIND = {"rendezvous": 1, "barrier": 2, "allreduce": 3, "broadcast": 4}


class Plan:
    """What stays the same between calls with one layout: checks, signature, slot slices."""

    __slots__ = ("op", "ufunc", "nbytes", "sent", "what", "sig", "small", "slices")

    def __init__(self, comm: Any, views: list[np.ndarray], op: str) -> None:
        self.op = op
        self.ufunc = check_op(op, [v.dtype for v in views])
        self.nbytes = sum(v.nbytes for v in views)
        self.sent = allreduce_bytes(self.nbytes, comm.world_size)  # bytes_sent per call
        self.what = describe("allreduce", self.nbytes, op)
        dtypes = "".join(dict.fromkeys(v.dtype.char for v in views))
        detail = OPS.index(op) | (zlib.crc32(dtypes.encode()) << 2)
        self.sig = signature("allreduce", detail, self.nbytes)
        self.small = sum(padded(v.nbytes) for v in views) <= comm.small_bytes
        self.slices: list[list[list[np.ndarray]]] = [[], []]
        if self.small and comm.world_size > 1:
            for parity in (0, 1):
                off = 0
                for v in views:
                    at = off // v.itemsize
                    self.slices[parity].append([comm._slot(r, parity, v.dtype)[at:at + v.size]
                                                for r in range(comm.world_size)])
                    off += padded(v.nbytes)


class LastCall:
    """The last small allreduce of one array, to repeat it without building views and plans.

    A training loop reduces the same buffer or tensor step after step; :meth:`view_of` tells in a
    few attribute reads whether ``arrays`` is that call again and returns the flat view to reduce:

    - a numpy array: any C-contiguous writable one of the same dtype and size (it is its own
      view; nothing is kept of it);
    - a tensor: the same tensor object, still at the same address with the same element count,
      dtype and contiguity (its numpy view is kept with it: ``Tensor.numpy()`` costs 0.9 us).

    Anything else (other sizes, several arrays, copies staged for CUDA, bfloat16 or strided
    memory) answers ``None`` and takes the general path, which records a new ``LastCall``.

    Example::

        >>> a = np.zeros(4, np.float32)
        >>> last = LastCall(a, "sum", a, plan=None)
        >>> last.view_of([np.ones(4, np.float32)], "sum").tolist(), last.view_of(a, "max")
        ([1.0, 1.0, 1.0, 1.0], None)
    """

    __slots__ = ("op", "dtype", "size", "plan", "tensor", "ptr", "tdtype", "view")

    def __init__(self, arrays: Any, op: str, view: np.ndarray, plan: Any) -> None:
        self.op, self.dtype, self.size, self.plan = op, view.dtype, view.size, plan
        x = arrays[0] if isinstance(arrays, (list, tuple)) else arrays
        self.tensor: Any = None  # a torch.Tensor, kept with its numpy view
        self.view: np.ndarray | None = None
        self.tdtype: Any = None
        self.ptr = 0
        if not isinstance(x, np.ndarray):  # a tensor: only called on one viewed without a copy
            self.tensor, self.ptr, self.tdtype, self.view = x, x.data_ptr(), x.dtype, view

    def view_of(self, arrays: Any, op: str) -> np.ndarray | None:
        """The flat view to reduce if ``arrays`` repeats this call, else ``None``."""
        x = arrays
        if type(x) is list or type(x) is tuple:
            if len(x) != 1:
                return None
            x = x[0]
        if op != self.op:
            return None
        if type(x) is np.ndarray:
            if x.dtype is not self.dtype or x.size != self.size:
                return None
            flags = x.flags
            if not (flags.c_contiguous and flags.writeable):
                return None
            return x if x.ndim == 1 else x.reshape(-1)
        if (x is self.tensor and x.data_ptr() == self.ptr and x.numel() == self.size
                and x.dtype is self.tdtype and x.is_contiguous()):
            return self.view
        return None


class Flat:
    """A list of 1-D arrays seen as one concatenated array, without copying them together."""

    def __init__(self, views: list[np.ndarray]) -> None:
        self.views = [v for v in views if v.size]
        self.starts = [0]
        for v in self.views:
            self.starts.append(self.starts[-1] + v.size)
        self.size = self.starts[-1]

    def spans(self, a: int, b: int) -> Iterator[tuple[np.ndarray, int]]:
        """Pieces of ``[a, b)`` as (view slice, offset of the slice from ``a``)."""
        if len(self.views) == 1:
            yield self.views[0][a:b], 0
            return
        i, at = bisect.bisect_right(self.starts, a) - 1, a
        while at < b:
            start, view = self.starts[i], self.views[i]
            end = min(b, start + view.size)
            yield view[at - start:end - start], at - a
            at, i = end, i + 1

    def copy_to(self, a: int, b: int, dst: np.ndarray) -> None:
        """``dst[:b-a] = self[a:b]``."""
        for v, pos in self.spans(a, b):
            dst[pos:pos + v.size] = v

    def copy_from(self, a: int, b: int, src: np.ndarray) -> None:
        """``self[a:b] = src[:b-a]``."""
        for v, pos in self.spans(a, b):
            v[...] = src[pos:pos + v.size]


def group_by_dtype(views: list[np.ndarray]) -> dict[np.dtype, list[np.ndarray]]:
    groups: dict[np.dtype, list[np.ndarray]] = {}
    for v in views:
        if v.size:
            groups.setdefault(v.dtype, []).append(v)
    return groups


def distinct(views: list[np.ndarray]) -> list[np.ndarray]:
    """``views`` without repeats of the same memory (same start and length)."""
    seen: set[tuple[int, int]] = set()
    out = []
    for v in views:
        key = (v.__array_interface__["data"][0], v.nbytes)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


def split(length: int, n: int, align: int) -> list[tuple[int, int]]:
    """``[0, length)`` in ``n`` aligned parts (the last ones may be short or empty)."""
    step = -(-length // n)
    step = -(-step // align) * align
    return [(min(j * step, length), min((j + 1) * step, length)) for j in range(n)]


def padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def signature(kind: str, detail: int, nbytes: int) -> int:
    """One int64 saying which collective a rank entered: kind, op/src/dtypes, size."""
    return (_KIND[kind] << 60) | ((detail & 0xFFF) << 48) | (nbytes & ((1 << 48) - 1))


def explain(sig: int) -> str:
    kinds = {v: k for k, v in _KIND.items()}
    kind, detail, nbytes = kinds.get(sig >> 60, "?"), (sig >> 48) & 0xFFF, sig & ((1 << 48) - 1)
    return f"{kind} of {nbytes} B (detail {detail})"
