"""Collectives for any training loop: ``allreduce``, ``broadcast``, ``barrier``.

They accept torch tensors (CPU or CUDA), numpy arrays, Python numbers and a dict of scalars (one
call for a whole distributed-validation summary).  Tensors and arrays are reduced in place and
returned, like torch.distributed; numbers and dicts come back as new objects.

:class:`Collectives` picks the transport per call: CUDA tensors go through torch.distributed
(NCCL or gloo), CPU data through MPI when the engines run under one ``mpiexec``, else shared
memory on one host, else torch.distributed.
"""

from __future__ import annotations

import contextlib
import numbers
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..run._engine_state import current_run

if TYPE_CHECKING:
    from ..run._group import GroupHandle
    from ..telemetry._timing import StepClock
    from ..transport._comm import Communicator

T = TypeVar("T")

_OPS = ("sum", "mean", "max", "min")


class Collectives:
    """A Communicator that routes every call to the best transport of the group."""

    def __init__(self, group: GroupHandle) -> None:
        self._group = group
        self.rank = group.spec.rank
        self.world_size = group.spec.world_size
        # every rank on one host: averaging is memory copies on the cores training uses
        self.one_host = len(set(group.spec.hosts)) <= 1
        self.clock: StepClock | None = None  # a StepClock: times each call (waiting vs moving bytes)

    def _timed(self) -> contextlib.AbstractContextManager[None]:
        return self.clock.collective() if self.clock is not None else contextlib.nullcontext()

    @property
    def bytes_sent(self) -> int:
        return sum(getattr(c, "bytes_sent", 0) for c in self._group.communicators())

    def _pick(self, arrays: list) -> Communicator:
        group = self._group
        comm: Communicator | None
        if any(getattr(a, "is_cuda", False) for a in arrays):
            comm = group.torch_comm
        else:
            comm = group.mpi_comm or group.shm_comm or group.torch_comm
        assert comm is not None   # a group has torch's until it is closed
        return comm

    # With one rank every collective is the identity: skip the transport entirely, so a
    # one-worker run costs what a plain loop costs.
    def allreduce(self, arrays: list, op: str = "sum") -> None:
        if self.world_size > 1:
            with self._timed():
                self._pick(arrays).allreduce(arrays, op=op)

    def broadcast(self, arrays: list, src: int = 0) -> None:
        if self.world_size > 1:
            with self._timed():
                self._pick(arrays).broadcast(arrays, src=src)

    def barrier(self) -> None:
        if self.world_size > 1:
            with self._timed():
                self._pick([]).barrier()

    def abort(self, reason: str) -> None:
        for comm in self._group.communicators():
            abort = getattr(comm, "abort", None)
            if abort is not None:
                abort(reason)

    def close(self) -> None:  # the group owns the transports
        return None


def allreduce(x: Any, op: str = "mean") -> Any:
    """Reduce ``x`` over all ranks with ``op`` (sum, mean, max, min).

    Example (inside ``%%distributed_fit``)::

        acc = allreduce({"correct": correct, "seen": seen}, op="sum")
    """
    if op not in _OPS:
        raise ValueError(f"allreduce op {op!r} is not one of {_OPS}")
    comm = _run_collectives()
    if isinstance(x, dict):
        return _reduce_dict(comm, x, op)
    if isinstance(x, numbers.Number):
        return _reduce_numbers(comm, [x], op)[0]
    comm.allreduce([_check_array(x, "allreduce")], op=op)
    return x


def broadcast(x: Any, src: int = 0) -> Any:
    """Give every rank rank ``src``'s value of ``x`` (tensor or array in place; numbers returned).

    Example::

        weights = broadcast(weights, src=0)
    """
    comm = _run_collectives()
    if not 0 <= src < comm.world_size:
        raise ValueError(f"broadcast src={src} is not a rank: ranks are 0..{comm.world_size - 1}")
    if isinstance(x, numbers.Number):
        import numpy as np

        buf = np.array([x], dtype=np.float64)
        comm.broadcast([buf], src=src)
        # back to the caller's kind of number (bool, int, float, a numpy scalar): concrete number
        # types take a value, though the ``numbers`` ABCs declare no constructor
        return cast("type[Any]", type(x))(buf[0])
    comm.broadcast([_check_array(x, "broadcast")], src=src)
    return x


def barrier() -> None:
    """Wait until every rank reaches this point."""
    _run_collectives().barrier()


def _run_collectives() -> Collectives:
    comm = current_run().collectives
    assert comm is not None   # set as the run starts
    return comm


def _reduce_numbers(comm: Collectives, values: list, op: str) -> list[float]:
    import numpy as np

    buf = np.array([float(_scalar(v)) for v in values], dtype=np.float64)
    comm.allreduce([buf], op=op)
    return [float(v) for v in buf]


def _reduce_dict(comm: Collectives, x: dict, op: str) -> dict:
    keys = sorted(x)  # same order on every rank
    values = _reduce_numbers(comm, [x[k] for k in keys], op)
    return dict(zip(keys, values))


def _scalar(v: object) -> float:
    if isinstance(v, numbers.Real):  # a complex number has no float value
        return float(v)
    if hasattr(v, "item"):
        return float(v.item())
    raise TypeError(f"allreduce needs real scalar values, got {type(v).__name__}")


def _check_array(x: T, what: str) -> T:
    if hasattr(x, "shape") and (hasattr(x, "dtype")):
        return x
    raise TypeError(f"{what} takes a torch tensor, a numpy array, a number or a dict of numbers; "
                    f"got {type(x).__name__}")
