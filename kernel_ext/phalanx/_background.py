"""Runs that train in the background: ``%%distributed_fit --background`` returns at once.

The run goes on a thread of its own, inside a copy of the cell's context, so what it prints
and shows (the live view, the engines' output, the summary, its error) lands under the cell
that started it while other cells run.  The notebook gets a :class:`BackgroundRun` handle (the
cell's value, and :func:`runs`).  Everything the person could do to the engines meanwhile is
refused by the session naming the running job (a second run, a restart, stopping the cluster,
scaling a run that cannot change size).

Example::

    run = session_run_in_background(...)   # what the magic does with --background
    run.status                             # 'running'
    run.wait(timeout=60)                   # the RunRecord, or the run's own error
    run.result("model")                    # a --return name
"""

from __future__ import annotations

import contextvars
import html
import threading
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ._session import Session
    from .fit import RunRecord
    from .fit.telemetry._tracker import RunTracker

    OnStart = Callable[[RunTracker, str], None]   # a run is under way: its tracker and name

_NOT_YET = "the run has not ended yet: run.wait() first"


class BackgroundRun:
    """A handle on one background run (thread-safe)."""

    def __init__(self, session: Session, returns: tuple[str, ...], user_ns: dict) -> None:
        self._session, self._returns, self._ns = session, tuple(returns), user_ns
        self._done = threading.Event()
        self.name: str | None = None
        self.run_id: str | None = None
        self.record: RunRecord | None = None
        self.error: BaseException | None = None
        self.started = time.monotonic()

    @property
    def status(self) -> str:
        """starting | running | done | failed | interrupted | timeout."""
        if not self._done.is_set():
            return "running" if self.run_id is not None else "starting"
        if self.record is not None and self.error is None:
            return self.record.status
        return getattr(self.error, "status", "failed")

    def wait(self, timeout: float | None = None) -> RunRecord | None:
        """Block until the run ends; its RunRecord, or its error raised here.

        Raises ``TimeoutError`` when it is still running after ``timeout`` seconds.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.name or 'the run'} is still running after {timeout:g} s; "
                               "run.stop() ends it")
        if self.error is not None:
            raise self.error
        return self.record

    def stop(self) -> bool:
        """Ask the run to stop at its next poll (every rank released, engines kept)."""
        if self._done.is_set():
            return False
        return self._session.stop_run(f"{self.name}.stop()" if self.name else "run.stop()")

    def result(self, name: str) -> object:
        """The value of ``name`` brought back with ``--return`` (after the run ended well)."""
        if not self._done.is_set():
            raise RuntimeError(_NOT_YET)
        if self.error is not None:
            raise RuntimeError(f"{self.name} ended {self.status}: nothing was returned") from self.error
        if name not in self._returns:
            raise KeyError(f"{name!r} was not asked for: the run returned "
                           f"{', '.join(self._returns) or 'nothing'} (--return NAMES)")
        return self._ns[name]

    def __repr__(self) -> str:
        where = f"{self.name} " if self.name else ""
        text = f"<phalanx background run {where}{self.status}"
        if self._done.is_set() and self.record is not None:
            text += f" after {self.record.wall_s:.1f} s"
        return text + ">"

    def _repr_html_(self) -> str:
        return (f"<span><b>{html.escape(self.name or 'background run')}</b> "
                f"{html.escape(self.status)} in the background: <code>run.wait()</code>, "
                "<code>run.stop()</code>, <code>run.status</code></span>")

    # --- the thread's side ----------------------------------------------------------------------

    def _started(self, tracker: RunTracker, name: str) -> None:
        self.run_id, self.name = tracker.run_id, name

    def _ended(self, record: RunRecord | None, error: BaseException | None) -> None:
        self.record, self.error = record, error
        self._done.set()


def run_in_background(session: Session, fit: Callable[[OnStart], RunRecord],
                      returns: tuple[str, ...],
                      user_ns: dict, report: Callable[[BackgroundRun], None]) -> BackgroundRun:
    """Start ``fit(on_start)`` on a thread; returns its handle once the run is under way.

    ``fit`` runs the cell the way the foreground magic does (view, record, summary) and
    ``report`` says how it ended, both under the starting cell.  Waits until the run is the
    session's active run (or failed to start, raising that error here), so the next cell is
    refused a second run rather than racing it.
    """
    handle = BackgroundRun(session, returns, user_ns)
    under_way = threading.Event()

    def on_start(tracker: RunTracker, name: str) -> None:
        handle._started(tracker, name)
        under_way.set()

    def main() -> None:
        record, error = None, None
        try:
            record = fit(on_start)
        except BaseException as exc:  # reported like a foreground run's error, on the handle too
            error = exc
            last = session.last_record
            if handle.run_id is not None and last is not None and last.run_id == handle.run_id:
                record = last  # a failed run keeps its record (history, steps, changes)
        handle._ended(record, error)
        under_way.set()
        if handle.run_id is not None:  # one that never started is raised in the cell, once
            report(handle)

    context = contextvars.copy_context()  # the cell's parent message: output lands under it
    thread = threading.Thread(target=context.run, args=(main,), daemon=True,
                              name="phalanx-background-run")
    thread.start()
    under_way.wait()
    if handle.error is not None and handle.run_id is None:
        raise handle.error  # bad options, no cluster, a run already going: said at once
    runs_of(session).append(handle)
    return handle


def report_end(shell: InteractiveShell, handle: BackgroundRun) -> None:
    """Say under the starting cell how the run ended: its error exactly as a foreground run's
    (IPython's error output), or which ``--return`` names are in the namespace now."""
    error = handle.error
    if error is not None:
        render = getattr(error, "_render_traceback_", None)
        stb = render() if render is not None else shell.InteractiveTB.structured_traceback(
            type(error), error, error.__traceback__)
        shell._showtraceback(type(error), error, stb)
        return
    returned = ", ".join(handle._returns)
    wall = handle.record.wall_s if handle.record is not None else time.monotonic() - handle.started
    print(f"phalanx: {handle.name} done in {wall:.1f} s"
          + (f"; {returned} now in the namespace" if returned else ""), flush=True)


def runs_of(session: object) -> list[BackgroundRun]:
    """The session's background runs, oldest first."""
    found = session.__dict__.get("background_runs")
    if found is None:
        found = session.__dict__.setdefault("background_runs", [])
    return found
