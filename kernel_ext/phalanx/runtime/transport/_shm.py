"""``ShmCommunicator``: allreduce, broadcast and barrier through POSIX shared memory on one host.

Each rank owns a segment (:mod:`._shm_segment`) with two data slots and a sequence counter that
peers poll.  Every synchronisation is "write into slot ``c % 2``, post ``c``, wait until every
peer posted ``c``".  Because every rank waits for all others at each point, when a rank writes for
point ``c + 1`` its peers have finished reading what it wrote for ``c - 1``: double buffering
with one counter, no second handshake.  (Stores are ordered on x86-64, which this relies on.)

Algorithms:

- *small* (everything fits ``small_bytes``, default 1 MiB): one sync point; every rank copies its
  arrays into its slot, then reduces all slots in rank order, so results are bit-identical on
  every rank; the layout of a repeated call is cached, and a call repeating the last one with a
  single contiguous array or tensor skips the general path's checks and views
  (:class:`~._shm_layout.LastCall`; a 1 KB tensor with its peer already there measured 3.1 us
  a call against 7.2 us on the general path, which views the tensor (2.2 us), checks the op,
  looks the plan up and walks lists of arrays);
- *large*, two ranks: per ``slot_bytes`` chunk (default 1 MiB: the chunk and its copies stay in
  cache), one sync point after which each rank adds the other's chunk to its own;
- *large*, three or more ranks: per chunk, reduce-scatter then allgather (two sync points), so
  the bytes each rank moves do not grow with the number of ranks.

Shared memory ordering: data is written before the counter is posted and read after it is seen;
x86-64 keeps stores (and loads) in order, which this relies on, so other architectures are
refused (use ``TorchCommunicator`` there).

Waiting, the deadline, abort and liveness checks live in :mod:`._shm_wait`: a dead peer raises
:class:`PeerDied` within tens of milliseconds, a missing one :class:`CollectiveTimeout` naming the
ranks and the last collective each completed.

Example (two processes on one host)::

    comm = ShmCommunicator("run42", rank, 2, timeout_s=30)
    comm.allreduce([model_grad_a, model_grad_b], op="mean")
    comm.close()
"""

from __future__ import annotations

import platform
import re
from typing import Any, Callable

import numpy as np

from . import _shm_futex as futex
from . import _shm_segment as seg_mod
from ._comm_errors import CollectiveAborted, CollectiveError
from ._comm_util import as_list, check_op, describe, host_views
from ._shm_layout import ALIGN, Flat, LastCall, Plan, distinct, group_by_dtype, signature, split
from ._shm_segment import W_DONE, Segment, attach_peers, cleanup_failed_rendezvous, segment_name
from ._shm_wait import SyncPointsMixin

__all__ = ["ShmCommunicator"]

DEFAULT_SLOT_BYTES = 1 << 20
DEFAULT_SMALL_BYTES = 1 << 20  # measured: one sync beats two up to the slot size


class ShmCommunicator(SyncPointsMixin):
    """Collectives between the processes of one host through POSIX shared memory.

    ``group_id`` names the group (letters, digits, ``._-``; fresh per group formation);
    ``peer_pids`` (optional, every rank's pid) lets the rendezvous notice a peer that dies before
    creating its segment; ``timeout_s`` bounds the rendezvous and every collective.

    Example::

        comm = ShmCommunicator("g1", rank=0, world_size=2, peer_pids=None, timeout_s=30)
        comm.allreduce(tensor, op="sum"); comm.barrier(); comm.close()
    """

    def __init__(self, group_id: str, rank: int, world_size: int,
                 peer_pids: list[int] | None = None, timeout_s: float = 60.0, *,
                 slot_bytes: int = DEFAULT_SLOT_BYTES,
                 small_bytes: int = DEFAULT_SMALL_BYTES) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,80}", group_id):
            raise ValueError(f"group_id must be 1-80 of [A-Za-z0-9_.-], got {group_id!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise RuntimeError(f"ShmCommunicator relies on x86-64 memory ordering; on "
                               f"{platform.machine()} use TorchCommunicator (gloo)")
        if slot_bytes < 4096 or slot_bytes % 4096:
            raise ValueError(f"slot_bytes must be a positive multiple of 4096, got {slot_bytes}")
        self.group_id, self.rank, self.world_size = group_id, rank, world_size
        self.timeout_s = timeout_s
        self.bytes_sent = 0
        self.slot_bytes, self.small_bytes = slot_bytes, min(small_bytes, slot_bytes)
        self._seq = 0  # sync points posted
        self._done = 0  # collectives completed
        self._abort_reason: str | None = None
        self._broken: CollectiveError | None = None
        self._abandoned = 0  # the sync point we gave up waiting in
        self._in_flight = self._close_requested = False
        self._segs: list[Segment] = []
        self._peers: list[tuple[int, Segment]] = []
        self._futex = futex.AVAILABLE  # sleep in the kernel on long waits (else nap)
        self._typed: dict[tuple, np.ndarray] = {}
        self._plans: dict[tuple, Plan] = {}
        self._last: LastCall | None = None  # the last single-array small allreduce
        if world_size > 1:
            self._rendezvous(peer_pids)

    # -- public collectives ----------------------------------------------------------------------

    def allreduce(self, arrays: Any, op: str = "sum") -> None:
        """Reduce ``arrays`` across ranks in place (``op`` in sum, mean, max, min).

        Example::

            comm.allreduce([w.grad for w in model.parameters()], op="mean")
        """
        last = self._last
        if last is not None:
            view = last.view_of(arrays, op)
            if view is not None:  # the last call again: its plan, no checks, no writeback
                self._collective(last.plan.what, self._allreduce_one, view, last.plan)
                self.bytes_sent += last.plan.sent
                return
        views, writebacks = host_views(as_list(arrays))
        check_op(op, [v.dtype for v in views])  # an empty array must be refused like the others
        views = [v for v in views if v.size]
        if self.world_size > 1 and views:
            if self._broken is not None:  # closed (no slots to plan in) or failed
                self._check_usable("allreduce")
            plan = self._plan(views, op)
            if plan.small:
                self._collective(plan.what, self._allreduce_small, views, plan, op)
                if len(views) == 1 and not writebacks:
                    self._last = LastCall(arrays, op, views[0], plan)
            else:
                self._collective(plan.what, self._allreduce_large, views, plan, op)
            self.bytes_sent += plan.sent
        for writeback in writebacks:
            writeback()

    def broadcast(self, arrays: Any, src: int = 0) -> None:
        """Overwrite ``arrays`` on every rank with rank ``src``'s values.

        Example::

            comm.broadcast([p.data for p in model.parameters()], src=0)
        """
        if not 0 <= src < self.world_size:
            raise ValueError(f"src {src} outside world size {self.world_size}")
        views, writebacks = host_views(as_list(arrays), reduce=False)
        flat = Flat([v.view(np.uint8) for v in views])
        if self.world_size > 1 and flat.size:
            what = describe("broadcast", flat.size, f"src={src}")
            sig = signature("broadcast", src, flat.size)
            self._collective(what, self._broadcast, flat, src, sig, what)
            if self.rank == src:
                self.bytes_sent += flat.size
        if self.rank != src:
            for writeback in writebacks:
                writeback()

    def barrier(self) -> None:
        """Return once every rank has entered ``barrier``."""
        if self.world_size > 1:
            self._collective("barrier()", self._sync, signature("barrier", 0, 0), "barrier()")

    def abort(self, reason: str) -> None:
        """Make the collective in progress raise :class:`CollectiveAborted` (any thread may call)
        and publish the reason at once, so peers waiting on this rank are released now even if
        this rank is not inside a collective."""
        self._abort_reason = reason
        segs = self._segs
        if segs and segs[self.rank].hdr[seg_mod.W_STATE] == seg_mod.STATE_OK:
            self._publish(seg_mod.STATE_FAILED, f"rank {self.rank} aborted: {reason}",
                          self._seq + 1)
            sleeping_on = segs[self.rank].hdr[seg_mod.W_SLEEP]
            if sleeping_on and self._futex:  # cut our own sleep short
                futex.wake(segs[sleeping_on - 1].seq_address)

    def close(self) -> None:
        """Tell peers we left (unless we already told them we failed), unlink and unmap;
        idempotent.  Called from another thread during a collective, it aborts that collective
        and the unmapping happens when it has returned."""
        if self._in_flight:
            self._close_requested = True
            self.abort("communicator closed")
            return
        if self._segs and self._segs[self.rank].hdr[seg_mod.W_STATE] == seg_mod.STATE_OK:
            self._publish(seg_mod.STATE_CLOSED, f"rank {self.rank} closed")
        segs, self._segs = self._segs, []
        self._typed.clear()
        self._plans.clear()
        self._last = None
        for seg in segs:
            if seg is segs[self.rank]:
                seg.unlink()
            seg.close()
        self._broken = self._broken or CollectiveAborted("communicator closed")

    def __enter__(self) -> "ShmCommunicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- algorithms -------------------------------------------------------------------------------

    def _plan(self, views: list[np.ndarray], op: str) -> Plan:
        """The cached layout of an allreduce; a training loop repeats the same few."""
        key = (op, *[(v.dtype, v.size) for v in views])
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 64:
                self._plans.clear()
            plan = self._plans[key] = Plan(self, views, op)
        return plan

    def _allreduce_small(self, views: list[np.ndarray], plan: Plan, op: str) -> None:
        parity, n, me, ufunc = (self._seq + 1) & 1, self.world_size, self.rank, plan.ufunc
        slices = plan.slices[parity]
        for v, per_rank in zip(views, slices):
            per_rank[me][...] = v
        self._sync(plan.sig, plan.what)
        for v, per_rank in zip(views, slices):
            # accumulate the slots in rank order, so every rank gets bit-identical results
            # (and arrays passed twice are still summed right)
            ufunc(per_rank[0], per_rank[1], out=v)
            for r in range(2, n):
                ufunc(v, per_rank[r], out=v)
            if op == "mean":
                np.true_divide(v, n, out=v)

    def _allreduce_one(self, v: np.ndarray, plan: Plan) -> None:
        """:meth:`_allreduce_small` of one array."""
        per_rank = plan.slices[(self._seq + 1) & 1][0]
        per_rank[self.rank][...] = v
        self._sync(plan.sig, plan.what)
        plan.ufunc(per_rank[0], per_rank[1], out=v)
        for r in range(2, self.world_size):
            plan.ufunc(v, per_rank[r], out=v)
        if plan.op == "mean":
            np.true_divide(v, self.world_size, out=v)

    def _allreduce_large(self, views: list[np.ndarray], plan: Plan, op: str) -> None:
        # chunks are copied in one at a time, so an array passed twice would be read after it
        # was reduced: reduce each distinct array once (overlapping views are not supported)
        for group in group_by_dtype(distinct(views)).values():
            if self.world_size == 2:
                self._allreduce_pairwise(group, plan, op)
            else:
                self._allreduce_group(group, plan, op)

    def _allreduce_pairwise(self, views: list[np.ndarray], plan: Plan, op: str) -> None:
        """Two ranks: per chunk, one sync and each rank adds the other's chunk to its own.

        ``a + b == b + a`` exactly in IEEE arithmetic, so both ranks get identical results; on
        two ranks this moves about as many bytes as reduce-scatter + allgather with half the
        synchronisations (measured ~5% faster from 8 MB here)."""
        flat, me, ufunc = Flat(views), self.rank, plan.ufunc
        dtype = views[0].dtype
        per_chunk = self.slot_bytes // dtype.itemsize
        for a in range(0, flat.size, per_chunk):
            b = min(a + per_chunk, flat.size)
            parity = (self._seq + 1) & 1
            mine = self._slot(me, parity, dtype)
            flat.copy_to(a, b, mine)
            self._sync(plan.sig, plan.what)
            theirs = self._slot(1 - me, parity, dtype)
            for v, pos in flat.spans(a, b):
                # own values from the slot copy (cache-hot), not ``v``: correct even if the
                # caller passed one array twice
                ufunc(mine[pos:pos + v.size], theirs[pos:pos + v.size], out=v)
                if op == "mean":
                    np.true_divide(v, 2, out=v)

    def _allreduce_group(self, views: list[np.ndarray], plan: Plan, op: str) -> None:
        """Three or more ranks: per chunk, reduce-scatter (each rank reduces its ``1/n`` part
        straight into the caller's memory) then allgather, two syncs; bytes per rank stay flat
        as ranks are added."""
        flat, n, me, ufunc = Flat(views), self.world_size, self.rank, plan.ufunc
        dtype = views[0].dtype
        per_chunk = self.slot_bytes // dtype.itemsize
        for a in range(0, flat.size, per_chunk):
            parts = split(min(per_chunk, flat.size - a), n, ALIGN // dtype.itemsize or 1)
            p_in = (self._seq + 1) & 1
            own = self._slot(me, p_in, dtype)
            for j, (lo, hi) in enumerate(parts):
                if j != me:
                    flat.copy_to(a + lo, a + hi, own[lo:hi])
            self._sync(plan.sig, plan.what)
            lo, hi = parts[me]
            out = self._slot(me, 1 - p_in, dtype)
            inputs = [self._slot(r, p_in, dtype) for r in range(n) if r != me]
            for v, pos in flat.spans(a + lo, a + hi):
                at = lo + pos
                for peer in inputs:
                    ufunc(v, peer[at:at + v.size], out=v)
                if op == "mean":
                    np.true_divide(v, n, out=v)
                out[at:at + v.size] = v
            self._sync(plan.sig, plan.what)
            for j, (lo, hi) in enumerate(parts):
                if j != me:
                    flat.copy_from(a + lo, a + hi, self._slot(j, 1 - p_in, dtype)[lo:hi])

    def _broadcast(self, flat: Flat, src: int, sig: int, what: str) -> None:
        for a in range(0, flat.size, self.slot_bytes):
            b = min(a + self.slot_bytes, flat.size)
            parity = (self._seq + 1) & 1
            if self.rank == src:
                flat.copy_to(a, b, self._segs[src].slots[parity][:b - a])
            self._sync(sig, what)
            if self.rank != src:
                flat.copy_from(a, b, self._segs[src].slots[parity][:b - a])

    def _collective(self, what: str, body: Callable[..., object], *args: Any) -> None:
        """Run one collective; any failure (or Ctrl-C) breaks this communicator and is published
        in our header so that peers waiting on us are released instead of timing out."""
        if self._broken is not None or self._abort_reason is not None:
            self._check_usable(what)
        self._in_flight = True
        try:
            body(*args)
            self._done += 1
            self._segs[self.rank].hdr[W_DONE] = self._done
        except BaseException as exc:
            err = exc if isinstance(exc, CollectiveError) else None
            self._broken = err or CollectiveAborted(f"rank {self.rank} interrupted in {what}: "
                                                    f"{type(exc).__name__}", [self.rank], what)
            if self._segs:
                # the sync point we abandoned: posted and waiting, or the next one
                at = self._abandoned or self._seq + 1
                why = f"rank {self.rank}: {exc}" if err else (
                    f"rank {self.rank} {type(exc).__name__}")
                self._publish(seg_mod.STATE_FAILED, why, at)
            raise
        finally:
            self._in_flight = False
            if self._close_requested:
                self.close()

    def _check_usable(self, what: str) -> None:
        """Raise if a collective failed, the communicator closed or was aborted meanwhile."""
        if self._broken is not None:
            raise type(self._broken)(f"communicator unusable after: {self._broken}",
                                     self._broken.ranks, self._broken.op)
        if self._abort_reason is not None:  # aborted between collectives
            self._broken = CollectiveAborted(f"rank {self.rank} aborted: {self._abort_reason}",
                                             [self.rank], what)
            raise self._broken

    def _slot(self, rank: int, parity: int, dtype: np.dtype) -> np.ndarray:
        key = (rank, parity, dtype)
        view = self._typed.get(key)
        if view is None:
            view = self._typed[key] = self._segs[rank].slots[parity].view(dtype)
        return view

    # -- rendezvous -------------------------------------------------------------------------------

    def _rendezvous(self, peer_pids: list[int] | None) -> None:
        n = self.world_size
        mine = Segment.create(segment_name(self.group_id, self.rank), self.slot_bytes, n)
        segs: list[Segment | None] = [None] * n
        segs[self.rank] = mine
        try:
            self._segs = attach_peers(segs, self.group_id, self.rank, peer_pids, self.timeout_s,
                                      lambda: self._abort_reason)
            self._peers = [(r, s) for r, s in enumerate(self._segs) if r != self.rank]
            self._collective("rendezvous", self._sync, signature("rendezvous", n, self.slot_bytes),
                             "rendezvous")
        except BaseException:
            cleanup_failed_rendezvous(segs, self.group_id, self.rank, peer_pids)
            self._segs = []
            self._typed.clear()
            raise
        mine.unlink()  # every peer has mapped it: the name is no longer needed
        self._done = 0  # number user collectives from 1 in messages
        mine.hdr[seg_mod.W_DONE] = 0
