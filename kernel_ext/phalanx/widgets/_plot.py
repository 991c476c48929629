"""The live metric plot: bokeh figures in a jupyter_bokeh ``BokehModel``, fed by streaming.

One tab per logged metric (found as rows arrive), each with a linear and a log-scale tab; every
tab shows one line per rank plus the mean.  Points are appended with
``ColumnDataSource.stream``: each update sends only the new points, never the whole plot.

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
from typing import Any, Hashable

import numpy as np

from ._format import rank_colour
from ._series import MEAN, Points

LEGEND_MAX_RANKS = 8   # beyond this a per-rank legend hides the plot; the mean keeps its entry
CHUNK_POINTS = 50_000  # points per data source before a line continues in a new one
MARKERS_UP_TO = 50     # points on a line before its markers are hidden
_HEIGHT = 280


class Line:
    """One curve (a rank's or the mean) drawn in several figures, stored in chunks.

    bokeh ``np.append``s an array column on every ``stream``: a copy of the whole column.  Past a
    few 100k points that copy cost the kernel more than the training it watched, so a line keeps
    at most :data:`CHUNK_POINTS` per source and continues in a new source (seeded with the last
    point so the curve stays connected).

    A line of one point draws nothing, so points also get markers while the line is short (a
    metric logged once an epoch); past :data:`MARKERS_UP_TO` points they are hidden.

    Renderers are built by hand rather than with ``figure.line``: that also makes selection and
    muted glyph models for each, which the browser derives by itself, and every model costs
    kernel CPU to build and to send.
    """

    def __init__(self, figures: list, colour: str, width: float = 1.5, alpha: float = 0.8,
                 dash: str = "solid", chunk_points: int | None = None) -> None:
        self.chunks: list[Any] = []
        self.markers: list[Any] = []
        self.renderers: list[list[Any]] = [[] for _ in figures]  # per figure, for its legend
        self.legend_items: list[Any] = []                           # set by the panel
        self._figures = figures
        self._style = {"line_color": colour, "line_width": width, "line_alpha": alpha,
                       "line_dash": dash}
        self._chunk = chunk_points or CHUNK_POINTS
        self._new_chunk()

    def append(self, xs: np.ndarray, ys: np.ndarray) -> None:
        """Stream the points ``(xs, ys)`` onto the end of the line."""
        start = 0
        while start < len(xs):
            room = self._chunk - len(self.chunks[-1].data["x"])
            if room <= 0:
                self._new_chunk()
                continue
            # Arrays travel as one binary buffer; a list is encoded number by number (~3 us each).
            self.chunks[-1].stream({"x": xs[start:start + room], "y": ys[start:start + room]})
            start += room
        if self.markers and self.markers[0].visible and len(self) > MARKERS_UP_TO:
            self._hide_markers()

    def _hide_markers(self) -> None:
        for marker in self.markers:
            marker.visible = False
        # Out of the legend too: its "hide" click flips every renderer of an item (it would show
        # them again) and it greys an item out while any of them is hidden.
        for item in self.legend_items:
            item.renderers = [r for r in item.renderers if r not in self.markers]

    def __len__(self) -> int:
        """Points on the line (the seed point of each continuation chunk not counted twice)."""
        return sum(len(c.data["x"]) for c in self.chunks) - (len(self.chunks) - 1)

    def values(self) -> list[float]:
        """Every y value on the line, in order."""
        out: list[float] = []
        for i, chunk in enumerate(self.chunks):
            out.extend(float(v) for v in list(chunk.data["y"])[1 if i else 0:])
        return out

    def _new_chunk(self) -> None:
        from bokeh.models import ColumnDataSource, GlyphRenderer, Scatter
        from bokeh.models import Line as LineGlyph

        if self.chunks:
            last = self.chunks[-1].data
            seed = {"x": np.asarray(last["x"][-1:], dtype=float),
                    "y": np.asarray(last["y"][-1:], dtype=float)}
        else:
            seed = {"x": np.zeros(0), "y": np.zeros(0)}
        source = ColumnDataSource(data=seed)
        for i, fig in enumerate(self._figures):
            added = [GlyphRenderer(data_source=source, glyph=LineGlyph(x="x", y="y", **self._style))]
            if not self.chunks:  # markers on the first chunk only: a longer line needs none
                colour, alpha = self._style["line_color"], self._style["line_alpha"]
                added.append(GlyphRenderer(data_source=source, glyph=Scatter(
                    x="x", y="y", size=5, fill_color=colour, line_color=colour, fill_alpha=alpha)))
                self.markers.append(added[-1])
            fig.renderers = [*fig.renderers, *added]
            self.renderers[i].extend(added)
            if self.legend_items:  # a continuation: the legend hides it with the rest
                self.legend_items[i].renderers = [*self.legend_items[i].renderers, *added]
        self.chunks.append(source)


class MetricPanel:
    """One metric's tab content: a linear and a log-scale figure, a line per rank and the mean."""

    def __init__(self, world_size: int, name: str = "") -> None:
        from bokeh.models import Legend, LegendItem, TabPanel, Tabs

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

    def rename(self, name: str) -> None:
        """Label a panel built ahead with the metric it now shows (a few small changes)."""
        from bokeh.models import HoverTool

        for fig in self.figures:
            fig.yaxis.axis_label = name
            for tool in fig.select(type=HoverTool):
                tool.tooltips = [("step", "@x"), (name, "@y")]


def _figure(name: str, scale: str, x_range: Any = None) -> Any:
    from bokeh.models import HoverTool
    from bokeh.plotting import figure

    extra = {} if x_range is None else {"x_range": x_range}
    fig = figure(height=_HEIGHT, sizing_mode="stretch_width", y_axis_type=scale,
                 x_axis_label="step", y_axis_label=name, toolbar_location="above",
                 tools="pan,wheel_zoom,box_zoom,reset,save", **extra)
    fig.add_tools(HoverTool(tooltips=[("step", "@x"), (name, "@y")]))
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
        from bokeh.models import Div, TabPanel, Tabs

        from ._bokeh import BatchedBokehModel

        self.world_size = world_size
        self.lines: dict[tuple[str, Hashable], Line] = {}
        self.metrics: list[str] = []  # in tab order
        self._lock = threading.RLock()
        self._first: MetricPanel | None = MetricPanel(world_size)
        self.tabs = Tabs(tabs=[TabPanel(child=self._first.scales, title="")], visible=False,
                         sizing_mode="stretch_width")
        self._waiting = Div(text="<i>waiting for the first <code>log()</code> call…</i>")
        self.root = column(self._waiting, self.tabs, sizing_mode="stretch_width")
        self.model = BatchedBokehModel(self.root)

    def extend(self, points: Points) -> None:
        """Append new points (from :class:`~phalanx.widgets._series.SeriesBuilder`)."""
        with self._lock:
            new = [name for name in points if (name, MEAN) not in self.lines]
            if new:
                with self.model.batched(everything=True):  # sent before any point streams in
                    for name in new:
                        self._add_metric(name)
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
        """Send the whole document again (once, at the end of a run).

        jupyter_bokeh delivers updates only to views that exist when they are sent; a view drawn
        later (a reloaded page) or one that missed early updates starts from the document sent
        here.  This re-renders the plot, so it is done once, not per update.
        """
        with self._lock:
            self.model.update_from_model(self.root)

    def _add_metric(self, name: str) -> None:
        from bokeh.models import TabPanel

        if self._first is not None:
            panel, self._first = self._first, None
            panel.rename(name)
            self.tabs.tabs[0].title = name
            self.tabs.visible, self._waiting.visible = True, False
        else:
            panel = MetricPanel(self.world_size, name)
            self.tabs.tabs = [*self.tabs.tabs, TabPanel(child=panel.scales, title=name)]
        for key, line in panel.lines.items():
            self.lines[(name, key)] = line
        self.metrics.append(name)
