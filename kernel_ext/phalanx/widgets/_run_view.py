"""The live view under a ``%%distributed_fit`` cell: header, per-rank progress, live curves.

A :class:`RunView` is a bus subscriber: :meth:`RunView.handle` takes this run's ``metrics``,
``progress`` and ``run_ended`` events (from the tracker's publisher thread, at most ~10/s) and
updates the widgets.  Metric rows are turned into points to append (never a redraw), so the cost
of an update follows what arrived, not the length of the run.

The kernel shares the machine with the engines.  The view keeps up by sending less, not by
skipping updates: rows are split into points as they arrive (about 1 us a row), and every
:data:`LIVE_INTERVAL_S` the header, the counters and the chart are updated with everything
new, the chart's lines downsampled as they grow (:class:`~phalanx.widgets._plot.Line`: each
update streams only the few points that changed, whatever the run's length).  A fixed CPU
budget (0.5% of a core) made the chart wait for seconds on a busy machine, its curve frozen
while the bars and the panel's chart went on.

Example::

    view = RunView("ab12-1", "run-1", world_size=2, total_steps=100)
    display(view)
    unsubscribe = session.events.subscribe(view.handle)
    ...                                  # the run goes
    view.finish(record)
"""

from __future__ import annotations

import html
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from ._format import DOT, fmt_duration, fmt_rate, fmt_wall, overall
from ._plot import MAX_POINTS, WAITING_HTML, LivePlot
from ._progress import ProgressPanel
from ._series import Points, SeriesBuilder, merge
from ._summary import summary_curves_class
from ._throttle import Throttle

if TYPE_CHECKING:
    import ipywidgets

    from ..fit import RunRecord


class FollowedRun(Protocol):
    """What a view needs of the run it shows (the run's tracker, which ``on_start`` gets)."""

    @property
    def run_id(self) -> str: ...

    @property
    def world_size(self) -> int: ...

    @property
    def total_steps(self) -> int | None: ...

# How often the view shows what arrived (header, counters, chart), whatever the load: the cell's
# chart is then at most this far behind the panel's.  An update costs ~1-2 ms (the new points'
# few values, a few widget properties): under 0.5% of a core.
LIVE_INTERVAL_S = 0.5
# A plot not built before the run is built once the run has trained this long: a run that ends
# sooner shows its curves in the summary only (the plot would cost more than the run).
PLOT_AFTER_S = 2.0
# The "call log()" hint waits until the run has stepped this long without a metric row (or has
# ended without one): rows are batched, and a loop may log only every few hundred steps, so a
# hint from the first second told a run that logs to do what it was doing.
NO_METRICS_HINT_AFTER_S = 10.0
NOTHING_LOGGED_HTML = ("<i>no metrics: call <code>log(loss=...)</code> in the cell to plot them "
                       "live</i>")
IN_SUMMARY_HTML = "<i>the run ended within seconds: its curves are in the summary below</i>"
_LOG_CALL = re.compile(r"\blog\s*\(")


def calls_log(body: str) -> bool:
    """Whether a cell body visibly calls ``log(...)`` (``phalanx.log`` or ``log`` imported from
    it; ``torch.log`` counts too, which only builds the plot ahead as before)."""
    return _LOG_CALL.search(body) is not None


class RunView:
    """Live widgets of one run (ipywidgets + a bokeh plot through jupyter_bokeh)."""

    def __init__(self, run_id: str, name: str, world_size: int, total_steps: int | None,
                 clock: Callable[[], float] = time.monotonic,
                 on_stop: Callable[[], object] | None = None, plot_ahead: bool = True,
                 build_with: Callable[[Callable[[], None]], None] | None = None) -> None:
        import ipywidgets as w

        self.run_id, self.name, self.world_size = run_id, name, world_size
        self.header = w.HTML()
        self.stop_button = w.Button(description="Stop run", button_style="danger",
                                    tooltip="Stop this run: every rank stops, the engines stay up",
                                    layout=w.Layout(width="auto", display="" if on_stop else "none"))
        self._on_stop = on_stop
        self.stop_button.on_click(lambda _: self._stop())
        from .._pump import answer_where_sent

        answer_where_sent(getattr(self.stop_button, "comm", None))  # clicked during the run
        self.progress = ProgressPanel(world_size, total_steps)
        self.series = SeriesBuilder(world_size)
        # The plot costs ~0.3 s of kernel CPU to build and send, more than a short run itself.
        # Not built ahead (a cell that calls no log(), or one whose last run was short), it is
        # built once metrics arrive and the run has trained PLOT_AFTER_S; until then, and for a
        # run that ends sooner, a one-line placeholder stands in its place.
        # Built here only where there is no wait loop to build it in (tests, a bare session):
        # a view's bars must reach the page before bokeh is even imported.
        self.plot: LivePlot | None = LivePlot(world_size) if plot_ahead and build_with is None \
            else None
        self._over = False  # the run has ended: a plot not built by now never is
        # Where that build runs: ``build_with(task)`` hands it to the run's wait loop, on the
        # cell's own thread and context like every other widget of the cell; events arrive on
        # the tracker's publisher thread, which has neither.  None: here, as events arrive.
        self._build_with, self._build_asked = build_with, False
        self.build_cpu_s = 0.0  # what building the plot during the run took (not charged)
        self._placeholder = w.HTML(WAITING_HTML)
        self._first_step_at: float | None = None  # view clock when a step was first counted
        self._hinted = False
        self._summary_drawn = False  # the live plot shows the summary's curves: hide them
        self.widget = w.VBox([w.HBox([self.header, self.stop_button]), self.progress.widget,
                              self.plot.model if self.plot is not None else self._placeholder])
        # Whether the view stays on the page after the run (False: the summary replaces it, so
        # the plot is neither sent again whole nor zoomable, and release() drops it).
        self.keep_plot = True
        self.rows_seen = 0
        self.cpu_s = 0.0  # CPU time the live updates took
        self._clock, self._started = clock, clock()
        self._ranks: list[Mapping[str, Any]] = []
        self._status = "running"
        self._wall: float | None = None
        self._inbox: list[Mapping[str, Any]] = []
        self._points: Points = {}  # split from arrived rows, waiting to be streamed
        self._due = Throttle(LIVE_INTERVAL_S, clock)
        self._lock = threading.Lock()
        self._show_header()
        if plot_ahead and build_with is not None:  # right after the view is on the page
            self._build_asked = True
            build_with(self._build_plot_locked)

    @classmethod
    def for_tracker(cls, tracker: FollowedRun, name: str,
                    on_stop: Callable[[], object] | None = None,
                    plot_ahead: bool = True,
                    build_with: Callable[[Callable[[], None]], None] | None = None) -> "RunView":
        """The view of the run ``tracker`` follows (what ``on_start`` receives)."""
        return cls(tracker.run_id, name, tracker.world_size, tracker.total_steps, on_stop=on_stop,
                   plot_ahead=plot_ahead, build_with=build_with)

    def _stop(self) -> None:
        # Only asks: the run's wait loop stops every rank at its next poll.
        self.stop_button.disabled, self.stop_button.description = True, "stopping…"
        if self._on_stop is not None:
            self._on_stop()

    def handle(self, event: Mapping[str, Any]) -> None:
        """Bus subscriber: take this run's events; every LIVE_INTERVAL_S, show them."""
        if event.get("run") != self.run_id:
            return
        with self._lock:
            started = time.thread_time()
            if event.get("type") == "metrics":
                # Split at once (~1 us a row): queued, the row dicts would outlive young-generation
                # garbage collections and make the kernel's full collections more frequent.
                self.rows_seen += len(event["rows"])
                merge(self._points, self.series.add(event["rows"]))
            else:
                self._inbox.append(event)
            # The tracker sends metrics then progress each time: update on the progress event.
            if event.get("type") != "metrics" and self._due.ready():
                self._apply()
            self.cpu_s += time.thread_time() - started

    def drain(self) -> None:
        """Apply every queued event now (tests, and the end of a run)."""
        with self._lock:
            self._apply()

    def finish(self, record: RunRecord | None = None) -> None:
        """The run is over: final means, the engines' exact step counts, the final state."""
        with self._lock:
            self._over = True
            self._apply()
            last = self.series.flush()
            if last and self.plot is not None:
                self.plot.extend(last)
            if record is not None:
                self._status, self._wall = record.status, record.wall_s
                self.progress.finish(record.steps, record.status,
                                     getattr(record, "failed_rank", None))
            elif self._status == "running":
                self._status = "stopped"
            self.stop_button.layout.display = "none"
            trained = self._trained(record)
            if not trained and not self.rows_seen:
                # A cell that trains nothing (a validation pass): its output and the summary's
                # one line say it all; empty bars and a "call log()" hint would not.
                self.progress.widget.layout.display = "none"
                self._chart_widget().layout.display = "none"
                self._show_header()
                return
            if self.plot is None:
                self._placeholder.value = IN_SUMMARY_HTML if self.series.metrics else NOTHING_LOGGED_HTML
                self._show_header()
                return
            if not self.series.metrics:
                self.plot.say(NOTHING_LOGGED_HTML)
            self._summary_drawn = bool(self.plot.metrics)
            self._show_header()
            if not self.keep_plot:  # the summary takes the view's place at once
                return
            self.plot.refresh()
            if record is not None:  # zooming in now shows every logged point of the window
                from ..fit.telemetry import window_points

                self.plot.zoom_from(lambda name, key, start, end:
                                    window_points(record.history, name, key, start, end, MAX_POINTS))

    def release(self) -> None:
        """Before the view is replaced: its plot's document and views leave the page."""
        with self._lock:
            if self.plot is not None:
                self.plot.release()

    def close(self) -> None:
        """Once replaced: close the view's widget models, so the page's manager drops them."""
        with self._lock:
            if self.plot is not None:
                self.plot.close()
            _close_tree(self.widget)

    def _trained(self, record: RunRecord | None) -> bool:
        steps = record.steps.values() if record is not None else (r["step"] for r in self._ranks)
        return any(int(s) > 0 for s in steps)

    def _chart_widget(self) -> ipywidgets.DOMWidget:
        return self.plot.model if self.plot is not None else self._placeholder

    def _hint_if_silent(self) -> None:
        """Say "call log()" once the run has stepped NO_METRICS_HINT_AFTER_S with no row."""
        if self._first_step_at is None and any(int(r["step"]) > 0 for r in self._ranks):
            self._first_step_at = self._clock()
        if (self._hinted or self.rows_seen or self._first_step_at is None
                or self._clock() - self._first_step_at < NO_METRICS_HINT_AFTER_S):
            return
        self._hinted = True
        if self.plot is not None:
            self.plot.say(NOTHING_LOGGED_HTML)
        else:
            self._placeholder.value = NOTHING_LOGGED_HTML

    def _plot_due(self) -> bool:
        return (self.plot is None and not self._over and bool(self._points)
                and self._clock() - self._started >= PLOT_AFTER_S)

    def _build_plot(self) -> None:
        """Build the plot in the placeholder's place and draw every point so far (lock held)."""
        if self.plot is not None or self._over:
            return
        started = time.thread_time()
        self._place_plot(LivePlot(self.world_size), started)

    def _place_plot(self, plot: LivePlot, started: float) -> None:
        """Put a built plot in the placeholder's place with every point so far (lock held)."""
        self.plot = plot
        children = list(self.widget.children)
        children[children.index(self._placeholder)] = self.plot.model
        self.widget.children = tuple(children)
        points, self._points = self._points, {}
        self.plot.extend(points)
        self.build_cpu_s += time.thread_time() - started

    def _build_plot_locked(self) -> None:
        # bokeh's import and the figures (a second or more on a busy machine) outside the
        # lock: the publisher thread keeps the header and the bars going meanwhile.
        if self.plot is not None or self._over:
            return
        started = time.thread_time()
        plot = LivePlot(self.world_size)
        with self._lock:
            if self.plot is None and not self._over:
                self._place_plot(plot, started)

    def _apply(self, chart: bool = True) -> None:
        events, self._inbox = self._inbox, []
        drawn = False
        if chart and self._plot_due():
            if self._build_with is None:
                self._build_plot()
                drawn = True
            elif not self._build_asked:
                self._build_asked = True
                self._build_with(self._build_plot_locked)
        if chart and self.plot is not None and self._points:
            points, self._points = self._points, {}
            self.plot.extend(points)
            drawn = True
        latest = [e for e in events if e.get("type") == "progress"][-1:]
        if latest:
            self._ranks = list(latest[0]["ranks"])
            if self._ranks and len(self._ranks) != self.world_size:  # an elastic run resized
                self.world_size = self.series.world_size = len(self._ranks)
                # The header first: the browser applies widget updates in the order sent, so
                # no row for a new rank shows under a header that still counts the old world.
                self._show_header()
                self.progress.show_ranks(self.world_size)
            self.progress.update(self._ranks)
            self._hint_if_silent()
        memory = [e for e in events if e.get("type") == "memory"][-1:]
        if memory:
            self.progress.update_memory(memory[0]["ranks"])
        times = [e for e in events if e.get("type") == "time"][-1:]
        if times:
            self.progress.update_times(times[0]["ranks"])
        for ended in (e for e in events if e.get("type") == "run_ended"):
            self._status, self._wall = ended["status"], ended["wall_s"]
        if events or drawn:
            self._show_header()

    def _show_header(self) -> None:
        # once ended: the run's own wall time, said as the summary and the panel say it
        elapsed = fmt_wall(self._wall) if self._wall is not None \
            else fmt_duration(self._clock() - self._started)
        parts = [f"<b>{html.escape(self.name)}</b>", html.escape(self._status), elapsed,
                 f"{self.world_size} rank(s)"]
        if self._status == "running":  # a rank stopped at breakpoint(), its debugger in the cell
            parts += [f"<b>rank {r['rank']} paused at line {r['paused']['line']} (breakpoint)</b>"
                      for r in self._ranks if r.get("paused")]
        phase = self._phase()
        if phase is not None:
            parts.append(f"<i>{html.escape(phase)}</i>")
        if any(int(r["step"]) > 0 for r in self._ranks):  # no "0 steps · – steps/s" before
            o = overall(list(self._ranks))
            parts.append(fmt_rate(o["steps_per_s"]) + " per rank")
            if self._status == "running" and o["eta_s"] is not None:
                parts.append(f"ETA {fmt_duration(o['eta_s'])}")
            if o["stragglers"] and self._status == "running":
                parts.append("straggler(s): rank " + ", ".join(map(str, o["stragglers"])))
        # This live plot draws the curves the summary below draws again as a picture (for
        # GitHub, nbviewer and a notebook opened without its kernel): while this view is on the
        # page, the picture is hidden.  The style lives in the widget, so wherever the widget
        # cannot be drawn, nothing hides the picture.
        hide = (f"<style>.{summary_curves_class(self.run_id)}{{display:none}}</style>"
                if self._summary_drawn else "")
        self.header.value = DOT.join(parts) + hide

    def _phase(self) -> str | None:
        """What the run does before its first step, when the bars do not show yet (ranks
        are "started" once their first batch reached the kernel: they have their group)."""
        if self._status != "running" or any(int(r["step"]) > 0 for r in self._ranks):
            return None
        if not self._ranks:
            return f"sending the cell to {self.world_size} rank(s)…"
        waiting = [str(r["rank"]) for r in self._ranks if not r.get("started")]
        if waiting:
            return f"waiting for rank{'s' * (len(waiting) > 1)} {', '.join(waiting)} to start"
        return "every rank started: first step…"

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        bundle = self.widget._repr_mimebundle_(**kwargs) or {}
        # What a saved notebook shows where no widget can be drawn: the summary follows it.
        bundle["text/plain"] = f"phalanx live view of {self.name} (needs a running kernel)"
        return bundle


def _close_tree(widget: ipywidgets.Widget) -> None:
    """Close ``widget`` and every widget under it (closing a box leaves its children open)."""
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    if getattr(widget, "comm", None) is not None:  # closed already (the plot's): closing again raises
        widget.close()
