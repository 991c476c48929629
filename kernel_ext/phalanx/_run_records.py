"""The session's side of the notebook's run log: each run written as it starts and ends.

A mixin of :class:`~phalanx._session.Session`.  The log belongs to the notebook the kernel runs
(:func:`~phalanx.fit.telemetry._run_log.notebook_folder`); it is opened at the first run or the first
``phalanx.runs()`` and handed to the fit runner, which numbers runs and writes histories there.
A log that cannot be written (a read-only home) is said once and never stops a run.

Example: ``session.runs()[-1].name`` after a run in this notebook, also after a restart.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from .fit import FitRunner, FitUsageError
from .fit.telemetry._run_log import DEFAULT_KEEP, RunLog, keep_setting, notebook_folder

log = logging.getLogger("phalanx")
_START_LOCK = threading.Lock()  # a run's start is written by its wait loop, or by runs() first


def _final_means(record: Any) -> dict[str, float]:
    """Each metric's last value, averaged over the ranks that logged it."""
    sums: dict[str, list[float]] = {}
    for latest in record.final_metrics().values():
        for name, value in latest.items():
            sums.setdefault(name, []).append(float(value))
    return {name: sum(values) / len(values) for name, values in sums.items()}


class RunRecords:
    """Writes each run into the notebook's run log; lists the log (``phalanx.runs()``)."""

    fits: FitRunner
    shell: Any
    call_in_wait_loop: Callable[..., None]
    _unwritten_start: list[Callable[[], None]]  # the running run's start, until in the log

    def run_log(self, user_ns: dict | None = None) -> RunLog:
        """The notebook's run log (opened on first use; ``user_ns`` tells which notebook)."""
        if self.fits.run_log is None:
            try:
                keep = keep_setting()
            except ValueError as exc:
                raise FitUsageError(str(exc)) from None
            namespace = user_ns if user_ns is not None else getattr(self.shell, "user_ns", None)
            # 0: nothing beyond the kernel: the log lives in the session's temporary folder
            folder = (notebook_folder(namespace) if keep else
                      os.path.join(self.fits.rendezvous.directory, "runs"))
            self.fits.run_log = RunLog(folder, keep or DEFAULT_KEEP)
        return self.fits.run_log

    def _record_started(self, tracker: Any, name: str, body: str) -> None:
        """Written from the run's wait loop, while the engines work (a file written before the
        dispatch held a warm re-run's engines back 0.5 ms), or at its end if sooner."""
        number = int(str(tracker.run_id).rsplit("-", 1)[1])
        self._unwritten_start = [lambda: self._logged(
            lambda runs: runs.started(tracker.run_id, number, name, body, tracker.world_size,
                                      tracker.total_steps))]
        self.call_in_wait_loop(self._write_start)

    def _write_start(self) -> None:
        """Write the running run's start if it is not yet (any thread; one writes it, and the
        others return once it is written)."""
        with _START_LOCK:
            try:
                write = getattr(self, "_unwritten_start", []).pop()
            except IndexError:
                return
            write()

    def _record_ended(self, run_id: str, error: BaseException | None) -> None:
        self._write_start()  # a run that ended before its wait loop ran: its start first
        record = self.fits.last
        if record is not None and record.run_id == run_id:
            self._logged(lambda runs: runs.ended(run_id, record.status, record.wall_s,
                                                 record.steps, _final_means(record), record.error,
                                                 record.world_size))
        else:  # ended before it had a record (interrupted while sending, a restart that raised)
            status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
            said = (str(error).splitlines() or [type(error).__name__])[0] if error else None
            self._logged(lambda runs: runs.ended(run_id, status, 0.0, error=said))

    def _logged(self, write: Any) -> None:
        runs = self.fits.run_log
        if runs is None:
            return
        try:
            write(runs)
        except OSError as exc:  # the log is a convenience: training goes on without it
            log.warning("phalanx: the run log in %s could not be written (%s); set "
                        "PHALANX_RUNS_DIR to a writable folder", runs.directory, exc)

    def runs(self) -> Any:
        """The notebook's runs, oldest first, across kernel restarts (``phalanx.runs()``)."""
        from ._background import runs_of
        from ._run_list import PastRun, RunList

        self._write_start()  # a run started a moment ago is listed, running
        runs = self.run_log()
        handles = {h.run_id: h for h in runs_of(self)}
        return RunList(PastRun(entry, runs, handles.get(entry["run"])) for entry in runs.entries())
