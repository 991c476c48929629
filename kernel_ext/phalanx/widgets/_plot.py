"""The live metric plot: bokeh figures in a jupyter_bokeh ``BokehModel``, fed by streaming.

One tab per logged metric (found as rows arrive), each with a linear and a log-scale tab; every
tab shows one line per rank plus the mean.  Points are appended with
``ColumnDataSource.stream``: each update sends only the new points, never the whole plot, and
each line draws at most :data:`MAX_POINTS` of them, chosen by a min/max-preserving downsampling.

Metric and scale choice are bokeh ``Tabs`` and the legend hides a line on click: all of it runs
in the browser, because while a cell runs the kernel does not read widget messages, so a control
that needs a Python callback would not answer until the run is over.

Example::

    plot = LivePlot(world_size=2)
    display(plot.model)
    plot.extend(SeriesBuilder(2).add(rows))
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable, Literal, cast

import numpy as np

from ._format import rank_colour
from ._series import MEAN, Points

LEGEND_MAX_RANKS = 8   # beyond this a per-rank legend hides the plot; the mean keeps its entry
MAX_POINTS = 4000      # drawn per line, whatever the run's length (see Line)
MARKERS_UP_TO = 50     # points on a line before its markers are hidden
_HEIGHT = 280
# Before the first metric row the chart's place stays empty: rows come in batches, and a hint
# to call log() shown meanwhile told a run that logs to log (see RunView's hint timing).
WAITING_HTML = ""
# Run in the page when the view is replaced (bokeh's own CustomJS, on a change of the root's
# tags): the page's BokehJS keeps every document it ever built in ``Bokeh.documents`` and every
# root view in ``Bokeh.index``, and jupyter_bokeh releases neither when its view goes.  Nothing
# is sent back (a cleared document would send its removed roots to a closed comm).
RELEASE_JS = """
const doc = cb_obj.document
if (doc != null) {
  if (doc.views_manager != null) doc.views_manager.clear()
  const docs = window.Bokeh != null ? window.Bokeh.documents : null
  const i = docs != null ? docs.indexOf(doc) : -1
  if (i >= 0) docs.splice(i, 1)
}
"""
RELEASED_TAG = "phalanx-released"


class Line:
    """One curve (a rank's or the mean) drawn in several figures, at most ~:data:`MAX_POINTS`.

    A run logs for days; the browser draws a few thousand points per line.  Every point goes
    through an incremental min/max-preserving downsampler (:class:`~phalanx.fit.telemetry._downsample.M4Stream`):
    until the line outgrows its budget each point is drawn as it is, then buckets of points are
    drawn by their first, lowest, highest and last point, so spikes and the last point always
    show.  An update streams the new points and patches the last bucket, which is still
    filling; when the buckets double in width (rarely: once per doubling of the run) the source
    is replaced.  The bokeh column therefore stays small, and so does the cost of ``stream``.

    A line of one point draws nothing, so points also get markers while the line is short (a
    metric logged once an epoch); past :data:`MARKERS_UP_TO` points they are hidden.

    Renderers are built by hand rather than with ``figure.line``: that also makes selection and
    muted glyph models for each, which the browser derives by itself, and every model costs
    kernel CPU to build and to send.
    """

    def __init__(self, figures: list, colour: str, width: float = 1.5, alpha: float = 0.8,
                 dash: str = "solid", max_points: int | None = None) -> None:
        from ..fit.telemetry import M4Stream

        self.markers: list[Any] = []
        self.renderers: list[list[Any]] = [[] for _ in figures]  # per figure, for its legend
        self.legend_items: list[Any] = []                           # set by the panel
        self._style: dict[str, Any] = {"line_color": colour, "line_width": width,
                                       "line_alpha": alpha, "line_dash": dash}
        self._m4 = M4Stream(max_points or MAX_POINTS, columns=2)
        self._drawn = 0  # points in the source
        self.source = self._build(figures)

    def append(self, xs: np.ndarray, ys: np.ndarray) -> None:
        """Add the points ``(xs, ys)`` at the end of the line (drawn downsampled)."""
        keep, new = self._m4.add(np.stack([np.asarray(ys, float), np.asarray(xs, float)], axis=1))
        stale = self._drawn - keep  # drawn points of the filling bucket, now replaced
        if keep == 0 and self._drawn:
            self.source.data = {"x": new[:, 1].copy(), "y": new[:, 0].copy()}
        else:
            if stale:  # a patch travels as the few new values, like a stream
                span = slice(keep, self._drawn)
                self.source.patch({"x": [(span, new[:stale, 1])], "y": [(span, new[:stale, 0])]})
            if len(new) > stale:
                # Arrays travel as one binary buffer; a list is encoded number by number.
                self.source.stream({"x": new[stale:, 1].copy(), "y": new[stale:, 0].copy()})
        self._drawn = keep + len(new)
        if self.markers and self.markers[0].visible and self._drawn > MARKERS_UP_TO:
            self._hide_markers()

    def show_window(self, start: float, end: float, xs: np.ndarray | None, ys: np.ndarray | None) -> None:
        """Draw ``(xs, ys)`` (a full-resolution window) in place of the downsampled points
        between ``start`` and ``end``; ``None``: the downsampled curve everywhere again."""
        drawn = self._m4.points()
        bx, by = drawn[:, 1], drawn[:, 0]
        if xs is not None:
            before, after = bx < start, bx > end
            bx = np.concatenate([bx[before], xs, bx[after]])
            by = np.concatenate([by[before], ys, by[after]])
        self.source.data = {"x": np.asarray(bx, float), "y": np.asarray(by, float)}
        self._drawn = len(bx)

    def span(self) -> float:
        """Steps from the line's first point to its last."""
        drawn = self._m4.points()
        return float(drawn[-1, 1] - drawn[0, 1]) if len(drawn) else 0.0

    def _hide_markers(self) -> None:
        for marker in self.markers:
            marker.visible = False
        # Out of the legend too: its "hide" click flips every renderer of an item (it would show
        # them again) and it greys an item out while any of them is hidden.
        for item in self.legend_items:
            item.renderers = [r for r in item.renderers if r not in self.markers]

    def __len__(self) -> int:
        """Points drawn on the line."""
        return self._drawn

    @property
    def logged(self) -> int:
        """Points the line was given (drawn or summarised)."""
        return self._m4.count

    def values(self) -> list[float]:
        """Every drawn y value, in order."""
        return [float(v) for v in self.source.data["y"]]

    def _build(self, figures: list) -> Any:
        from bokeh.models import ColumnDataSource, Scatter
        from bokeh.models import Line as LineGlyph
        from bokeh.models.renderers import GlyphRenderer  # where bokeh's type stubs declare it

        source = ColumnDataSource(data={"x": np.zeros(0), "y": np.zeros(0)})
        colour, alpha = self._style["line_color"], self._style["line_alpha"]
        for i, fig in enumerate(figures):
            added = [GlyphRenderer(data_source=source, glyph=LineGlyph(x="x", y="y", **self._style)),
                     GlyphRenderer(data_source=source, glyph=Scatter(
                         x="x", y="y", size=5, fill_color=colour, line_color=colour, fill_alpha=alpha))]
            self.markers.append(added[-1])
            fig.renderers = [*fig.renderers, *added]
            self.renderers[i].extend(added)
        return source


class MetricPanel:
    """One metric's tab content: a linear and a log-scale figure, a line per rank and the mean."""

    def __init__(self, world_size: int, name: str = "") -> None:
        from bokeh.models import TabPanel, Tabs
        from bokeh.models.annotations import Legend, LegendItem

        self.figures = [_figure(name, "linear")]
        self.figures.append(_figure(name, "log", x_range=self.figures[0].x_range))
        self.lines: dict[Hashable, Line] = {
            rank: Line(self.figures, rank_colour(rank)) for rank in range(world_size)}
        self.lines[MEAN] = Line(self.figures, "black", width=2.5, alpha=1.0, dash="dashed")
        labelled = [(f"rank {r}", self.lines[r]) for r in range(world_size)
                    if world_size <= LEGEND_MAX_RANKS] + [("mean", self.lines[MEAN])]
        for i, fig in enumerate(self.figures):
            items = [LegendItem(label=label, renderers=list(line.renderers[i])) for label, line in labelled]
            for (_, line), item in zip(labelled, items):
                line.legend_items.append(item)
            # click_policy "hide": the browser hides a line on click, no kernel round trip
            fig.add_layout(Legend(items=items, click_policy="hide", location="top_right"))
        self.scales = Tabs(tabs=[TabPanel(child=self.figures[0], title="linear"),
                                 TabPanel(child=self.figures[1], title="log")],
                           tabs_location="right", sizing_mode="stretch_width")

    def add_rank(self, rank: int) -> "Line":
        """A line for a rank the run gained (an elastic run that grew), in the legend before the
        mean's entry."""
        from bokeh.models.annotations import LegendItem

        line = self.lines[rank] = Line(self.figures, rank_colour(rank))
        if rank < LEGEND_MAX_RANKS:
            for i, fig in enumerate(self.figures):
                item = LegendItem(label=f"rank {rank}", renderers=list(line.renderers[i]))
                line.legend_items.append(item)
                for legend in fig.legend:
                    legend.items = [*legend.items[:-1], item, *legend.items[-1:]]
        return line

    def rename(self, name: str) -> None:
        """Label a panel built ahead with the metric it now shows (a few small changes)."""
        from bokeh.models import HoverTool, PlainText

        for fig in self.figures:
            fig.yaxis.axis_label = PlainText(name)  # never TeX: see _bokehjs.COMPONENTS
            for tool in fig.select(type=HoverTool):
                tool.tooltips = [("step", "@x"), (name, "@y")]


def _figure(name: str, scale: Literal["linear", "log"], x_range: Any = None) -> Any:
    from bokeh.models import HoverTool, PlainText
    from bokeh.plotting import figure

    extra = {} if x_range is None else {"x_range": x_range}
    # A metric's name is plain text, never TeX: the page loads no MathJax (_bokehjs.COMPONENTS)
    fig = figure(height=_HEIGHT, sizing_mode="stretch_width", y_axis_type=scale,
                 x_axis_label="step", y_axis_label=PlainText(name), toolbar_location="above",
                 tools="pan,wheel_zoom,box_zoom,reset,save", **extra)
    fig.add_tools(HoverTool(tooltips=[("step", "@x"), (name, "@y")]))
    # Six tools and a logo above every chart were the loudest thing under a short run: they
    # show while the pointer is over the chart, where they are used.
    fig.toolbar.autohide, fig.toolbar.logo = True, None
    return fig


class LivePlot:
    """Per-metric live curves; ``lines[(metric, rank or "mean")]`` hold every point shown.

    The first metric's panel is built with the plot, hidden, and sent with the first render: the
    first metric a run logs then only relabels it instead of building and sending two figures
    (~0.1 s of kernel CPU) while the engines train.  It sits in the tabs from the start because
    moving a model in the document makes bokeh treat it as new and send it again.
    """

    def __init__(self, world_size: int) -> None:
        from bokeh.layouts import column
        from bokeh.models import CustomJS, TabPanel, Tabs
        from bokeh.models.widgets import Div

        from ._bokeh import BatchedBokehModel

        self.world_size = world_size
        self.lines: dict[tuple[str, Hashable], Line] = {}
        self.metrics: list[str] = []  # in tab order
        self.panels: dict[str, MetricPanel] = {}
        self._lock = threading.RLock()
        self._fetch: Callable | None = None  # set by zoom_from once the run is over
        self._windows: dict[str, tuple[float, float]] = {}  # per metric: the x window drawn
        self._first: MetricPanel | None = MetricPanel(world_size)
        self._subscribe(self._first)
        self.tabs = Tabs(tabs=[TabPanel(child=self._first.scales, title="")], visible=False,
                         sizing_mode="stretch_width")
        self._waiting = Div(text=WAITING_HTML, disable_math=True)
        self.root = column(self._waiting, self.tabs, sizing_mode="stretch_width")
        self.root.js_on_change("tags", CustomJS(code=RELEASE_JS))  # see release()
        self.model = BatchedBokehModel(self.root)
        self.released = False

    def extend(self, points: Points) -> None:
        """Append new points (from :class:`~phalanx.widgets._series.SeriesBuilder`)."""
        with self._lock:
            if any((name, key) not in self.lines for name, lines in points.items() for key in lines):
                with self.model.batched(everything=True):  # sent before any point streams in
                    for name in points:
                        if (name, MEAN) not in self.lines:
                            self._add_metric(name)
                    for name, lines in points.items():
                        for key in lines:
                            if (name, key) not in self.lines:  # a rank an elastic run gained
                                rank = int(cast(int, key))  # the mean's line exists already
                                self.world_size = max(self.world_size, rank + 1)
                                self.lines[(name, key)] = self.panels[name].add_rank(rank)
            with self.model.batched():
                self._stream(points)

    def _stream(self, points: Points) -> None:
        for name, lines in points.items():
            for key, (xs, ys) in lines.items():
                if xs:
                    self.lines[(name, key)].append(np.asarray(xs, dtype=float),
                                                   np.asarray(ys, dtype=float))

    def points(self, metric: str, key: Hashable) -> int:
        """How many points the line ``key`` (a rank or ``"mean"``) of ``metric`` holds."""
        line = self.lines.get((metric, key))
        return 0 if line is None else len(line)

    def refresh(self) -> None:
        """Send the whole document again (once, at the end of a run), if it changed.

        jupyter_bokeh delivers updates only to views that exist when they are sent; a view drawn
        later (a reloaded page) or one that missed early updates starts from the document sent
        here.  This re-renders the plot (~0.1 s), so it is done once, not per update, and not
        at all when no update was sent since the last render.
        """
        with self._lock:
            if self.model.patched:
                self.model.update_from_model(self.root)

    def release(self) -> None:
        """Drop the plot's document and views in the page, before its view is replaced.

        Sent while the view is still on the page (a removed view reads no more messages); the
        widget model is closed by the caller once the view is gone (:meth:`close`).
        """
        with self._lock:
            if self.released:
                return
            self.released, self._fetch = True, None
            self.root.tags = [RELEASED_TAG]

    def close(self) -> None:
        """Close the widget model: the page's widget manager drops it."""
        with self._lock:
            self.released = True
            self.model.close()

    def _add_metric(self, name: str) -> None:
        from bokeh.models import TabPanel

        if self._first is not None:
            panel, self._first = self._first, None
            panel.rename(name)
            first_tab = self.tabs.tabs[0]
            assert isinstance(first_tab, TabPanel)  # the plot builds its tabs as TabPanels
            first_tab.title = name
            self.tabs.visible, self._waiting.visible = True, False
        else:
            panel = MetricPanel(self.world_size, name)
            self._subscribe(panel)
            self.tabs.tabs = [*self.tabs.tabs, TabPanel(child=panel.scales, title=name)]
        for key, line in panel.lines.items():
            self.lines[(name, key)] = line
        self.metrics.append(name)
        self.panels[name] = panel

    def say(self, text: str) -> None:
        """Show ``text`` (HTML) in the chart's place while it has no curve."""
        with self._lock:
            if not self.metrics:
                self._waiting.text = text

    def zoom_from(self, fetch: Callable[[str, Hashable, float, float], tuple]) -> None:
        """After the run: zooming into a window redraws it at full resolution.

        ``fetch(metric, rank or "mean", start, end)`` returns that window's ``(steps, values)``
        (from the run's history).  Zooms before this call (during the run) redraw nothing.  A
        window that holds far more points than a line draws keeps the downsampled curve.
        """
        self._fetch = fetch

    def _subscribe(self, panel: MetricPanel) -> None:
        """Call :meth:`_zoomed` when the person pans, zooms or resets one of ``panel``'s figures.

        Subscribed when the figures are built, so that the browser gets the subscription with
        the figures themselves.  On bokeh's ``RangesUpdate``, which the browser sends for what
        the person did, and not on changes of the x range itself: the browser also moves the
        range when the data changes (it fits the range to the data), so redrawing on those fed
        itself - new data, a refitted range, new data - and kept the browser and the kernel busy
        after the run (measured: about 1.2 s of the browser's CPU every second and 25 document
        patches a second, in 4 of 6 pages after a short run).  Both figures share the x range,
        and a zoom in either is announced on both: the second finds its window drawn.
        """
        from bokeh.events import RangesUpdate

        def zoomed(event: Any) -> None:
            name = next((n for n, p in self.panels.items() if p is panel), None)
            if name is not None:
                self._zoomed(name, event.x0, event.x1)

        for fig in panel.figures:
            fig.on_event(RangesUpdate, zoomed)

    def _zoomed(self, name: str, start: float | None, end: float | None) -> None:
        fetch = self._fetch
        if fetch is None or start is None or end is None or end <= start:
            return
        with self._lock:
            if self._windows.get(name) == (start, end):
                return
            self._windows[name] = (start, end)
            for key, line in self.panels[name].lines.items():
                if line.logged == 0:
                    continue
                expected = line.logged * min(1.0, (end - start) / max(line.span(), 1.0))
                if expected > 2 * MAX_POINTS:  # zoomed out: the downsampled curve is the view
                    line.show_window(start, end, None, None)
                else:
                    line.show_window(start, end, *fetch(name, key, start, end))
