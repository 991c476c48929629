"""``TorchCommunicator``: the :class:`~._comm.Communicator` interface over torch.distributed.

Gloo for CPU tensors, NCCL for CUDA tensors (CPU tensors and numpy arrays are staged through the
current CUDA device when the group is NCCL).  Many tensors are coalesced into one flat buffer per
(device, dtype), so a model's gradients cost one collective per dtype.

Collectives are issued with ``async_op=True`` and their work handles polled (spin, yield, then
naps of at most 1 ms), so a wait honours our deadline and :meth:`abort` from another thread
instead of blocking in C++ until the group's own timeout (30 minutes by default).  On
timeout or abort the operation is still in flight inside torch: the group is unusable and its owner
must destroy it (``dist.destroy_process_group``; for NCCL ``group.abort()``) and form a new one.
Forming the group with ``timeout=timedelta(seconds=timeout_s + 5)`` keeps torch's own threads from
lingering.

Naming the ranks at fault: torch does not say which rank failed to arrive.  Given the group's
``store``, each rank publishes a heartbeat (pid, host, collectives completed, a beat counter) every
``heartbeat_s`` from a daemon thread; on a timeout or transport error the survivor reads them and
names the ranks that did not arrive, and those that died (same host: pid check; other hosts: the
beat counter stopped).

Example::

    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=timedelta(seconds=65))
    comm = TorchCommunicator(timeout_s=60, store=store)
    comm.allreduce([p.grad for p in model.parameters()], op="mean")
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from ._comm_errors import CollectiveAborted, CollectiveError, CollectiveTimeout, PeerDied
from ._comm_util import Backoff, allreduce_bytes, as_list, check_op, describe, process_alive

__all__ = ["TorchCommunicator"]

_SLICE = datetime.timedelta(milliseconds=20)  # bounds abort latency while blocked in gloo
_REDUCE = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM,
           "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class TorchCommunicator:
    """Collectives on a torch.distributed group with deadlines and abort.

    ``group`` defaults to the default group; ``store`` (optional) enables heartbeats that let
    errors name the ranks at fault.

    Example::

        comm = TorchCommunicator(timeout_s=30)
        comm.broadcast(list(model.parameters()), src=0)
    """

    def __init__(self, group: Any = None, timeout_s: float = 60.0, store: Any = None,
                 heartbeat_s: float = 1.0) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: form the process group first")
        self._group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        self.timeout_s = timeout_s
        self.bytes_sent = 0
        self._done = 0  # collectives completed
        self._entered = 0  # collectives entered: a peer with fewer did not arrive
        self._abort_reason: str | None = None
        self._broken: CollectiveError | None = None
        self._heartbeat = (_Heartbeat(store, self.rank, self.world_size, heartbeat_s,
                                      lambda: (self._entered, self._done))
                           if store is not None else None)

    def allreduce(self, arrays: Any, op: str = "sum") -> None:
        """Reduce in place across ranks (``op`` in sum, mean, max, min).

        Example::

            comm.allreduce([loss_sum, count], op="sum")
        """
        tensors = _as_tensors(as_list(arrays))
        check_op(op, [_np_kind(t) for t in tensors] if op == "mean" else ())
        buckets = self._buckets(tensors)
        nbytes = sum(b.nbytes for b in buckets)
        what = describe("allreduce", nbytes, op)
        self._run(what, lambda: [dist.all_reduce(b.buf, op=_REDUCE[op], group=self._group,
                                                 async_op=True) for b in buckets])
        for b in buckets:
            if op == "mean" and self.world_size > 1:
                b.buf.div_(self.world_size)
            b.finish()
        self.bytes_sent += allreduce_bytes(nbytes, self.world_size)

    def broadcast(self, arrays: Any, src: int = 0) -> None:
        """Overwrite ``arrays`` on every rank with rank ``src``'s (``src`` is a group rank).

        Example::

            comm.broadcast([p.data for p in model.parameters()], src=0)
        """
        buckets = self._buckets(_as_tensors(as_list(arrays)))
        nbytes = sum(b.nbytes for b in buckets)
        root = src if self._group is None else dist.get_global_rank(self._group, src)
        self._run(describe("broadcast", nbytes, f"src={src}"),
                  lambda: [dist.broadcast(b.buf, root, group=self._group, async_op=True)
                           for b in buckets])
        if self.rank != src:
            for b in buckets:
                b.finish()
        else:
            self.bytes_sent += nbytes

    def barrier(self) -> None:
        """Return once every rank has entered ``barrier`` (an allreduce of one int)."""
        flag = torch.zeros(1, dtype=torch.int32, device=self._device(torch.device("cpu")))
        self._run("barrier()", lambda: [dist.all_reduce(flag, group=self._group, async_op=True)])

    def abort(self, reason: str) -> None:
        """Make the wait in progress raise :class:`CollectiveAborted` (any thread may call)."""
        self._abort_reason = reason

    def close(self) -> None:
        """Stop the heartbeat; the group itself belongs to whoever formed it."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        self._broken = self._broken or CollectiveAborted("communicator closed")

    # -- internals -------------------------------------------------------------------------------

    def _device(self, device: torch.device) -> torch.device:
        if self.backend == "nccl" and device.type != "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return device

    def _buckets(self, tensors: list[torch.Tensor]) -> list["_Bucket"]:
        nccl = self.backend == "nccl"
        if len(tensors) == 1 and not nccl:  # the common single-tensor call: no grouping
            return [_Bucket(tensors, tensors[0].device)] if tensors[0].numel() else []
        groups: dict[tuple, list[torch.Tensor]] = {}
        for t in tensors:
            if t.numel():
                device = self._device(t.device) if nccl else t.device
                groups.setdefault((device, t.dtype), []).append(t)
        return [_Bucket(ts, device) for (device, _), ts in groups.items()]

    def _run(self, what: str, issue: Callable[[], list]) -> None:
        """Issue the async collectives and wait for them; any failure breaks this communicator
        (an operation may still be in flight inside torch)."""
        if self._broken is not None:
            raise type(self._broken)(f"communicator unusable after: {self._broken}",
                                     self._broken.ranks, self._broken.op)
        if self._abort_reason is not None:
            self._broken = CollectiveAborted(f"rank {self.rank} aborted: {self._abort_reason}",
                                             [self.rank], what)
            raise self._broken
        if self.world_size == 1:
            return
        self._entered += 1
        try:
            self._wait(issue(), what)
        except BaseException as exc:
            self._broken = exc if isinstance(exc, CollectiveError) else CollectiveAborted(
                f"rank {self.rank} interrupted in {what}: {type(exc).__name__}", [self.rank], what)
            raise
        self._done += 1

    def _wait(self, works: list, what: str) -> None:
        """Wait for every work handle, honouring abort and the deadline.

        gloo: block on the work's own condition variable in ``_SLICE`` slices (spinning or
        napping would take the CPU from gloo's threads on a small machine); others (nccl):
        poll ``is_completed`` with a short backoff, then ``wait()`` to order the stream."""
        backoff = Backoff(time.monotonic() + self.timeout_s, spin_s=30e-6)
        gloo = self.backend == "gloo"
        for w in works:
            while True:
                if self._abort_reason is not None:
                    raise CollectiveAborted(f"{what} #{self._done + 1} aborted on rank "
                                            f"{self.rank}: {self._abort_reason}", [self.rank], what)
                if backoff.expired():
                    raise self._timeout_error(what)
                if self._wait_slice(w, what) if gloo else w.is_completed():
                    break
                if not gloo:
                    backoff.pause()
            if not gloo:
                try:
                    w.wait()
                except RuntimeError as exc:
                    raise self._transport_error(exc, what) from exc

    def _wait_slice(self, work: Any, what: str) -> bool:
        """Block up to ``_SLICE`` in gloo's own wait; whether the work completed."""
        try:
            work.wait(timeout=_SLICE)
        except RuntimeError as exc:  # our slice ran out ("Operation timed out!") or a real error
            if not work.is_completed():
                return False
            try:  # it completed just after the slice ran out, or it failed: ask it which
                work.wait()
            except RuntimeError as failure:
                raise self._transport_error(failure, what) from exc
        return True

    def _timeout_error(self, what: str) -> CollectiveError:
        msg = f"{what} #{self._done + 1} timed out after {self.timeout_s:g} s on rank {self.rank}"
        if self._heartbeat is None:
            return CollectiveTimeout(msg + "; pass store= to name the ranks that did not arrive",
                                     [], what)
        late, dead = self._heartbeat.diagnose(self._entered)
        if dead:
            return PeerDied(f"{msg}; {_describe_ranks(dead, 'died')}", sorted(dead), what)
        return CollectiveTimeout(f"{msg}; not arrived: {_describe_ranks(late, 'alive')}",
                                 sorted(late), what)

    def _transport_error(self, exc: Exception, what: str) -> CollectiveError:
        msg = f"{what} #{self._done + 1} failed on rank {self.rank}: {exc}".splitlines()[0]
        if self._heartbeat is not None:
            _, dead = self._heartbeat.diagnose(self._entered, settle=True)
            if dead:
                return PeerDied(f"{_describe_ranks(dead, 'died')}; {msg}", sorted(dead), what)
        return CollectiveError(msg, [], what)


# dtypes gloo refuses, carried in a wider one (int16 sums wrap the same way when cast back)
_WIRE = {torch.int16: torch.int32}


class _Bucket:
    """One (device, dtype) group as a single flat tensor, written back after the collective."""

    def __init__(self, tensors: list[torch.Tensor], device: torch.device) -> None:
        first = tensors[0]
        wire = _WIRE.get(first.dtype, first.dtype)
        self.nbytes = sum(t.nbytes for t in tensors)
        if len(tensors) == 1 and first.is_contiguous() and first.device == device \
                and wire == first.dtype:
            self.buf, self.outs = first, None
        else:  # coalesce: one collective instead of one per tensor
            self.buf = torch.cat([t.reshape(-1).to(device, wire) for t in tensors])
            self.outs = tensors

    def finish(self) -> None:
        if self.outs is None:
            return
        at = 0
        for t in self.outs:
            n = t.numel()
            t.copy_(self.buf[at:at + n].view(t.shape))
            at += n


class _Heartbeat:
    """Publishes this rank's liveness and progress in the store; reads the peers'."""

    def __init__(self, store: Any, rank: int, world_size: int, every_s: float,
                 progress: Any) -> None:
        self.store, self.rank, self.world_size, self.every_s = store, rank, world_size, every_s
        self._progress, self._beats = progress, 0
        self._host = socket.gethostname()
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._loop, name=f"phalanx-heartbeat-{rank}",
                                        daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        self._beats += 1
        entered, done = self._progress()
        info = {"pid": os.getpid(), "host": self._host, "entered": entered, "done": done,
                "beat": self._beats}
        self.store.set(f"phalanx/hb/{self.rank}", json.dumps(info))

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self._beat()
            except Exception:  # store gone (group destroyed): nothing left to report to
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.every_s + 1)

    def read(self) -> dict[int, dict]:
        out = {}
        for r in range(self.world_size):
            key = f"phalanx/hb/{r}"
            try:
                if r != self.rank and self.store.check([key]):
                    out[r] = json.loads(self.store.get(key))
            except Exception:
                continue
        return out

    def diagnose(self, my_entered: int, settle: bool = False) -> tuple[dict, dict]:
        """(ranks that did not enter collective ``my_entered`` yet, ranks that look dead).

        A peer on this host is judged by its pid, one elsewhere by whether its beat counter
        moves within ~2 beats.  ``settle`` (after a transport error) also watches peers that
        arrived, and gives a local peer the same time to finish dying: a socket closes while
        its killed process is still exiting."""
        first = self.read()
        watch = {r for r, i in first.items() if settle or i["entered"] < my_entered}
        local = {r for r in watch if first[r]["host"] == self._host}
        remote = watch - local
        dead: dict[int, dict] = {}
        deadline = time.monotonic() + 2.5 * self.every_s
        while True:
            for r in [r for r in local if not process_alive(first[r]["pid"])]:
                dead[r] = first[r]
                local.discard(r)
            if remote:
                now = self.read()
                remote -= {r for r in remote if now.get(r, first[r])["beat"] != first[r]["beat"]}
            if (not remote and (not local or not settle)) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        dead.update({r: first[r] for r in remote})
        late = {r: i for r, i in first.items() if r not in dead and i["entered"] < my_entered}
        missing = {r: {"pid": "?", "host": "?", "done": "?"} for r in range(self.world_size)
                   if r != self.rank and r not in first}
        return {**late, **missing}, dead


def _describe_ranks(ranks: dict[int, dict], state: str) -> str:
    return ", ".join(f"rank {r} (pid {i['pid']} on {i['host']}, {state}, had completed "
                     f"{i['done']} collectives at its last heartbeat)"
                     for r, i in sorted(ranks.items())) or "unknown"


def _as_tensors(items: list) -> list[torch.Tensor]:
    out = []
    for x in items:
        if isinstance(x, torch.Tensor):
            # detached, so that mean's division and the write-back bypass autograd
            out.append(x.detach() if x.requires_grad else x)
        elif isinstance(x, np.ndarray):
            if not x.flags.writeable:
                raise ValueError("collectives work in place: got a read-only numpy array")
            try:
                out.append(torch.from_numpy(x))
            except (ValueError, TypeError) as exc:
                raise TypeError(f"cannot share this numpy array with torch ({exc}); "
                                "pass a C-contiguous copy") from exc
        else:
            raise TypeError("collectives take torch tensors or numpy arrays, got "
                            f"{type(x).__name__}")
    return out


def _np_kind(t: torch.Tensor) -> np.dtype:
    """A numpy dtype of the same kind, only for :func:`check_op`'s floating-point test."""
    return np.dtype("f8" if t.dtype.is_floating_point else "c16" if t.dtype.is_complex else "i8")
