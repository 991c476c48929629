"""Sync points of :class:`~._shm.ShmCommunicator`: post a counter, wait for the peers' counters.

Split from :mod:`._shm` (the collectives) to keep both small.  Waiting spins briefly, yields,
then sleeps on a missing peer's counter (a futex, see :mod:`._shm_futex`; naps where there is
none); every few milliseconds it checks the abort flag, the peers' published state, whether peer
processes are alive and the deadline.

Example (inside ShmCommunicator, a barrier is one sync point)::

    self._sync(signature("barrier", 0, 0), "barrier()")
"""

from __future__ import annotations

import time

from . import _shm_futex as futex
from . import _shm_segment as seg_mod
from ._comm_errors import CollectiveAborted, CollectiveMismatch, CollectiveTimeout, PeerDied
from ._comm_util import Backoff
from ._shm_layout import explain

_CHECK_EVERY_S = 0.005
_LIVENESS_EVERY_S = 0.02


class SyncPointsMixin:
    """Posting and waiting; mixed into ShmCommunicator, which owns the state declared here."""

    rank: int
    timeout_s: float
    _segs: list[seg_mod.Segment]               # every rank's segment
    _peers: list[tuple[int, seg_mod.Segment]]  # (rank, segment) of the others
    _seq: int                                  # sync points posted
    _done: int                                 # collectives completed
    _abandoned: int                            # the sync point given up in
    _abort_reason: str | None
    _futex: bool                               # sleep on a futex in long waits (else nap)
    _spin_s: float                             # how long to spin, then yield, before sleeping
    _yield_s: float

    def _sync(self, sig: int, what: str) -> None:
        """Post the next sync point and wait until every peer posted it too."""
        c = self._seq + 1
        hdr = self._segs[self.rank].hdr
        hdr[seg_mod.W_SIG + (c & 1)] = sig
        hdr[seg_mod.W_SEQ] = c
        self._seq = c
        if self._futex:
            self._wake_sleepers()
        for _, peer in self._peers:
            if peer.hdr[seg_mod.W_SEQ] < c:
                self._wait(c, what)
                break
        for r, peer in self._peers:
            # arrived, then gave up (timeout, abort, Ctrl-C) while we were late: the group is
            # broken even though the data is here
            hdr = peer.hdr
            if hdr[seg_mod.W_STATE] == seg_mod.STATE_FAILED and hdr[seg_mod.W_FAILED_AT] <= c:
                raise CollectiveAborted(f"{what} #{self._done + 1} on rank {self.rank} released: "
                                        f"rank {r} gave up ({peer.reason()})", [r], what)
        odd = [r for r, peer in self._peers if peer.hdr[seg_mod.W_SIG + (c & 1)] != sig]
        if odd:
            theirs = "; ".join(f"rank {r}: {explain(self._segs[r].hdr[seg_mod.W_SIG + (c & 1)])}"
                               for r in odd)
            raise CollectiveMismatch(f"rank {self.rank} entered {what} ({explain(sig)}) but "
                                     f"{theirs}", odd, what)

    def _wait(self, c: int, what: str) -> None:
        try:
            self._poll(c, what)
        except BaseException:
            self._abandoned = c  # peers that arrive at ``c`` later must not complete it
            raise

    def _poll(self, c: int, what: str) -> None:
        # spin, yield, then sleep on the futex of a missing peer's counter (or nap without one)
        backoff = Backoff(time.monotonic() + self.timeout_s, spin_s=self._spin_s,
                          yield_s=self._yield_s)
        # the first checks wait a little: most waits end within microseconds and reading
        # /proc costs tens of them
        next_check = backoff.start + 1e-3
        next_alive = backoff.start + _LIVENESS_EVERY_S
        while True:
            pending = [r for r, peer in self._peers if peer.hdr[seg_mod.W_SEQ] < c]
            if not pending:
                return
            now = time.perf_counter()
            if now >= next_check:
                self._check(c, pending, what, backoff, check_alive=now >= next_alive)
                next_check = now + _CHECK_EVERY_S
                next_alive = next_alive if now < next_alive else now + _LIVENESS_EVERY_S
            if self._futex and now > backoff.yield_until:
                self._sleep_on(pending[0], c)
            else:
                backoff.pause()

    def _sleep_on(self, r: int, c: int) -> None:
        """Sleep until rank ``r`` posts (or a slice passes); it wakes us when it sees our flag."""
        mine, peer = self._segs[self.rank].hdr, self._segs[r]
        mine[seg_mod.W_SLEEP] = r + 1
        try:
            seen = peer.hdr[seg_mod.W_SEQ]
            if seen < c:
                futex.wait(peer.seq_address, seen, _CHECK_EVERY_S)
        finally:
            mine[seg_mod.W_SLEEP] = 0

    def _wake_sleepers(self) -> None:
        """Wake peers sleeping on our counter (after a post or a change of state)."""
        me = self.rank + 1
        for _, peer in self._peers:
            if peer.hdr[seg_mod.W_SLEEP] == me:
                futex.wake(self._segs[self.rank].seq_address)
                return

    def _check(self, c: int, pending: list[int], what: str, backoff: Backoff,
               check_alive: bool) -> None:
        number = self._done + 1
        if self._abort_reason is not None:
            raise CollectiveAborted(f"{what} #{number} aborted on rank {self.rank}: "
                                    f"{self._abort_reason}", [self.rank], what)
        late = []
        for r in pending:
            peer = self._segs[r]
            # the state is read before the counter: a peer posts before it publishes a failure,
            # so one seen failed that has posted ``c`` meanwhile gave up after arriving (say, on
            # the mismatch it found there), and :meth:`_sync` names that cause
            failed = peer.hdr[seg_mod.W_STATE] != seg_mod.STATE_OK
            if peer.hdr[seg_mod.W_SEQ] >= c:
                continue
            late.append(r)
            if failed:
                raise CollectiveAborted(f"{what} #{number} on rank {self.rank} released: rank {r} "
                                        f"gave up ({peer.reason()})", [r], what)
            if check_alive and not peer.alive():
                raise PeerDied(f"rank {r} (pid {peer.pid}) died; rank {self.rank} was in {what} "
                               f"#{number}", [r], what)
        if late and backoff.expired():
            names = ", ".join(f"rank {r} (pid {self._segs[r].pid}, last completed collective "
                              f"#{self._segs[r].hdr[seg_mod.W_DONE]})" for r in late)
            raise CollectiveTimeout(f"{what} #{number} timed out after {self.timeout_s:g} s on "
                                    f"rank {self.rank}; not arrived: {names}", late, what)

    def _publish(self, state: int, reason: str, failed_at: int = 0) -> None:
        """Tell peers why this rank stops, and wake those sleeping on us to read it."""
        self._segs[self.rank].set_reason(state, reason, failed_at)
        if self._futex:
            self._wake_sleepers()
