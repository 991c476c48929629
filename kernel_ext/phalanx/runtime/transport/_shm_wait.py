"""Sync points of :class:`~._shm.ShmCommunicator`: post a counter, wait for the peers' counters.

Split from :mod:`._shm` (the collectives) to keep both small.  A wait first polls the peers'
counters alone (a spin: ``SPIN_HOT_S`` without a break, then with a ``sched_yield`` between
polls), then sleeps on a missing peer's counter (a futex, see :mod:`._shm_futex`; naps where
there is none); every few milliseconds it checks the abort flag, the peers' published state,
whether peer processes are alive and the deadline.

The spin lasts about as long as a futex wake-up takes on this host, measured as the run goes: a
poster that wakes a sleeper stamps the time of its post (``W_WOKE``), the woken rank reads how
long it took to run again, and the spin budget is the median of the last few of those (between
``SPIN_MIN_S`` and ``SPIN_MAX_S``).  Spinning as long as a wake-up costs, then sleeping, never
costs more than twice the best choice made knowing the wait in advance: collectives that meet
within microseconds meet while spinning, as MPICH's polling does, and a rank that waits long for
a peer (a slower backward pass, a rank still between steps) sleeps in the kernel after that
budget instead of burning a core.  A wait that starts less than ``BURST_GAP_S`` after the
previous sync point passed (collectives issued back to back: the chunks of one large array, a
loop of small allreduces) is polled for ``BURST_POLL_S`` at least: there the peer computes
nothing in between, it is only late by a scheduler's whim and due back within a time slice.

Past its first ``SPIN_HOT_S`` the spin yields between polls: on a crowded host that lets the
other processes run, where a tight spin slowed them and so the wake-ups, which lengthened the
budget (the 2-core machine at load 10, 1 KB allreduce: mean 95 us a call with the yields, 287
us without).

Example (inside ShmCommunicator, a barrier is one sync point)::

    self._sync(signature("barrier", 0, 0), "barrier()")
"""

from __future__ import annotations

import os
import time

from . import _shm_futex as futex
from . import _shm_segment as seg_mod
from ._comm_errors import CollectiveAborted, CollectiveMismatch, CollectiveTimeout, PeerDied
from ._comm_util import Backoff
from ._shm_layout import explain
from ._shm_segment import STATE_FAILED, STATE_OK, W_SEQ, W_SIG, W_SLEEP, W_STATE, W_WOKE

_CHECK_EVERY_S = 0.005
_LIVENESS_EVERY_S = 0.02
_LONG_WAIT_S = 0.1  # past this, a sleeping rank wakes every _LIVENESS_EVERY_S, not _CHECK_EVERY_S
SPIN_MIN_S, SPIN_MAX_S = 10e-6, 500e-6  # bounds of the spin budget
SPIN_HOT_S = 20e-6  # polls without yielding the core this long
BURST_GAP_S, BURST_POLL_S = 100e-6, 2e-3  # polled this long when the last sync was this recent
SPIN_FIRST_S = 100e-6  # until a wake-up was measured: about one on the busy 2-core machine
_WAKE_SAMPLES = 9  # the budget is the median of this many last wake-ups


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
    _spin_s: float = SPIN_FIRST_S              # how long to poll the counters before sleeping
    _yield_s: float = 2e-3                     # without futexes: sched_yield this long, then nap
    _wakes: list[float] | None = None          # the last futex wake-ups measured, seconds
    _synced_at: float = 0.0                    # perf_counter when the last sync point passed

    def _sync(self, sig: int, what: str) -> None:
        """Post the next sync point and wait until every peer posted it too."""
        c = self._seq + 1
        at = W_SIG + (c & 1)
        hdr = self._segs[self.rank].hdr
        hdr[at] = sig
        hdr[W_SEQ] = c
        self._seq = c
        peers = self._peers
        if self._futex:
            me = self.rank + 1
            for _, peer in peers:
                if peer.hdr[W_SLEEP] == me:
                    self._wake_sleepers()
                    break
        for _, peer in peers:
            if peer.hdr[W_SEQ] < c:
                self._wait(c, what)
                break
        for _, peer in peers:
            theirs = peer.hdr
            if theirs[W_STATE] != STATE_OK or theirs[at] != sig:
                self._check_arrived(c, sig, what)
                break
        self._synced_at = time.perf_counter()

    def _check_arrived(self, c: int, sig: int, what: str) -> None:
        """Every peer posted ``c`` but one is not fine: raise if one gave up after arriving or
        entered another collective (a peer that closed after arriving is fine)."""
        for r, peer in self._peers:
            # arrived, then gave up (timeout, abort, Ctrl-C) while we were late: the group is
            # broken even though the data is here
            hdr = peer.hdr
            if hdr[W_STATE] == STATE_FAILED and hdr[seg_mod.W_FAILED_AT] <= c:
                raise CollectiveAborted(f"{what} #{self._done + 1} on rank {self.rank} released: "
                                        f"rank {r} gave up ({peer.reason()})", [r], what)
        at = W_SIG + (c & 1)
        odd = [r for r, peer in self._peers if peer.hdr[at] != sig]
        if odd:
            theirs = "; ".join(f"rank {r}: {explain(self._segs[r].hdr[at])}" for r in odd)
            raise CollectiveMismatch(f"rank {self.rank} entered {what} ({explain(sig)}) but "
                                     f"{theirs}", odd, what)

    def _wait(self, c: int, what: str) -> None:
        try:
            if not self._spin(c):
                self._poll(c, what)
        except BaseException:
            self._abandoned = c  # peers that arrive at ``c`` later must not complete it
            raise

    def _spin(self, c: int) -> bool:
        """Poll the peers' counters alone for the spin budget; whether every peer posted ``c``."""
        start = time.perf_counter()
        budget = self._spin_s
        if start - self._synced_at < BURST_GAP_S:  # back-to-back: the peer is due any moment
            budget = max(budget, BURST_POLL_S)
        until, hot = start + budget, start + SPIN_HOT_S
        for _, peer in self._peers:
            hdr = peer.hdr
            while hdr[W_SEQ] < c:
                now = time.perf_counter()
                if now > hot:
                    if now > until:
                        return False
                    os.sched_yield()  # let others run first on a busy core
        return True

    def _poll(self, c: int, what: str) -> None:
        # past the spin: sleep on the futex of a missing peer's counter (or yield, then nap)
        backoff = Backoff(time.monotonic() + self.timeout_s, spin_s=0.0, yield_s=self._yield_s)
        # the first checks wait a little: most waits end within microseconds and reading
        # /proc costs tens of them
        next_check = backoff.start + 1e-3
        next_alive = backoff.start + _LIVENESS_EVERY_S
        while True:
            pending = [r for r, peer in self._peers if peer.hdr[W_SEQ] < c]
            if not pending:
                return
            now = time.perf_counter()
            if now >= next_check:
                self._check(c, pending, what, backoff, check_alive=now >= next_alive)
                next_check = now + _CHECK_EVERY_S
                next_alive = next_alive if now < next_alive else now + _LIVENESS_EVERY_S
            if self._futex:
                # a long wait (a peer between steps) wakes less often: 0.5% of a core, not 2%
                long_wait = now - backoff.start > _LONG_WAIT_S
                self._sleep_on(pending[0], c, _LIVENESS_EVERY_S if long_wait else _CHECK_EVERY_S)
            else:
                backoff.pause()

    def _sleep_on(self, r: int, c: int, slice_s: float = _CHECK_EVERY_S) -> None:
        """Sleep until rank ``r`` posts (or ``slice_s`` passes); it wakes us when it sees our
        flag."""
        mine, peer = self._segs[self.rank].hdr, self._segs[r]
        mine[W_SLEEP] = r + 1
        try:
            seen = peer.hdr[W_SEQ]
            if seen < c:
                slept = time.monotonic_ns()
                futex.wait(peer.seq_address, seen, slice_s)
                woke = peer.hdr[W_WOKE]
                if woke >= slept and peer.hdr[W_SEQ] >= c:  # woken by this post
                    self._learn_wake((time.monotonic_ns() - woke) * 1e-9)
        finally:
            mine[W_SLEEP] = 0

    def _learn_wake(self, seconds: float) -> None:
        """Set the spin budget from one more measured wake-up (post to running again)."""
        wakes = self._wakes = (self._wakes or [])[-(_WAKE_SAMPLES - 1):] + [seconds]
        median = sorted(wakes)[len(wakes) // 2]
        self._spin_s = min(max(median, SPIN_MIN_S), SPIN_MAX_S)

    def _wake_sleepers(self) -> None:
        """Wake peers sleeping on our counter (after a post or a change of state)."""
        me = self.rank + 1
        for _, peer in self._peers:
            if peer.hdr[W_SLEEP] == me:
                mine = self._segs[self.rank]
                mine.hdr[W_WOKE] = time.monotonic_ns()  # the sleeper measures its wake-up
                if mine.wake is not None:
                    mine.wake()
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
            failed = peer.hdr[W_STATE] != STATE_OK
            if peer.hdr[W_SEQ] >= c:
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
