"""What the kernel answers a JupyterLab panel: the snapshot a freshly attached panel gets, an
earlier run's record and curves, a zoomed chart's window and the cluster log.  Built from the
session's bus and run history and the kernel's run archive; :class:`~._labcomm.LabComm` sends
them over the panel's comm.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Mapping

from . import events
from ._outbox import wire_safe
from ._panel_stream import RunArchive, history_chunks

if TYPE_CHECKING:
    from ._session import Session

log = logging.getLogger("phalanx")

# A reloaded panel gets the run history in chunks of this many rows rather than in one
# message of unbounded size.
HISTORY_CHUNK_ROWS = 5000
# A zoomed chart gets its window at full resolution up to this many points per line.
WINDOW_POINTS = 20_000
# The panel's Log shows the cluster log's last this many lines unless it asks for another count.
LOG_LINES = 200


class PanelAnswers:
    """The answers of :class:`~._labcomm.LabComm`, which holds what they read: the session, the
    lock over the comm's state, the current run's merged progress and the run archive."""

    _session: Session
    _lock: threading.RLock
    _progress: dict[str, dict]
    _runs: RunArchive

    def snapshot_messages(self) -> list[dict]:
        """What a freshly attached panel needs: one snapshot event, then history chunks.

        The snapshot holds the kernel's runs (``runs``), then the bus's latest states with the
        current run's merged progress right after its ``run_started``; the run's downsampled metric rows follow as
        ``metrics`` events of at most :data:`HISTORY_CHUNK_ROWS` rows, the last with the
        downsampled mean line over ranks.  Example: ``[m["type"] for m in
        lab.snapshot_messages()] == ["snapshot", "metrics"]`` after a short run.
        """
        states = self._session.events.snapshot()
        with self._lock:
            progress = dict(self._progress)
            listed = self._runs.entries()
        contents: list[dict] = [events.runs(listed)] if listed else []
        run = None
        for event in states:
            contents.append(event)
            if event.get("type") == "run_started":
                run = event["run"]
                if run in progress:
                    contents.append(progress[run])
        messages = [events.snapshot(contents)]
        if run is not None:
            messages += history_chunks(run, *self._history(), HISTORY_CHUNK_ROWS)
        return messages

    def run_messages(self, run: str) -> list[dict]:
        """The answer to a panel's ``request_run``: the ended run's ``run_record`` and its curves
        in ``metrics`` chunks.  The running run is the snapshot's; a run the kernel no longer
        keeps gets the list of those it keeps (the panel then lets its pick go).

        Example: ``[m["type"] for m in lab.run_messages("9c2b-1")] == ["run_record", "metrics"]``
        """
        found = self._runs.messages(run, HISTORY_CHUNK_ROWS)  # lookups only: no lock needed
        with self._lock:
            listed = self._runs.entries()
        if found is not None:
            return found
        if any(e["run"] == run and e["status"] == "running" for e in listed):
            return self.snapshot_messages()
        return [wire_safe(events.runs(listed))]

    def log_message(self, lines: int = LOG_LINES) -> dict:
        """The answer to a panel's ``request_log``: the ``engine_log`` event with the cluster
        log's last ``lines`` lines (what the engines and the controller said that is not the
        user's; the running ones' output so far included).

        Example: ``lab.log_message(200)["lines"][-1]``
        """
        path, said = self._session.engine_log(lines)
        return wire_safe(events.engine_log(path, said))

    def window_message(self, request: Mapping[str, Any]) -> dict:
        """The ``history_window`` answering a zoomed chart's ``request_window``: the run's rows
        in the step window, read from the whole history (memory or disk), every row up to
        ``max_points`` per line; a run the kernel no longer keeps gets no rows.

        Example: ``lab.window_message({"run": "r1", "start": 100, "end": 200})["rows"]``
        """
        run, start, end = request["run"], request["start"], request["end"]
        current = [e["run"] for e in self._session.events.snapshot()
                   if e.get("type") == "run_started"]
        limit = request.get("max_points") or WINDOW_POINTS
        if current and current[-1] == run:
            rows = self._session.run_history_window(steps=(start, end), max_points=limit)
            means = self._session.run_history_window_means((start, end), max_points=limit)
        else:  # a picked earlier run: from its record
            rows, means = self._runs.window(run, start, end, limit) or ([], {})
        return wire_safe(events.history_window(run, start, end, rows, means))

    def _history(self) -> tuple[list[dict], dict[str, list]]:
        try:
            rows = list(self._session.run_history_rows() or [])
            return rows, dict(self._session.run_history_means() or {})
        except Exception:
            log.exception("phalanx: could not read the run history for the lab panel")
            return [], {}
