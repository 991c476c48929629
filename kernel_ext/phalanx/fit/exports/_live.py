"""Following a running run into TensorBoard and MLflow, and exporting a finished one.

:class:`LiveExport` follows a running run's history on a thread of its own, about twice a
second: the receiver thread only appends to the history, as before, so a slow disk never delays
metric intake and the training loop never waits on a tracker.  Rows are written in arrival order
(each rank's steps in the order it logged them), none dropped; :meth:`LiveExport.finish` writes
what is left, the summary and the manifest, and flushes.  :func:`export_record` writes a
finished run the same way, from its history in memory or on disk.

Example (a finished run, as ``RunRecord.export_tensorboard`` does)::

    export_record(phalanx.last_run(), TensorBoardSink("runs"))
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping

import numpy as np

from ..analysis._cell_warning import warn_at_cell
from ._run_shape import ExportWarning, Lines, RunInfo, Series, Sink, option_params, run_summary
from ..run._fit_options import FitUsageError

log = logging.getLogger("phalanx")

EXPORT_INTERVAL_S = 0.5      # how often a live export looks for new rows
EXPORT_MAX_ROWS = 50_000     # rows read from the history at once (a backlog goes in parts)


class _Feed:
    """Sinks fed the same lines; a sink that fails is set aside (said once at the end) so the
    others, and the run, go on."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = list(sinks)
        self.failures: list[str] = []

    def each(self, call: Callable[[Sink], None]) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as exc:  # noqa: BLE001 - a broken export must not break the run
                log.exception("phalanx: writing the run to %s failed", sink.what)
                self.failures.append(f"writing the run to {sink.what} failed, it stopped there: "
                                     f"{type(exc).__name__}: {exc}")
                self.sinks.remove(sink)
                _close_quietly(sink)

    def write(self, lines: list[Series]) -> None:
        if lines:
            self.each(lambda s: s.write(lines))

    def end(self, summary: dict[str, Any], manifest: Mapping[str, Any]) -> None:
        self.each(lambda s: s.end(summary, manifest))
        self.each(lambda s: s.close())
        for message in self.failures:
            warn_at_cell(message, ExportWarning)


def _close_quietly(sink: Sink) -> None:
    try:
        sink.close()
    except Exception:  # noqa: BLE001 - already failed; its first error is the one said
        pass


class LiveExport:
    """Writes a running run's rows to its sinks from a thread of its own.

    Example (what the runner does)::

        export = LiveExport(tracker, sinks, RunInfo(...)); export.start()
        ...  # the run
        export.finish(record)
    """

    def __init__(self, tracker: Any, sinks: list[Sink], run: RunInfo,
                 interval: float = EXPORT_INTERVAL_S) -> None:
        self.tracker = tracker
        self.run = run
        self.interval = interval
        self._feed = _Feed(sinks)
        self._lines = Lines(tracker.world_size)
        self._done = 0   # history rows written
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"phalanx-export-{run.run_id}")

    def start(self) -> None:
        """Follow the run (its sinks have begun: see :func:`open_live`)."""
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._pump()

    def _pump(self) -> None:
        """Write every row that arrived since the last call, in parts of bounded size."""
        history = self.tracker.history
        self._lines.means.world_size = self.tracker.world_size  # a resized run
        while True:
            stop = min(len(history), self._done + EXPORT_MAX_ROWS)
            if stop <= self._done:
                return
            lines = self._lines.add(history.columns(self._done, stop=stop))
            self._done = stop
            self._feed.write(lines)

    def finish(self, record: Any | None) -> None:
        """The run is over (``record``: its record, None when it ended before one was made):
        write the rest, the summary and the manifest, and flush."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._pump()
        rest = self._lines.finish()
        self._feed.write(rest)
        if record is not None:
            summary, manifest = run_summary(record), record.manifest
        else:
            summary = {"status": "failed", "wall_s": time.time() - self.run.started,
                       "steps": dict(self.tracker.steps), "rows": len(self.tracker.history)}
            manifest = {}
        self._feed.end(summary, manifest)


def export_record(record: Any, sink: Sink) -> None:
    """Write a finished run (a :class:`~phalanx.fit.telemetry._record.RunRecord`) to ``sink`` as a live export of
    it would have: the same lines, hyperparameters, summary and manifest.  A failure is the
    call's error (the export was what was asked for)."""
    history = record.history
    first = history.columns(0, stop=1)["t"] if len(history) else np.zeros(0)
    started = float(first[0]) if len(first) else time.time() - record.wall_s
    params = dict(record.manifest.get("options") or {})
    lines = Lines(record.world_size)
    try:
        sink.begin(RunInfo(record.run_id, record.name, record.world_size, params, started))
        for batch in history.batches():
            sink.write(lines.add(batch))
        sink.write(lines.finish())
        sink.end(run_summary(record), record.manifest)
    finally:
        sink.close()


def open_live(opts: Any, tracker: Any, name: str) -> LiveExport | None:
    """The live export ``--tensorboard`` / ``--mlflow`` ask for (None: neither), each sink
    begun: a missing package (:class:`~phalanx.fit.exports._run_shape.MissingExtra`) or a destination that cannot be
    written is said before anything is sent, as a :class:`~phalanx.fit.run._fit_options.FitUsageError`."""
    from ._mlflow import MlflowSink
    from ._tensorboard import TensorBoardSink

    run = RunInfo(tracker.run_id, name, tracker.world_size, option_params(opts), tracker.started)
    sinks: list[Sink] = []
    for flag, where, kind in (("--tensorboard", opts.tensorboard, TensorBoardSink),
                              ("--mlflow", opts.mlflow, MlflowSink)):
        if not where:
            continue
        sink: Sink | None = None
        try:
            sink = kind(where)
            sink.begin(run)
        except Exception as exc:
            for opened in sinks + ([sink] if sink is not None else []):
                _close_quietly(opened)
            if isinstance(exc, FitUsageError):
                raise
            raise FitUsageError(f"{flag} {where}: cannot write the run there "
                                f"({type(exc).__name__}: {exc})") from exc
        sinks.append(sink)
    return LiveExport(tracker, sinks, run) if sinks else None
