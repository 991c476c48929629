"""Collectives between engines: the ``Communicator`` interface, its errors (defined in
:mod:`._comm_errors`, which every transport imports) and an in-process fake.

Every collective works *in place* on a list of arrays (torch tensors and/or numpy arrays), has a
deadline, and can be aborted from another thread.  Transports:

- :class:`ThreadCommunicator` (here): threads in one process, for testing sync strategies in
  milliseconds;
- ``ShmCommunicator`` (:mod:`._shm`): POSIX shared memory between processes on one host;
- ``TorchCommunicator`` (:mod:`._comm_torch`): torch.distributed (gloo, nccl), any hosts;
- ``MpiCommunicator`` (:mod:`._comm_mpi`): mpi4py, where engines run under MPI.

The last two are importable from this module too; they are loaded on first use so that importing
this module never imports torch or initialises MPI.

``bytes_sent`` counts the payload a bandwidth-optimal algorithm sends from each rank, whatever the
transport does internally, so "loss against bytes communicated" plots compare across transports:
an allreduce of ``N`` bytes on ``n`` ranks adds ``N * 2(n-1)/n``, a broadcast adds ``N`` on the
source only, a barrier adds nothing.

Example::

    >>> import numpy as np, threading
    >>> comms = make_thread_communicators(2)
    >>> xs = [np.full(3, float(c.rank + 1)) for c in comms]
    >>> ts = [threading.Thread(target=c.allreduce, args=([x], "mean")) for c, x in zip(comms, xs)]
    >>> for t in ts: t.start()
    >>> for t in ts: t.join()
    >>> xs[0].tolist(), xs[1].tolist()
    ([1.5, 1.5, 1.5], [1.5, 1.5, 1.5])
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol, runtime_checkable

import numpy as np

# re-exported: the helpers live in ._comm_util so that transports can share them
from ._comm_errors import (CollectiveAborted, CollectiveError, CollectiveMismatch,  # noqa: F401
                           CollectiveTimeout, PeerDied)
from ._comm_util import (OPS, Backoff, allreduce_bytes, as_list, check_op, describe,  # noqa: F401
                         host_views, process_alive, process_start_time)

__all__ = [
    "OPS", "Communicator", "CollectiveError", "CollectiveTimeout", "PeerDied", "CollectiveAborted",
    "CollectiveMismatch", "ThreadCommunicator", "make_thread_communicators", "TorchCommunicator",
    "MpiCommunicator",
]


@runtime_checkable
class Communicator(Protocol):
    """What sync strategies and the user-facing collectives need from a transport.

    Every rank passes the same structure (count, dtypes, sizes) in the same order; an array may
    appear twice but arrays must not partially overlap.  After any :class:`CollectiveError` the
    communicator is broken (ranks disagree on where they are): every later call raises at once,
    and the owner builds a new one.
    """

    rank: int
    world_size: int
    bytes_sent: int

    def allreduce(self, arrays: Any, op: str = "sum") -> None:
        """Reduce ``arrays`` (a list of tensors/arrays, or one) across ranks, in place."""

    def broadcast(self, arrays: Any, src: int = 0) -> None:
        """Overwrite ``arrays`` on every rank with rank ``src``'s values."""

    def barrier(self) -> None:
        """Return once every rank has called ``barrier``."""

    def abort(self, reason: str) -> None:
        """Make a collective in progress (in another thread) raise :class:`CollectiveAborted`."""

    def close(self) -> None:
        """Release the transport's resources; idempotent."""


# ---------------------------------------------------------------------------------------------
# in-process fake


class _Exchange:
    """What a set of thread communicators share: deposits per collective, progress, failures."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.cond = threading.Condition()
        self.slots: dict[int, dict[int, tuple[str, list[np.ndarray]]]] = {}
        self.readers: dict[int, int] = {}
        self.completed = [0] * world_size
        self.failed: dict[int, tuple[int, str]] = {}  # rank -> (collective it gave up in, why)


class ThreadCommunicator:
    """A communicator for ranks that are threads of one process; build with
    :func:`make_thread_communicators`.  Semantics (in-place, deadlines, abort releasing peers,
    mismatch detection, bit-identical results on every rank) match the real transports."""

    def __init__(self, exchange: _Exchange, rank: int, timeout_s: float = 30.0) -> None:
        self._ex = exchange
        self.rank = rank
        self.world_size = exchange.world_size
        self.timeout_s = timeout_s
        self.bytes_sent = 0
        self._seq = 0
        self._abort_reason: str | None = None
        self._broken: CollectiveError | None = None
        self._in_flight = False

    def allreduce(self, arrays: Any, op: str = "sum") -> None:
        """Reduce in place; every rank sums in rank order, so results are bit-identical."""
        views, writebacks = host_views(as_list(arrays))
        ufunc = check_op(op, [v.dtype for v in views])
        sig = f"allreduce/{op}/" + ",".join(f"{v.dtype}:{v.size}" for v in views)
        nbytes = sum(v.nbytes for v in views)
        peers = self._exchange(sig, describe("allreduce", nbytes, op), [v.copy() for v in views])
        for i, view in enumerate(views):
            acc = peers[0][i].copy()
            for contribution in peers[1:]:
                ufunc(acc, contribution[i], out=acc)
            if op == "mean":
                acc /= self.world_size
            np.copyto(view, acc)
        for writeback in writebacks:
            writeback()
        self.bytes_sent += allreduce_bytes(nbytes, self.world_size)

    def broadcast(self, arrays: Any, src: int = 0) -> None:
        """Copy rank ``src``'s arrays into every rank's arrays."""
        views, writebacks = host_views(as_list(arrays), reduce=False)
        sig = f"broadcast/{src}/" + ",".join(f"{v.dtype}:{v.size}" for v in views)
        nbytes = sum(v.nbytes for v in views)
        payload = [v.copy() for v in views] if self.rank == src else []
        peers = self._exchange(sig, describe("broadcast", nbytes, f"src={src}"), payload)
        if self.rank != src:
            for view, value in zip(views, peers[src]):
                np.copyto(view, value)
            for writeback in writebacks:
                writeback()
        else:
            self.bytes_sent += nbytes

    def barrier(self) -> None:
        """Wait for every rank."""
        self._exchange("barrier", "barrier()", [])

    def abort(self, reason: str) -> None:
        """Release this rank's collective in progress and tell the peers this rank gave up."""
        with self._ex.cond:
            self._abort_reason = reason
            at = self._seq if self._in_flight else self._seq + 1
            self._ex.failed.setdefault(self.rank, (at, f"aborted: {reason}"))
            self._ex.cond.notify_all()

    def close(self) -> None:
        """Nothing to release; later calls raise."""
        self._broken = self._broken or CollectiveAborted("communicator closed")

    def _exchange(self, sig: str, what: str, payload: list) -> list[list[np.ndarray]]:
        if self._broken is not None:
            raise type(self._broken)(f"communicator unusable after: {self._broken}")
        if self._abort_reason is not None:
            self._broken = CollectiveAborted(f"rank {self.rank} aborted: {self._abort_reason}",
                                             [self.rank], what)
            raise self._broken
        ex, n = self._ex, self.world_size
        self._seq += 1
        seq, deadline = self._seq, time.monotonic() + self.timeout_s
        with ex.cond:
            entry = ex.slots.setdefault(seq, {})
            entry[self.rank] = (sig, payload)
            ex.cond.notify_all()
            self._in_flight = True
            try:
                while len(entry) < n:
                    self._check_waiting(seq, what, entry, deadline)
                    ex.cond.wait(max(0.0, min(deadline - time.monotonic(), 0.1)))
                self._check_signatures(entry, what)
                self._check_gave_up(seq, what, range(n))  # arrived, then gave up: we are late
            finally:
                self._in_flight = False
            ex.readers[seq] = ex.readers.get(seq, 0) + 1
            if ex.readers[seq] == n:  # the last reader frees the slot
                del ex.slots[seq], ex.readers[seq]
            ex.completed[self.rank] = seq
            return [entry[r][1] for r in range(n)]

    def _check_waiting(self, seq: int, what: str, entry: dict, deadline: float) -> None:
        ex = self._ex
        missing = [r for r in range(self.world_size) if r not in entry]
        err: CollectiveError | None = None
        if self._abort_reason is not None:
            err = CollectiveAborted(f"{what} #{seq} aborted on rank {self.rank}: "
                                    f"{self._abort_reason}", [self.rank], what)
        elif time.monotonic() > deadline:
            last = ", ".join(f"rank {r} (last completed #{ex.completed[r]})" for r in missing)
            err = CollectiveTimeout(f"{what} #{seq} timed out after {self.timeout_s:g} s on rank "
                                    f"{self.rank}; not arrived: {last}", missing, what)
        if err is not None:
            self._fail(err)
        self._check_gave_up(seq, what, missing)

    def _check_gave_up(self, seq: int, what: str, ranks: Any) -> None:
        failed = self._ex.failed
        bad = [r for r in ranks if r != self.rank and r in failed and failed[r][0] <= seq]
        if bad:
            reasons = "; ".join(f"rank {r} {failed[r][1]}" for r in bad)
            self._fail(CollectiveAborted(f"{what} #{seq} on rank {self.rank} released: {reasons}",
                                         bad, what))

    def _check_signatures(self, entry: dict, what: str) -> None:
        mine = entry[self.rank][0]
        odd = [r for r in range(self.world_size) if entry[r][0] != mine]
        if odd:
            detail = "; ".join(f"rank {r}: {entry[r][0]}" for r in odd)
            self._fail(CollectiveMismatch(f"rank {self.rank} entered {mine} but {detail}", odd,
                                          what))

    def _fail(self, err: CollectiveError) -> None:
        self._broken = err
        self._ex.failed.setdefault(self.rank, (self._seq, f"failed: {err}"))
        self._ex.cond.notify_all()
        raise err


def make_thread_communicators(n: int, timeout_s: float = 30.0) -> list[ThreadCommunicator]:
    """``n`` communicators sharing one in-process exchange; run rank ``i`` in its own thread.

    Example::

        >>> a, b = make_thread_communicators(2)
        >>> (a.rank, b.rank, a.world_size)
        (0, 1, 2)
    """
    if n < 1:
        raise ValueError(f"world size must be >= 1, got {n}")
    exchange = _Exchange(n)
    return [ThreadCommunicator(exchange, r, timeout_s) for r in range(n)]


def __getattr__(name: str) -> Any:
    # Heavy transports load on first use: importing this module must not import torch or MPI.
    if name == "TorchCommunicator":
        from ._comm_torch import TorchCommunicator
        return TorchCommunicator
    if name == "MpiCommunicator":
        from ._comm_mpi import MpiCommunicator
        return MpiCommunicator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
