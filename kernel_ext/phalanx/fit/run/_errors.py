"""How a failed run is reported in the cell: one error naming the rank, the host and the time."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from ...wire._seam import Fault, Outcome, RankResult
from ..telemetry._memory import cuda_oom_text, host_signs, oom_hint

# The names the kernel gives the faults of ranks that could not report their own (the error of
# their RankResult, shown in messages and to programs reading DistributedFitError.results).
ENGINE_DIED = "EngineDied"
STALLED = "Stalled"
UNRESPONSIVE = "Unresponsive"
CONTROLLER_DIED = "ControllerDied"
# Whose fault an error is travels with it (RankResult.fault, decided by type on the engine):
# an error a rank raised because *another* rank failed is reported only when nothing else
# explains the run's end.


class DistributedFitError(RuntimeError):
    """A run that did not complete; the message names the rank at fault and what happened.

    IPython shows only the message (``_render_traceback_``): the remote traceback is already in
    it, and phalanx's own frames would only hide it.  ``results`` holds every rank's
    :class:`~phalanx.runtime.RankResult` (outcome, error type, step, when it stopped) for
    programs that want more than the text.
    """

    def __init__(self, message: str, status: str, rank: int | None = None,
                 results: Mapping[int, RankResult] | None = None) -> None:
        super().__init__(message)
        self.detected_at = time.time()  # wall clock: when the kernel knew (before any display)
        self.status = status
        self.rank = rank
        self.results = dict(results or {})

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self.args[0]}"]


class VersionSkewError(RuntimeError):
    """Engines run other versions of key packages than the kernel."""


def restart_advice(rank: int, slot: Any) -> str:
    """The command that brings one rank back: the rank alone where its launcher can replace
    one engine, else every engine (an MPI group starts and stops together).

    Example::

        >>> from types import SimpleNamespace
        >>> restart_advice(1, SimpleNamespace(restarts_alone=True))
        '%cluster restart 1'
    """
    if getattr(slot, "restarts_alone", True):
        return f"%cluster restart {rank}"
    return "%cluster restart (its launcher restarts the engines together)"


def describe_failure(rank: int, result: RankResult, slot: Any) -> str:
    """One paragraph for one failed rank."""
    where = f"rank {rank} (engine {slot.engine_id} on host {slot.host}, pid {slot.pid})"
    steps = result.steps
    if result.stalled:
        return _describe_stall(where, rank, result, slot)
    if result.outcome is Outcome.DIED:
        code = result.exit_code
        hint = _death_hint(result, slot)
        return (f"{where} died during the run after step {steps}"
                + (f" ({hint})" if hint else f" (exit code {code})" if code is not None else "")
                + f". Bring it back with {restart_advice(rank, slot)}.")
    if result.outcome is Outcome.UNRESPONSIVE:
        grace = result.grace_s if result.grace_s is not None else 10
        text = (f"{where} stopped answering: it did not come back within "
                f"{grace:g} s of an interrupt (stuck in native code?), so ")
        if result.restart_error:
            return text + (f"phalanx tried to restart its engine, which failed: "
                           f"{result.restart_error}. Its last reported step was {steps}; bring "
                           f"it back with {restart_advice(rank, slot)}.")
        return text + f"its engine was restarted; its last reported step was {steps}."
    if result.outcome is Outcome.INTERRUPTED:
        return f"{where} was stopped at step {steps}."
    oom = cuda_oom_text(result.error, result.memory)
    return (f"{where} raised {result.error} after {steps} step(s)"
            + (f"; {oom}" if oom else "") + ":\n" + _indent(result))


def _death_hint(result: RankResult, slot: Any) -> str | None:
    """Signs of out-of-memory for a dead engine (SIGKILL); the host's signs only where it is ours."""
    import socket

    memory = result.memory or {}
    killed = oom_hint(result.exit_code, None, None) is not None
    signs = host_signs() if killed and slot.host == socket.gethostname() else {}
    return oom_hint(result.exit_code, slot.pid, memory.get("rss_mb"), **signs)


def cause_of(exc: BaseException) -> str:
    """What went wrong, in one line, whatever raised it (ipyparallel wraps engine errors)."""
    elist = getattr(exc, "elist", None)  # CompositeError: the first engine's error
    if elist:
        return f"{elist[0][0]}: {elist[0][1]}"
    ename = getattr(exc, "ename", None)  # RemoteError: the engine's exception, by name
    if ename:
        return f"{ename}: {getattr(exc, 'evalue', '')}"
    return f"{type(exc).__name__}: {exc}"


def engine_fault(rank: int, slot: Any, exc: BaseException, what: str,
                 died: bool) -> DistributedFitError:
    """The run's one error when a call on one rank's engine failed outside the training loop
    (checking versions, shipping data, planning a resume, restarting an engine)."""
    where = f"rank {rank} (engine {slot.engine_id} on host {slot.host}, pid {slot.pid})"
    result = RankResult(Outcome.DIED if died else Outcome.RAISED,
                        error=ENGINE_DIED if died else type(exc).__name__, fault=Fault.OWN,
                        exit_code=slot.exit_code, message=cause_of(exc))
    if died:
        code = f" (exit code {slot.exit_code})" if slot.exit_code is not None else ""
        text = (f"{where} died while {what}{code}; nothing ran. Bring it back with "
                f"{restart_advice(rank, slot)}.")
    else:
        text = f"{where} failed while {what}: {cause_of(exc)}"
    return DistributedFitError(text, "failed", rank, {rank: result})


def _describe_stall(where: str, rank: int, result: RankResult, slot: Any) -> str:
    return _stall_text(where, rank, result, slot) + _stacks_at_stall(result)


def _stall_text(where: str, rank: int, result: RankResult, slot: Any) -> str:
    text = (f"{where} stalled: the other ranks waited {result.waited_s or 0:g} s "
            f"(--collective-timeout) for it in a collective; its last step was {result.steps}.")
    if result.stopped:
        return (text + " Its process was stopped (SIGSTOP), which no interrupt reaches and the "
                f"controller stops tracking, so phalanx ended it: {restart_advice(rank, slot)} "
                "brings it back.")
    if result.outcome is Outcome.UNRESPONSIVE and result.restart_error:
        return text + (" It did not answer an interrupt either, and restarting its engine "
                       f"failed: {result.restart_error}. Bring it back with "
                       f"{restart_advice(rank, slot)}.")
    if result.outcome is Outcome.UNRESPONSIVE:
        return text + " It did not answer an interrupt either, so its engine was restarted."
    return text + " It was interrupted here:\n" + _indent(result)


def _stacks_at_stall(result: RankResult) -> str:
    if not result.stacks_at_stall:
        return ""
    return ("\nWhere the ranks still running were when the deadline passed (as %cluster stacks "
            "shows them):\n" + result.stacks_at_stall)


def _indent(result: RankResult) -> str:
    trace = (result.traceback or f"{result.error}: {result.message}").rstrip()
    return "\n".join("    " + line for line in trace.splitlines())


def is_secondary(result: RankResult) -> bool:
    """Whether ``result`` failed only because another rank did."""
    return result.fault is not None and result.fault.secondary


def root_cause(results: Mapping[int, RankResult]) -> int | None:
    """The rank whose fault ended the run: a dead engine, a rank's own error, a stalled rank."""
    failed = [r for r, res in sorted(results.items()) if res.failed]
    rules: tuple[Callable[[RankResult], bool], ...] = (
        lambda res: res.outcome is Outcome.DIED and not res.stalled,
        lambda res: not is_secondary(res) and res.outcome is not Outcome.INTERRUPTED
        and not res.stalled,
        lambda res: res.stalled,
        lambda res: res.outcome is not Outcome.INTERRUPTED,
    )
    for rule in rules:
        for rank in failed:
            if rule(results[rank]):
                return rank
    return None


def failure(status: str, results: Mapping[int, RankResult], slots: list, opts: Any, wall: float,
            steps: Mapping[int, int]) -> DistributedFitError:
    """The one error a failed, timed-out or interrupted attempt raises in the cell."""
    listed = ", ".join(f"rank {r}: {steps.get(r, 0)}" for r in range(len(slots)))
    if status == "timeout":
        return DistributedFitError(f"the run passed --timeout {opts.timeout:g} s and was stopped "
                                   f"after {wall:.1f} s; last steps: {listed}", status, None, results)
    if status == "interrupted":
        return DistributedFitError(f"interrupted after {wall:.1f} s; every rank stopped "
                                   f"(last steps: {listed}); the engines are ready for the next run",
                                   status, None, results)
    lost = next((res for res in results.values() if res.outcome is Outcome.CONTROLLER_LOST), None)
    if lost is not None:
        info = lost.controller or {}
        return DistributedFitError(
            f"the cluster's controller (pid {info.get('pid')}) exited during the run (exit code "
            f"{info.get('exit_code')}) after {wall:.1f} s; no engine can report without it (last "
            f"steps: {listed}). Start a new cluster with %cluster stop and %cluster start.",
            status, None, results)
    rank = root_cause(results)
    if rank is None:
        return DistributedFitError(f"the run failed after {wall:.1f} s (steps: {listed})", status,
                                   None, results)
    if results[rank].fault is Fault.QUIT:  # `q` at a breakpoint: the person's own ending
        return DistributedFitError(
            f"rank {rank} ended the run from its debugger (q) at step {steps.get(rank, 0)} after "
            f"{wall:.1f} s; every rank was released and the engines are ready for the next run",
            "quit", rank, results)
    others = [r for r in range(len(slots)) if r != rank]
    text = describe_failure(rank, results[rank], slots[rank])
    if others:
        text += (f"\nThe other rank(s) {', '.join(map(str, others))} were released; the run "
                 f"ended {wall:.1f} s after it started.")
    for other in others:  # a peer left without a working engine must not go unmentioned
        peer = results.get(other)
        cause = peer.restart_error if peer is not None else None
        if cause:
            text += (f"\nRank {other} did not stop either, and restarting its engine failed: "
                     f"{cause}. Bring it back with {restart_advice(other, slots[other])}.")
    return DistributedFitError(text, status, rank, results)
