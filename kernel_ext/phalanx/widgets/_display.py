"""What a ``%%distributed_fit`` cell shows, from start to end: the one object the magic uses.

:class:`RunDisplay` picks the live widgets (a Jupyter frontend) or the text progress (a terminal,
or ``--no-widget``), attaches it to the session's event bus when the run starts (``on_start``)
and, at the end, detaches it and hands back the static :class:`RunSummary` to display, also
after a failed or interrupted run, whose curves are worth keeping too.

The live widgets cost the kernel about 25 ms to build and send, as much as a warm one-step run
itself.  A cell whose last run in this kernel was over within ``LIVE_AFTER_S`` shows them only
once its run has trained that long (its events so far are replayed to them); a re-run that is
over sooner shows its summary alone, which holds what the finished view would have shown.

In a Jupyter frontend the magic shows the cell's first line before this module is imported
(a :class:`~._status_line.StatusLine`); the view is then shown in the line's place and, when
the run ends, the summary in the view's: the saved notebook keeps the summary alone, which
GitHub, nbviewer and a notebook reopened without its kernel show (a widget left there reads
"Error displaying widget: model not found").  Without a line (a test's shell) the view and the
summary are both displayed, and the view's plot hides the summary's picture of its own run
with a style inside the widget (``RunView``, ``summary_curves_class``).

The plot is built after the view is on the page, in the run's wait loop, with BokehJS sent to
the page just before it: the first line and the bars never wait for bokeh.

Example::

    shown = RunDisplay(session, shell, widget=opts.widget, body=cell, line=line)
    try:
        session.distributed_fit(body, opts, user_ns, on_start=shown.start)
    finally:
        shown.show_summary(shown.finish())
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

from . import _frontend
from ._bokehjs import load_bokehjs
from ._run_view import PLOT_AFTER_S, calls_log
from ._summary import RunSummary
from ._text import TextProgress

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..fit import RunRecord
    from ._run_view import FollowedRun, RunView
    from ._status_line import StatusLine

log = logging.getLogger("phalanx")

# Each cell body's last run's wall time in this kernel (by the body's hash), the most recent few.
_LAST_WALL: dict[int, float] = {}
_LAST_WALL_KEPT = 256
LIVE_AFTER_S = 1.0  # a cell whose last run was over sooner shows its live view after this long


def _display(obj: object) -> None:
    from IPython.display import display

    display(obj)


class RunDisplay:
    """Live view or text progress of one run, then its summary."""

    def __init__(self, session: Any, shell: InteractiveShell | None = None, widget: bool = True,
                 show: Callable[[object], None] | None = None, body: str | None = None,
                 line: StatusLine | None = None) -> None:
        self.session, self.shell = session, shell
        self.live = bool(widget) and _frontend.widgets_available(shell)
        # The cell's first line (a StatusLine shown before this was imported): the live view
        # takes its place, then the summary takes the view's, so a saved notebook holds the
        # summary alone and no widget a reopened page cannot draw.
        self.line = line
        # The metric plot is built before the run only for a cell that calls log() and whose
        # last run (in this kernel) was not over within seconds; otherwise during the run, once
        # it has trained a while (see RunView).  Re-running a quick cell then costs no plot.
        self._body_key = None if body is None else hash(body)
        last_wall = _LAST_WALL.get(self._body_key) if self._body_key is not None else None
        self.plot_ahead = body is None or (calls_log(body) and not (
            last_wall is not None and last_wall < PLOT_AFTER_S))
        self.live_later = self.live and last_wall is not None and last_wall < LIVE_AFTER_S
        self.view: RunView | TextProgress | None = None
        self.run_id: str | None = None
        self._show = show if show is not None else _display
        self._unsubscribe: Callable[[], None] | None = None
        self._loader: Any = None
        self._lock = threading.Lock()
        self._early: list[dict] = []  # the run's events before its view exists (a second's worth)

    def start(self, tracker: FollowedRun, name: str) -> None:
        """``on_start`` callback of ``Session.distributed_fit``: subscribe, show the view now
        or, for a cell whose last run was quick, once this one has trained LIVE_AFTER_S."""
        self.run_id = tracker.run_id
        self._unsubscribe = self.session.events.subscribe(self._route)
        later = getattr(self.session, "call_in_wait_loop", None) if self.live_later else None
        if later is not None:
            later(lambda: self._open(tracker, name), LIVE_AFTER_S)
        else:
            self._open(tracker, name)

    def _open(self, tracker: FollowedRun, name: str) -> None:
        """Build and show the view, then hand it the events that came before it."""
        view: RunView | TextProgress
        try:
            if self.live:
                from ._run_view import RunView

                view = RunView.for_tracker(
                    tracker, name, on_stop=lambda: self.session.stop_run("Stop under the cell"),
                    plot_ahead=self.plot_ahead, build_with=self._build_plot_with)
                if self.line is not None:
                    view.keep_plot = False  # the summary replaces it (show_summary)
                    self.line.replace_with(view)
                else:
                    self._show(view)
            else:
                view = TextProgress(tracker.run_id, name)
        except Exception:  # a view that cannot be built must not stop the training
            log.exception("phalanx: the live view of %s could not be shown; using text", name)
            view = TextProgress(tracker.run_id, name)
        with self._lock:
            for event in self._early:
                view.handle(event)
            self._early, self.view = [], view

    def _build_plot_with(self, build: Callable[[], None]) -> None:
        """How the view's plot is built: after the bars are on the page, on the cell's own
        thread (the run's wait loop), with BokehJS sent to the page first (8 MB the browser
        takes seconds to evaluate: never before the first line and the bars)."""
        def load_then_build() -> None:
            self._loader = self._loader or load_bokehjs(self.shell)
            build()

        later = getattr(self.session, "call_in_wait_loop", None)
        if later is None:
            load_then_build()
        else:
            later(load_then_build)

    def show_summary(self, summary: RunSummary | None) -> None:
        """Show the run's summary where its live view (or first line) was, else below."""
        if self.line is None:
            if summary is not None:
                self._show_with(summary, summary.metadata)
            return
        # The view's plot leaves the page first (while its view still reads messages), its
        # widget models once replaced: 30 runs left 33 bokeh documents in the page.
        view = self.view
        if view is not None and hasattr(view, "release"):
            view.release()
        if summary is not None:
            # its bundle as is: IPython's formatters would try a dozen types to find these two
            self.line.replace_with(summary.bundle(), metadata=summary.metadata, raw=True)
        else:  # the run never started (a refused cell): its error says it all
            self.line.clear()
        if view is not None and hasattr(view, "close"):
            try:
                view.close()
            except Exception:  # the summary is shown: a view that would not close stays
                log.exception("phalanx: closing the live view failed")

    def _show_with(self, obj: object, metadata: dict) -> None:
        if self._show is _display:
            from IPython.display import display

            display(obj, metadata=metadata)
        else:
            self._show(obj)

    def _route(self, event: dict) -> None:
        """Bus subscriber: to the view, or kept until it exists."""
        with self._lock:
            view = self.view
            if view is None:
                self._early.append(event)
                return
        view.handle(event)

    def finish(self) -> RunSummary | None:
        """Detach the view, show the final state; the summary of this run, if it has a record."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        with self._lock:  # a run over before its view was due: the summary says it all
            self._early = []
        record = self._record()
        if record is not None and self._body_key is not None:
            _LAST_WALL.pop(self._body_key, None)  # re-inserted last: the oldest entry goes first
            _LAST_WALL[self._body_key] = record.wall_s
            while len(_LAST_WALL) > _LAST_WALL_KEPT:
                _LAST_WALL.pop(next(iter(_LAST_WALL)))
        if self.view is not None:
            try:
                self.view.finish(record)
                if self._loader is not None:
                    from ._bokehjs import forget_loader

                    forget_loader(self._loader)
            except Exception:  # the run's own outcome (or error) matters more than its view
                log.exception("phalanx: finishing the live view failed")
        return RunSummary(record) if record is not None else None

    def _record(self) -> RunRecord | None:
        last = self.session.last_record
        if self.run_id is None or last is None or last.run_id != self.run_id:
            return None  # the run ended before it had a record (e.g. interrupted while sending)
        return last
