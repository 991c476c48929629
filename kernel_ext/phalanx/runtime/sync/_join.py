"""Uneven inputs: ranks whose loops take different numbers of steps (DDP's ``Join``, for our hooks).

Every synchronisation point of zero-change mode (the end of a backward pass, a strategy's
``after_step`` that communicates) starts with one small *control round*: an int64 allreduce in
which each rank says whether it is still training, how many optimizer steps it took, how many
rows its shard has, and what kind of synchronisation it is about to do.

A rank whose cell body has returned calls :meth:`JoinControl.serve`: it keeps answering control
rounds as "joined" and shadows the synchronisation each round announces (zero gradients, or the
strategy's ``after_step`` with its own parameters) until a round in which no rank is training.
Then every rank takes the parameters of the rank that ran the most steps, so all ranks end with
the same model.  With ``mode="error"`` the first round that sees a finished rank next to a
training one raises :class:`UnevenInputsError` on every rank instead, naming each rank's step
count and shard size.

Gradient averages during a join divide by the number of ranks still training, so with equal
batch sizes the result equals one process on the concatenated batches (the partial last batch of
a longer shard is averaged over itself alone, as one process would).

Example (threads as ranks: rank 1 has one step less)::

    >>> import threading
    >>> from phalanx.runtime.transport._comm import make_thread_communicators
    >>> comms = make_thread_communicators(2)
    >>> seen = {}
    >>> def rank(comm, steps):
    ...     join = JoinControl(comm, mode="join", rows=10 * steps)
    ...     for step in range(steps):
    ...         join.round(KIND_GRADIENTS, step, steps_done=step)
    ...     seen[comm.rank] = join.serve(steps_done=steps, shadow=lambda kind, step: None).steps
    >>> ts = [threading.Thread(target=rank, args=(c, 3 - c.rank)) for c in comms]
    >>> for t in ts: t.start()
    >>> for t in ts: t.join()
    >>> seen[0], seen[1]
    ([3, 2], [3, 2])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

__all__ = ["JoinControl", "UnevenInputsError", "RoundInfo", "KIND_GRADIENTS", "KIND_CHECK",
           "UNEVEN_MODES", "mean_scale"]

UNEVEN_MODES = ("join", "error")
KIND_GRADIENTS = 1  # kinds 2 + i: the after_step of the run's i-th tracked strategy
KIND_CHECK = -1     # the check that the ranks agree (see _agreement): finished ranks skip it
_SLOT = 3  # per rank: training (0/1), optimizer steps taken, shard rows


class UnevenInputsError(RuntimeError):
    """Ranks ran out of data at different steps while ``--uneven error`` was set."""


@dataclass
class RoundInfo:
    """What a control round told every rank."""

    training: int                # ranks still training
    active: list[bool]           # per rank: still training
    kind: int                    # what the training ranks are about to do (0: nothing)
    step: int                    # their optimizer step
    steps: list[int]             # optimizer steps taken, per rank
    rows: list[int]              # shard rows per rank (-1: no --shard)

    @property
    def uneven(self) -> bool:
        return 0 < self.training < len(self.steps)


class JoinControl:
    """Control rounds on ``comm`` for one run; ``rows`` is this rank's shard size if known."""

    def __init__(self, comm: Any, mode: str = "join", rows: int | None = None) -> None:
        if mode not in UNEVEN_MODES:
            raise ValueError(f"uneven mode must be one of {', '.join(UNEVEN_MODES)}, got {mode!r}")
        self.comm, self.mode = comm, mode
        self.rank, self.world_size = comm.rank, comm.world_size
        self.rows = -1 if rows is None else int(rows)

    def round(self, kind: int, step: int, steps_done: int) -> RoundInfo:
        """A training rank's control round before a synchronisation of ``kind``."""
        info = self._exchange(True, kind, step, steps_done)
        if info.kind != kind:
            raise RuntimeError(f"rank {self.rank} is about to {_what(kind)} at step {step} but "
                               f"the other training ranks are not: they run different code paths")
        if info.uneven and self.mode == "error":
            raise UnevenInputsError(self.describe(info))
        return info

    def serve(self, steps_done: int, shadow: Callable[[int, int], None]) -> RoundInfo:
        """A finished rank answers rounds, calling ``shadow(kind, step)``, until all finished."""
        while True:
            info = self._exchange(False, 0, 0, steps_done)
            if info.training == 0:
                return info
            if self.mode == "error":
                raise UnevenInputsError(self.describe(info))
            shadow(info.kind, info.step)

    def describe(self, info: RoundInfo) -> str:
        """Each rank's steps and shard size, for the ``--uneven error`` message."""
        parts = []
        for r, (steps, rows) in enumerate(zip(info.steps, info.rows)):
            where = "still training after" if info.active[r] else "finished after"
            size = f"{rows} rows in its shard" if rows >= 0 else "no --shard data"
            parts.append(f"rank {r} {where} {steps} steps ({size})")
        return ("uneven inputs (--uneven error): the ranks ran out of data at different steps: "
                + "; ".join(parts) + ". Give every rank the same number of batches (for example "
                "drop the last partial batch), or leave --uneven at join to let finished ranks "
                "answer the others with zero gradients.")

    # -- internals -------------------------------------------------------------------------------

    def _exchange(self, training: bool, kind: int, step: int, steps_done: int) -> RoundInfo:
        n = self.world_size
        vec = np.zeros(_SLOT * n + 2, dtype=np.int64)
        vec[_SLOT * self.rank:_SLOT * (self.rank + 1)] = (int(training), steps_done, self.rows + 1)
        vec[_SLOT * n:_SLOT * n + 2] = (kind, step) if training else (0, 0)
        if n > 1:
            self.comm.allreduce([vec], op="sum")
        slots = vec[:_SLOT * n].reshape(n, _SLOT)
        training_ranks = int(slots[:, 0].sum())
        kind_sum, step_sum = (int(v) for v in vec[_SLOT * n:_SLOT * n + 2])
        if training_ranks and kind_sum % training_ranks:
            raise RuntimeError(f"rank {self.rank}: the training ranks announced different "
                               f"synchronisations in one round (they run different code paths)")
        return RoundInfo(training=training_ranks, active=[bool(a) for a in slots[:, 0]],
                         kind=kind_sum // training_ranks if training_ranks else 0,
                         step=step_sum // training_ranks if training_ranks else 0,
                         steps=[int(s) for s in slots[:, 1]], rows=[int(r) - 1 for r in slots[:, 2]])


def mean_scale(info: RoundInfo | None, world_size: int) -> float | None:
    """Joined ranks gave zeros: what rescales a world-size mean to a mean over the training
    ranks (None where every rank trains)."""
    if info is None or not info.uneven:
        return None
    return world_size / info.training


def _what(kind: int) -> str:
    if kind == KIND_CHECK:
        return "check that the ranks agree"
    return "average gradients" if kind == KIND_GRADIENTS else f"synchronise (kind {kind})"
