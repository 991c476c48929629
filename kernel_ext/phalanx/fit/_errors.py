"""How a failed run is reported in the cell: one error naming the rank, the host and the time."""

from __future__ import annotations

import time
from typing import Any, Mapping

from ._memory import cuda_oom_text, host_signs, oom_hint

# Errors a rank raises because *another* rank failed: reported only when nothing else explains it.
SECONDARY = ("CollectiveAborted", "PeerDied", "CollectiveTimeout", "CollectiveError", "Unresponsive",
             "DistBackendError", "DistNetworkError", "DistError")


class DistributedFitError(RuntimeError):
    """A run that did not complete; the message names the rank at fault and what happened.

    IPython shows only the message (``_render_traceback_``): the remote traceback is already in
    it, and phalanx's own frames would only hide it.  ``results`` holds every rank's outcome
    (error type, step, when it stopped) for programs that want more than the text.
    """

    def __init__(self, message: str, status: str, rank: int | None = None,
                 results: Mapping[int, dict] | None = None) -> None:
        super().__init__(message)
        self.detected_at = time.time()  # wall clock: when the kernel knew (before any display)
        self.status = status
        self.rank = rank
        self.results = dict(results or {})

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self.args[0]}"]


class VersionSkewError(RuntimeError):
    """Engines run other versions of key packages than the kernel."""


def describe_failure(rank: int, result: dict, slot: Any) -> str:
    """One paragraph for one failed rank."""
    where = f"rank {rank} (engine {slot.engine_id} on host {slot.host}, pid {slot.pid})"
    steps = result.get("steps", 0)
    if result.get("stalled"):
        return _describe_stall(where, rank, result)
    if result.get("error") == "EngineDied":
        code = result.get("exit_code")
        hint = _death_hint(result, slot)
        return (f"{where} died during the run after step {steps}"
                + (f" ({hint})" if hint else f" (exit code {code})" if code is not None else "")
                + f". Bring it back with %cluster restart {rank}.")
    if result.get("error") == "Unresponsive":
        text = (f"{where} stopped answering: it did not come back within "
                f"{result.get('grace_s', 10):g} s of an interrupt (stuck in native code?), so ")
        if result.get("restart_error"):
            return text + (f"phalanx tried to restart its engine, which failed: "
                           f"{result['restart_error']}. Its last reported step was {steps}; bring "
                           f"it back with %cluster restart {rank}.")
        return text + f"its engine was restarted; its last reported step was {steps}."
    if result.get("interrupted"):
        return f"{where} was stopped at step {steps}."
    oom = cuda_oom_text(result)
    return (f"{where} raised {result.get('error')} after {steps} step(s)"
            + (f"; {oom}" if oom else "") + ":\n" + _indent(result))


def _death_hint(result: dict, slot: Any) -> str | None:
    """Signs of out-of-memory for a dead engine (SIGKILL); the host's signs only where it is ours."""
    import socket

    memory = result.get("memory") or {}
    killed = oom_hint(result.get("exit_code"), None, None) is not None
    signs = host_signs() if killed and slot.host == socket.gethostname() else {}
    return oom_hint(result.get("exit_code"), slot.pid, memory.get("rss_mb"), **signs)


def cause_of(exc: BaseException) -> str:
    """What went wrong, in one line, whatever raised it (ipyparallel wraps engine errors)."""
    elist = getattr(exc, "elist", None)  # CompositeError: the first engine's error
    if elist:
        return f"{elist[0][0]}: {elist[0][1]}"
    if getattr(exc, "ename", None):
        return f"{exc.ename}: {getattr(exc, 'evalue', '')}"
    return f"{type(exc).__name__}: {exc}"


def engine_fault(rank: int, slot: Any, exc: BaseException, what: str,
                 died: bool) -> DistributedFitError:
    """The run's one error when a call on one rank's engine failed outside the training loop
    (checking versions, shipping data, planning a resume, restarting an engine)."""
    where = f"rank {rank} (engine {slot.engine_id} on host {slot.host}, pid {slot.pid})"
    result = {"ok": False, "error": "EngineDied" if died else type(exc).__name__,
              "exit_code": slot.exit_code, "message": cause_of(exc), "ended_at": time.time()}
    if died:
        code = f" (exit code {slot.exit_code})" if slot.exit_code is not None else ""
        text = (f"{where} died while {what}{code}; nothing ran. Bring it back with "
                f"%cluster restart {rank}.")
    else:
        text = f"{where} failed while {what}: {cause_of(exc)}"
    return DistributedFitError(text, "failed", rank, {rank: result})


def _describe_stall(where: str, rank: int, result: dict) -> str:
    text = (f"{where} stalled: the other ranks waited {result.get('waited_s', 0):g} s "
            f"(--collective-timeout) for it in a collective; its last step was {result.get('steps', 0)}.")
    if result.get("stopped"):
        return (text + " Its process was stopped (SIGSTOP), which no interrupt reaches and the "
                f"controller stops tracking, so phalanx ended it: %cluster restart {rank} brings "
                "it back.")
    if result.get("error") == "Unresponsive" and result.get("restart_error"):
        return text + (" It did not answer an interrupt either, and restarting its engine "
                       f"failed: {result['restart_error']}. Bring it back with %cluster restart "
                       f"{rank}.")
    if result.get("error") == "Unresponsive":
        return text + " It did not answer an interrupt either, so its engine was restarted."
    return text + " It was interrupted here:\n" + _indent(result)


def _indent(result: dict) -> str:
    trace = (result.get("traceback") or f"{result.get('error')}: {result.get('message', '')}").rstrip()
    return "\n".join("    " + line for line in trace.splitlines())


def root_cause(results: Mapping[int, dict]) -> int | None:
    """The rank whose fault ended the run: a dead engine, a rank's own error, a stalled rank."""
    failed = [r for r, res in sorted(results.items()) if not res.get("ok") and not res.get("resized")]
    rules = (
        lambda res: res.get("error") == "EngineDied" and not res.get("stalled"),
        lambda res: res.get("error") not in SECONDARY and not res.get("interrupted")
        and not res.get("stalled"),
        lambda res: bool(res.get("stalled")),
        lambda res: not res.get("interrupted"),
    )
    for rule in rules:
        for rank in failed:
            if rule(results[rank]):
                return rank
    return None


def failure(status: str, results: Mapping[int, dict], slots: list, opts: Any, wall: float,
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
    lost = next((res for res in results.values() if res.get("error") == "ControllerDied"), None)
    if lost is not None:
        info = lost.get("controller", {})
        return DistributedFitError(
            f"the cluster's controller (pid {info.get('pid')}) exited during the run (exit code "
            f"{info.get('exit_code')}) after {wall:.1f} s; no engine can report without it (last "
            f"steps: {listed}). Start a new cluster with %cluster stop and %cluster start.",
            status, None, results)
    rank = root_cause(results)
    if rank is None:
        return DistributedFitError(f"the run failed after {wall:.1f} s (steps: {listed})", status,
                                   None, results)
    others = [r for r in range(len(slots)) if r != rank]
    text = describe_failure(rank, results[rank], slots[rank])
    if others:
        text += (f"\nThe other rank(s) {', '.join(map(str, others))} were released; the run "
                 f"ended {wall:.1f} s after it started.")
    for other in others:  # a peer left without a working engine must not go unmentioned
        cause = results.get(other, {}).get("restart_error")
        if cause:
            text += (f"\nRank {other} did not stop either, and restarting its engine failed: "
                     f"{cause}. Bring it back with %cluster restart {other}.")
    return DistributedFitError(text, status, rank, results)
