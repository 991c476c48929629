"""``MpiCommunicator``: the :class:`~._comm.Communicator` interface over mpi4py.

For engines started under MPI (ipyparallel's MPI launcher).  Works on numpy views of CPU tensors
and numpy arrays, in place (``MPI.IN_PLACE``); several arrays of one dtype are packed into one
buffer so they cost one collective.

Collectives are non-blocking (``Iallreduce``, ``Ibcast``, ``Ibarrier``) and the request is
tested in a loop, which also drives MPI's progress, so the wait honours the deadline and
:meth:`abort`.  MPI cannot cancel a collective: after a timeout or abort the communicator is
unusable (the job is usually torn down).  MPI does not say which ranks failed to arrive, so
:class:`CollectiveTimeout` carries no ranks; a dead peer normally makes the MPI launcher end the
whole job.

Example (under ``mpiexec -n 2``)::

    from mpi4py import MPI
    comm = MpiCommunicator(MPI.COMM_WORLD, timeout_s=30)
    comm.allreduce([w], op="mean")
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ._comm_errors import CollectiveAborted, CollectiveError, CollectiveTimeout
from ._comm_util import Backoff, allreduce_bytes, as_list, check_op, describe, host_views

__all__ = ["MpiCommunicator"]

_MPI_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


class MpiCommunicator:
    """Collectives on an mpi4py communicator with deadlines and abort.

    Example::

        comm = MpiCommunicator(MPI.COMM_WORLD, timeout_s=60)
        comm.broadcast([params], src=0)
    """

    def __init__(self, comm: Any = None, timeout_s: float = 60.0) -> None:
        self._comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self._comm.Get_rank()
        self.world_size = self._comm.Get_size()
        self.timeout_s = timeout_s
        self.bytes_sent = 0
        self._done = 0
        self._abort_reason: str | None = None
        self._broken: CollectiveError | None = None
        self._stuck: list = []

    def allreduce(self, arrays: Any, op: str = "sum") -> None:
        """Reduce in place across ranks (``op`` in sum, mean, max, min).

        Example::

            comm.allreduce(np_array, op="max")
        """
        views, writebacks = host_views(as_list(arrays))
        check_op(op, [v.dtype for v in views])
        packs = _pack(views)
        nbytes = sum(p.buf.nbytes for p in packs)
        what = describe("allreduce", nbytes, op)
        self._run(what, lambda: [self._comm.Iallreduce(MPI.IN_PLACE, p.buf, op=_MPI_OPS[op])
                                 for p in packs])
        for p in packs:
            if op == "mean":
                np.true_divide(p.buf, self.world_size, out=p.buf)
            p.unpack()
        for writeback in writebacks:
            writeback()
        self.bytes_sent += allreduce_bytes(nbytes, self.world_size)

    def broadcast(self, arrays: Any, src: int = 0) -> None:
        """Overwrite ``arrays`` on every rank with rank ``src``'s.

        Example::

            comm.broadcast([coef, intercept], src=0)
        """
        views, writebacks = host_views(as_list(arrays))
        # bytes, not typed: one buffer for every dtype
        packs = _pack([v.view(np.uint8) for v in views])
        nbytes = sum(p.buf.nbytes for p in packs)
        self._run(describe("broadcast", nbytes, f"src={src}"),
                  lambda: [self._comm.Ibcast(p.buf, root=src) for p in packs])
        if self.rank != src:
            for p in packs:
                p.unpack()
            for writeback in writebacks:
                writeback()
        else:
            self.bytes_sent += nbytes

    def barrier(self) -> None:
        """Return once every rank has entered ``barrier``."""
        self._run("barrier()", lambda: [self._comm.Ibarrier()])

    def abort(self, reason: str) -> None:
        """Make the wait in progress raise :class:`CollectiveAborted` (any thread may call)."""
        self._abort_reason = reason

    def close(self) -> None:
        """The MPI communicator belongs to the caller; only mark this object closed."""
        self._broken = self._broken or CollectiveAborted("communicator closed")

    def _run(self, what: str, issue: Callable[[], list]) -> None:
        """Issue the non-blocking requests and test them until done, aborted or past the
        deadline (then they stay in flight: the communicator is broken)."""
        if self._broken is not None:
            raise type(self._broken)(f"communicator unusable after: {self._broken}",
                                     self._broken.ranks, self._broken.op)
        if self._abort_reason is not None:
            self._broken = self._failure(what)
            raise self._broken
        # MPICH progresses shared-memory collectives only while we test, so spin longer
        backoff = Backoff(time.monotonic() + self.timeout_s, spin_s=500e-6, yield_s=5e-3)
        pending = issue()
        try:
            while pending:
                pending = [r for r in pending if not r.Test()]
                if pending and (self._abort_reason is not None or backoff.expired()):
                    raise self._failure(what)
                if pending:
                    backoff.pause()
        except BaseException as exc:  # ours, or Ctrl-C while testing
            self._stuck = pending  # MPI may still write into their buffers: keep them alive
            self._broken = exc if isinstance(exc, CollectiveError) else CollectiveAborted(
                f"rank {self.rank} interrupted in {what}: {type(exc).__name__}", [self.rank], what)
            raise
        self._done += 1

    def _failure(self, what: str) -> CollectiveError:
        number = self._done + 1
        if self._abort_reason is not None:
            return CollectiveAborted(f"{what} #{number} aborted on rank {self.rank}: "
                                     f"{self._abort_reason}", [self.rank], what)
        return CollectiveTimeout(f"{what} #{number} timed out after {self.timeout_s:g} s on rank "
                                 f"{self.rank}; MPI cannot tell which ranks did not arrive", [],
                                 what)


class _Packed:
    """Arrays of one dtype as one contiguous buffer (no copy for a single array)."""

    def __init__(self, views: list[np.ndarray]) -> None:
        self.views = views
        self.buf = views[0] if len(views) == 1 else np.concatenate(views)

    def unpack(self) -> None:
        if len(self.views) > 1:
            at = 0
            for v in self.views:
                v[...] = self.buf[at:at + v.size]
                at += v.size


def _pack(views: list[np.ndarray]) -> list[_Packed]:
    groups: dict[np.dtype, list[np.ndarray]] = {}
    for v in views:
        if v.size:
            groups.setdefault(v.dtype, []).append(v)
    return [_Packed(vs) for vs in groups.values()]
