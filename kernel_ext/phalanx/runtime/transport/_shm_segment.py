"""One rank's POSIX shared-memory segment: a small header plus two data slots.

Layout (bytes)::

    0      header: int64 words (magic, pid, start time, sequence counter, signatures, state)
    1024   reason text (utf-8) when this rank failed or aborted, so peers can quote it
    4096   slot 0 | slot 1 (``slot_bytes`` each; sync point ``c`` uses slot ``c % 2``)

Lifetime and cleanup (no leaks in /dev/shm):

1. each rank creates ``/phx_<group>_<rank>`` (mode 0600) and attaches the others';
2. once every rank has attached every segment (the rendezvous barrier), each rank unlinks its own
   name at once: the memory lives on until the last process unmaps it, so a crash at any later
   point, even SIGKILL, leaves nothing behind;
3. if the rendezvous fails, the rank unlinks its own name and those of peers it found dead;
4. a name left by a process killed inside the rendezvous is reclaimed by the next creator of the
   same name, or by :func:`cleanup_stale` (both check that the creator pid is gone).

We bypass ``multiprocessing.shared_memory`` on purpose: on Python < 3.13 its resource tracker
registers attached segments too, unlinks them when any attaching process exits and starts a
tracker process in every engine.

Example::

    >>> seg = Segment.create("/phx_doc_0", slot_bytes=4096)
    >>> seg.unlink(); seg.close()
"""

from __future__ import annotations

import mmap
import os
import time
from typing import Callable

import numpy as np

from . import _shm_futex as futex
from ._comm_errors import CollectiveAborted, CollectiveMismatch, CollectiveTimeout, PeerDied
from ._comm_util import process_alive, process_start_time

try:
    from _posixshmem import shm_open as _shm_open, shm_unlink as _shm_unlink
except ImportError:  # pragma: no cover - non-CPython or exotic platform: fall back to /dev/shm
    def _shm_open(name: str, flags: int, mode: int = 0o600) -> int:
        return os.open("/dev/shm" + name, flags, mode)

    def _shm_unlink(name: str) -> None:
        os.unlink("/dev/shm" + name)

MAGIC = 0x70686C6E78_0001  # "phlnx", layout version 1
HEADER_BYTES = 4096
REASON_AT, REASON_BYTES = 1024, 1024
# header word indices; SEQ sits on its own cache line because peers poll it
W_MAGIC, W_PID, W_START, W_SLOT, W_WORLD, W_DONE, W_STATE, W_FAILED_AT = 0, 1, 2, 3, 4, 5, 6, 7
W_SEQ = 8
W_SLEEP = 9  # 1 + the rank whose W_SEQ this rank sleeps on (futex), 0 when awake
W_WOKE = 10  # CLOCK_MONOTONIC ns at which this rank last woke a peer sleeping on its W_SEQ
W_SIG = 16  # W_SIG + parity
STATE_OK, STATE_CLOSED, STATE_FAILED = 0, 1, 2
PREFIX = "phx_"


def segment_name(group_id: str, rank: int) -> str:
    """The POSIX name of ``rank``'s segment in group ``group_id``."""
    return f"/{PREFIX}{group_id}_{rank}"


class Segment:
    """A mapped segment; ``hdr`` is a memoryview of int64 words, ``slots`` two uint8 arrays."""

    def __init__(self, name: str, mm: mmap.mmap, slot_bytes: int) -> None:
        self.name = name
        self.mm = mm
        self.slot_bytes = slot_bytes
        self.hdr = memoryview(mm)[:HEADER_BYTES].cast("q")
        self.slots = [np.frombuffer(mm, np.uint8, slot_bytes, HEADER_BYTES + p * slot_bytes)
                      for p in (0, 1)]
        # where W_SEQ lives in this process's mapping: the word peers sleep on
        self.seq_address = self.slots[0].ctypes.data - HEADER_BYTES + W_SEQ * 8
        # wakes the processes sleeping on W_SEQ (None without futexes)
        self.wake = futex.waker(self.seq_address) if futex.AVAILABLE else None
        self.linked = False

    @classmethod
    def create(cls, name: str, slot_bytes: int, world_size: int = 0) -> "Segment":
        """Create and initialise ``name``; a stale one left by a dead process is replaced."""
        size = HEADER_BYTES + 2 * slot_bytes
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR
        try:
            fd = _shm_open(name, flags, 0o600)
        except FileExistsError:
            _reclaim_stale(name)
            fd = _shm_open(name, flags, 0o600)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            _shm_unlink(name)
            raise
        finally:
            os.close(fd)
        seg = cls(name, mm, slot_bytes)
        seg.linked = True
        pid = os.getpid()
        seg.hdr[W_PID], seg.hdr[W_START] = pid, process_start_time(pid)
        seg.hdr[W_SLOT], seg.hdr[W_WORLD] = slot_bytes, world_size
        seg.hdr[W_MAGIC] = MAGIC  # last: attachers treat the segment as ready once they see it
        return seg

    @classmethod
    def attach(cls, name: str) -> "Segment | None":
        """Map ``name`` if it exists, is initialised and its creator is alive; else ``None``."""
        try:
            fd = _shm_open(name, os.O_RDWR, 0o600)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                return None  # the creator has not sized it yet
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        hdr = memoryview(mm)[:HEADER_BYTES].cast("q")
        ok = hdr[W_MAGIC] == MAGIC and process_alive(hdr[W_PID], hdr[W_START] or None)
        slot_bytes = hdr[W_SLOT]
        hdr.release()
        if not ok:  # not ready yet, or a stale leftover its new owner is about to replace
            mm.close()
            return None
        return cls(name, mm, slot_bytes)

    @property
    def pid(self) -> int:
        return self.hdr[W_PID]

    def alive(self) -> bool:
        """Whether the process that created this segment still runs."""
        return process_alive(self.hdr[W_PID], self.hdr[W_START] or None)

    def set_reason(self, state: int, reason: str, failed_at: int = 0) -> None:
        """Publish why this rank stopped and at which sync point, then the state (peers read
        the state first)."""
        data = reason.encode("utf-8", "replace")[: REASON_BYTES - 1]
        self.mm[REASON_AT:REASON_AT + len(data) + 1] = data + b"\0"
        self.hdr[W_FAILED_AT] = failed_at
        self.hdr[W_STATE] = state

    def reason(self) -> str:
        raw = self.mm[REASON_AT:REASON_AT + REASON_BYTES]
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def unlink(self) -> None:
        """Remove the name (idempotent); mappings stay valid until closed."""
        if self.linked:
            self.linked = False
            try:
                _shm_unlink(self.name)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Unmap; numpy views handed out must be gone (we only keep them internally)."""
        self.slots = []
        self.hdr.release()
        try:
            self.mm.close()
        except BufferError:  # a view is still referenced somewhere: the GC unmaps it later
            pass


def _reclaim_stale(name: str) -> None:
    """Unlink ``name`` if the process that created it is dead, else explain who holds it."""
    try:
        fd = _shm_open(name, os.O_RDONLY, 0o600)
    except FileNotFoundError:
        return
    try:
        with mmap.mmap(fd, HEADER_BYTES, prot=mmap.PROT_READ) as mm:
            pid, start = np.frombuffer(mm, np.int64, 3)[W_PID:W_START + 1].tolist()
    except (ValueError, OSError):
        pid = start = 0  # shorter than a header: a creator died before sizing it
    finally:
        os.close(fd)
    if pid and process_alive(pid, start or None):
        raise FileExistsError(f"shared-memory segment {name} belongs to live pid {pid}; "
                              "use a fresh group_id")
    try:
        _shm_unlink(name)
    except FileNotFoundError:
        pass


def unlink_if_dead(name: str) -> bool:
    """Unlink ``name`` when its creator is gone; returns whether it was removed."""
    try:
        _reclaim_stale(name)
    except FileExistsError:
        return False
    return True


def cleanup_stale(shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink every phalanx segment whose creator died; returns the names removed.

    Only rendezvous crashes can leave such names (see the module notes); an engine may call this
    at start-up.

    Example::

        >>> isinstance(cleanup_stale(), list)
        True
    """
    try:
        entries = os.listdir(shm_dir)
    except OSError:
        return []
    return [e for e in entries if e.startswith(PREFIX) and unlink_if_dead("/" + e)]


def attach_peers(segs: list[Segment | None], group_id: str, rank: int,
                 peer_pids: list[int] | None, timeout_s: float,
                 aborted: Callable[[], str | None]) -> list[Segment]:
    """Fill ``segs`` (``None`` where missing) with the peers' segments as they appear; returns
    every rank's segment, by rank, once none is missing.

    Raises :class:`PeerDied` for a listed peer pid that is gone, :class:`CollectiveTimeout`
    naming the ranks whose segment never appeared, :class:`CollectiveAborted` on abort."""
    deadline = time.monotonic() + timeout_s
    while True:
        for r, seg in enumerate(segs):
            if seg is None:
                segs[r] = Segment.attach(segment_name(group_id, r))
        missing = [r for r, s in enumerate(segs) if s is None]
        if not missing:
            break
        for r in missing:
            if peer_pids and not process_alive(peer_pids[r]):
                raise PeerDied(f"rank {r} (pid {peer_pids[r]}) died before the rendezvous of "
                               f"group {group_id}", [r], "rendezvous")
        if time.monotonic() > deadline:
            raise CollectiveTimeout(f"rendezvous of group {group_id} timed out after "
                                    f"{timeout_s:g} s on rank {rank}; ranks {missing} never "
                                    "created their segment",
                                    missing, "rendezvous")
        if aborted() is not None:
            raise CollectiveAborted(f"rendezvous aborted: {aborted()}", [rank], "rendezvous")
        time.sleep(0.002)
    attached = [s for s in segs if s is not None]  # all of them: none is missing
    bad = [r for r, s in enumerate(attached) if s.slot_bytes != attached[rank].slot_bytes]
    if bad:
        raise CollectiveMismatch(f"ranks {bad} use another slot_bytes than rank {rank} "
                                 f"({attached[rank].slot_bytes})", bad, "rendezvous")
    return attached


def cleanup_failed_rendezvous(segs: list[Segment | None], group_id: str, rank: int,
                              peer_pids: list[int] | None) -> None:
    """After a failed rendezvous: tell peers, unlink our name and those of dead peers, unmap."""
    for r, seg in enumerate(segs):
        if seg is not None:
            if r == rank:
                seg.set_reason(STATE_FAILED, f"rank {r} left the rendezvous")
                seg.unlink()
            elif not seg.alive():
                unlink_if_dead(seg.name)
            seg.close()
        elif peer_pids and not process_alive(peer_pids[r]):
            unlink_if_dead(segment_name(group_id, r))
