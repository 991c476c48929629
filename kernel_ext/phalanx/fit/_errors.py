"""How a failed run is reported in the cell: one error naming the rank, the host and the time."""

from __future__ import annotations


class DistributedFitError(RuntimeError):
    """A run that did not complete; the message names the rank at fault and what happened.

    IPython shows only the message (``_render_traceback_``): the remote traceback is already in
    it, and phalanx's own frames would only hide it.
    """

    def __init__(self, message: str, status: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.rank = rank

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self.args[0]}"]


class VersionSkewError(RuntimeError):
    """Engines run other versions of key packages than the kernel."""


def describe_failure(rank: int, result: dict, slot) -> str:
    """One paragraph for one failed rank."""
    where = f"rank {rank} (engine {slot.engine_id} on host {slot.host}, pid {slot.pid})"
    steps = result.get("steps", 0)
    if result.get("error") == "EngineDied":
        code = result.get("exit_code")
        return (f"{where} died during the run after step {steps}"
                + (f" (exit code {code})" if code is not None else "")
                + f". Bring it back with %cluster restart {rank}.")
    if result.get("error") == "Unresponsive":
        return (f"{where} stopped answering: it did not come back within "
                f"{result.get('grace_s', 10):g} s of an interrupt (stuck in native code?), so "
                f"its engine was restarted; its last reported step was {steps}.")
    if result.get("interrupted"):
        return f"{where} was stopped at step {steps}."
    trace = result.get("traceback", "").rstrip()
    return (f"{where} raised {result.get('error')} after {steps} step(s):\n"
            + "\n".join("    " + line for line in trace.splitlines()))
