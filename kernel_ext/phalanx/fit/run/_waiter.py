"""Wait for the ranks of one attempt; turn the first fault into one verdict, release the rest.

The waiter polls every rank's result.  On the first fault (a rank that raised, died, stalled or
passed ``--timeout``) every rank still running is interrupted through ipyparallel's control
channel, which a busy engine still answers (its nanny relays the signal).  Stalls are found two
ways: a peer's collective deadline names the rank that never arrived (``CollectiveTimeout.ranks``),
and the controller drops an engine whose heartbeat stopped (a SIGSTOPped process).  A stalled
rank is interrupted, so its traceback shows where it was stuck; a *stopped* one cannot run a
signal handler, and the controller forgets it within seconds, so it is killed and reported as
needing ``%cluster restart`` (automatic with ``--max-restarts``).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace
from typing import Any

from ...wire._seam import Fault, Outcome, RankResult
from ..debug._breakpoints import PausedRanks
from ._engine_calls import registered, signal_engines
from ._errors import CONTROLLER_DIED, ENGINE_DIED, STALLED, UNRESPONSIVE, cause_of, is_secondary
from ._output import OutputStreamer

RELEASE_GRACE_S = 10.0   # after interrupting, how long ranks get to come back before we say so
SECONDARY_GRACE_S = 3.0  # how long a rank's own error may take to arrive after a peer's abort
# After a rank's own error, its peers are usually released by its abort within milliseconds; an
# interrupt sent while such a peer is already returning would land in ipyparallel's own code.
RELEASE_DELAY_S = 0.5
# The loop is woken at once by a rank's result (its future); the poll only paces what has no
# event of its own: printed output, a stop request, the panel's messages where the kernel has
# no subshells.  20 times a second is prompt for those; every 5 ms cost ~7% of a core.
POLL_S = 0.05
# A task's last printed lines can arrive just after its result; a healthy engine's follow
# within milliseconds, so this bounds only the wait for an engine that returned and then hung.
OUTPUT_GRACE_S = 1.0
# How a rank that kept its peers waiting can end, besides a collective error of its own.
_STALL_OUTCOMES = (Outcome.INTERRUPTED, Outcome.STOPPED, Outcome.DIED)



class Waiter:
    """Poll one attempt's results; on the first fault interrupt everyone else."""

    def __init__(self, cluster: Any, slots: list, ars: list, tracker: Any, opts: Any,
                 pump: Any = None) -> None:
        self.cluster, self.slots, self.ars, self.tracker, self.opts = cluster, slots, ars, tracker, opts
        self.pump = pump or (lambda: None)  # serves the kernel's requests; may raise a stop
        self.output = OutputStreamer(ars)
        self.paused = PausedRanks(cluster, slots, ars,  # the views say which rank is paused
                                  on_pause=lambda rank, pause: tracker.set_paused(rank, pause))
        self.released_at: float | None = None
        self.stalled: set[int] = set()   # ranks that kept their peers waiting
        self.stopped: set[int] = set()   # ... and were found stopped (SIGSTOP): killed
        self.stacks_at_stall: str | None = None  # the running ranks' stacks when a deadline passed
        # Set by any rank's result as it arrives (on ipyparallel's thread): the nap waits on this
        # one event; concurrent.futures.wait set up waiters on every future at each poll (about
        # 125 us of the kernel's CPU a poll, measured during a 2-rank run)
        arrived = self._arrived = threading.Event()
        for ar in ars:  # the callback holds the event alone, not this waiter (no cycle)
            ar.add_done_callback(lambda _future: arrived.set())

    def wait(self, results: dict[int, RankResult]) -> str:
        """Fill ``results`` (rank -> result) and return done|failed|timeout|interrupted|resized."""
        status, start, failed_at = "done", time.monotonic(), time.monotonic()
        pending = set(range(len(self.ars)))
        interrupted = False
        while pending:
            try:
                if getattr(self.cluster, "controller_exit", None) is not None:
                    self._controller_lost(pending, results)
                self._collect(pending, results)
                self.paused.serve(pending)  # a rank at breakpoint(): its debugger, in the cell
                failed = [r for r in results.values() if r.failed]
                if status == "done" and failed:
                    status, failed_at = "failed", time.monotonic()
                if status == "failed" and self.released_at is None and self._should_release(
                        failed, pending, failed_at):
                    self._release(pending, failed)
                if self.opts.timeout and status == "done" and time.monotonic() - start > self.opts.timeout:
                    status = "timeout"
                    self._release(pending, [])
                if self.released_at and time.monotonic() - self.released_at > RELEASE_GRACE_S:
                    self._abandon(pending, results)
                self.output.flush()
                self.pump()
                self._nap(pending)
            except KeyboardInterrupt:
                if interrupted:
                    raise
                interrupted, status = True, "interrupted"
                self._release(pending, [])
        self.output.finish([self.ars[r] for r, res in results.items() if not res.outcome.kernel_made],
                           OUTPUT_GRACE_S)
        self._mark_stalled(results)
        if status == "done" and any(r.outcome is Outcome.RESIZED for r in results.values()):
            status = "resized"
        return status

    def _nap(self, pending: set[int]) -> None:
        """Sleep up to POLL_S, woken as soon as a pending rank's result arrives (ipyparallel's
        results are futures), so a run's end costs no polling delay."""
        if not pending:
            return  # every result is in: the loop ends
        self._arrived.clear()  # before the look: a result arriving after it sets the event
        if any(not self.ars[r].done() for r in pending):
            self._arrived.wait(POLL_S)
        else:
            # A result whose future is done is marked ready by a callback that runs just after:
            # wait for that (AsyncResult.wait) rather than a whole POLL_S.
            self.ars[min(pending)].wait(POLL_S)

    def _should_release(self, failed: list[RankResult], pending: set[int], failed_at: float) -> bool:
        # A rank released by a peer's failure reports a collective error; the peer that failed
        # first is usually finishing on its own, so give it a moment to report its real error -
        # unless a collective deadline names a rank still running: that one is stuck.  (An
        # abort names the rank that gave up: it is returning its own error, not stuck.)
        waited = time.monotonic() - failed_at
        if any(rank in pending for r in failed if r.fault is Fault.DEADLINE for rank in r.ranks):
            return True
        if not all(is_secondary(r) for r in failed):
            return waited > RELEASE_DELAY_S
        return waited > SECONDARY_GRACE_S

    def _collect(self, pending: set[int], results: dict[int, RankResult]) -> None:
        for rank in sorted(pending):
            ar, slot = self.ars[rank], self.slots[rank]
            if ar.ready():
                pending.discard(rank)
                try:
                    results[rank] = ar.get()
                except Exception as exc:
                    results[rank] = self._lost(rank, slot, exc)
            elif slot.state == "dead":
                pending.discard(rank)
                results[rank] = died(slot, self.tracker, rank)

    def _lost(self, rank: int, slot: Any, exc: Exception) -> RankResult:
        """A task that ended without our result: its engine died, stopped, or ipyparallel failed it."""
        steps = self.tracker.steps.get(rank, 0)
        if _is_stopped(slot):  # the controller dropped a frozen engine: it cannot come back
            self._kill_stopped(rank, slot)
            return RankResult(Outcome.STOPPED, error=STALLED, fault=Fault.OWN, stopped=True,
                              steps=steps,
                              message=str(exc))
        engine_gone = slot.state == "dead" or not registered(self.cluster, slot.engine_id)
        if engine_gone:
            _await_exit_code(slot)
            return died(slot, self.tracker, rank, str(exc))
        if getattr(exc, "ename", None) == "KeyboardInterrupt" and self.released_at is not None:
            # our interrupt reached the engine just outside the cell (while it was returning)
            return RankResult(Outcome.INTERRUPTED, error="KeyboardInterrupt", fault=Fault.OWN,
                              steps=steps,
                              message="interrupted while returning")
        return RankResult(Outcome.RAISED, error=type(exc).__name__, fault=Fault.OWN,
                          message=str(exc),
                          traceback=f"{type(exc).__name__}: {exc}", steps=steps)

    def _release(self, pending: set[int], failed: list[RankResult]) -> None:
        """Interrupt every rank still running (stopped ones are killed: no signal reaches them)."""
        if self.released_at is not None or not pending:
            self.released_at = self.released_at or time.monotonic()
            return
        self.released_at = time.monotonic()
        timeouts = [r for r in failed if r.fault is Fault.DEADLINE]
        if failed and all(is_secondary(r) for r in failed) and timeouts:
            # a deadline names who kept the others waiting (torch's own timeouts name nobody);
            # a rank named by an abort gave up on its own and is reporting, not stalled
            named = {rank for r in timeouts for rank in r.ranks if rank in pending}
            self.stalled |= named or set(pending)
        alive = []
        for rank in sorted(pending):
            slot = self.slots[rank]
            if slot.state == "dead":
                continue
            if _is_stopped(slot):
                self._kill_stopped(rank, slot)
            else:
                alive.append(rank)
        if self.stalled and alive:  # where the stall is, before the interrupt moves it
            self.stacks_at_stall = _stacks_of(self.cluster, [self.slots[r] for r in alive], alive)
        targets = [self.slots[rank].engine_id for rank in alive]
        # An engine can leave between the checks above and the signal: it then needs none.
        signal_engines(self.cluster, targets, signal.SIGINT)

    def _kill_stopped(self, rank: int, slot: Any) -> None:
        import os

        self.stalled.add(rank)
        self.stopped.add(rank)
        try:
            os.kill(slot.pid, signal.SIGKILL)  # SIGKILL is the one signal a stopped process takes
        except (ProcessLookupError, TypeError):
            pass

    def _abandon(self, pending: set[int], results: dict[int, RankResult]) -> None:
        for rank in list(pending):
            results[rank] = RankResult(
                Outcome.UNRESPONSIVE, error=UNRESPONSIVE, fault=Fault.PEER, steps=self.tracker.steps.get(rank, 0),
                grace_s=RELEASE_GRACE_S,
                message=f"did not stop within {RELEASE_GRACE_S:g} s of an interrupt")
            pending.discard(rank)
            try:
                self.cluster.restart(rank)
            except Exception as exc:  # the slot is left dead: the next run says so
                results[rank] = replace(results[rank], restart_error=cause_of(exc))

    def _controller_lost(self, pending: set[int], results: dict[int, RankResult]) -> None:
        """No result can arrive without the controller: every rank still running ends now (its
        engine exits by itself when its heartbeats go unanswered)."""
        for rank in sorted(pending):
            results[rank] = RankResult(Outcome.CONTROLLER_LOST, error=CONTROLLER_DIED, fault=Fault.OWN,
                                       steps=self.tracker.steps.get(rank, 0),
                                       controller=dict(self.cluster.controller_exit))
        pending.clear()

    def _mark_stalled(self, results: dict[int, RankResult]) -> None:
        for rank in self.stalled:
            result = results.get(rank)
            if result is None or result.ok or (
                    result.outcome is Outcome.DIED and rank not in self.stopped):
                continue
            if not (is_secondary(result) or result.outcome in _STALL_OUTCOMES):
                continue  # it failed on its own: that error is the report
            results[rank] = replace(result, stalled=True, stopped=rank in self.stopped,
                                    waited_s=self.opts.collective_timeout,
                                    stacks_at_stall=self.stacks_at_stall)


def _stacks_of(cluster: Any, slots: list, ranks: list[int]) -> str:
    """What ``%cluster stacks`` would show of these running ranks: one control request each,
    all at once (milliseconds; an engine that does not answer costs ``ANSWER_S``)."""
    from ..debug._stacks import ask_stacks, describe_stacks

    return describe_stacks(slots, ask_stacks(cluster, slots, busy=True), ranks)


def _is_stopped(slot: Any) -> bool:
    """Whether a local engine process is stopped (SIGSTOP, or a debugger's trace stop)."""
    from ...cluster._locality import is_local

    if not slot.pid or not is_local(slot):
        return False
    try:
        import psutil

        return psutil.Process(slot.pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except Exception:
        return False


def _await_exit_code(slot: Any, timeout: float = 1.0) -> None:
    """ipyparallel can fail a dead engine's task before its launcher reports how the process
    ended; for a local engine that report follows within milliseconds and says what killed it
    (SIGKILL: maybe out of memory), so it is worth the wait."""
    from ...cluster._locality import is_local

    if not slot.pid or not is_local(slot):
        return
    deadline = time.monotonic() + timeout
    while slot.exit_code is None and time.monotonic() < deadline:
        time.sleep(0.01)


def died(slot: Any, tracker: Any, rank: int, detail: str = "") -> RankResult:
    memory = getattr(tracker, "memory", None)
    return RankResult(Outcome.DIED, error=ENGINE_DIED, fault=Fault.OWN, exit_code=slot.exit_code,
                      steps=tracker.steps.get(rank, 0), message=detail,
                      memory=memory.latest().get(rank) if memory is not None else None)
