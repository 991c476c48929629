"""A run's metric curves as one SVG picture, drawn by hand (pure: numpy and strings).

The summary kept under a finished cell shows its curves as a picture that reads without a kernel
(GitHub, nbviewer, a fresh Binder).  Drawn here rather than with matplotlib: matplotlib spent 70
ms on a one-metric picture and 160 ms on two, at the end of every run that logged - twice what
the rest of a warm re-run costs - almost all of it laying out tick labels.  In an SVG the
browser sets the text, so a picture costs 0.6 to 8 ms, and it stays sharp when zoomed.

One panel per metric (up to :data:`MAX_PANELS`, three to a row), one line per rank in its
colour and the mean dashed in black, a log y axis where the values span more than two decades,
a legend.  Each line keeps at most a few points per pixel column (min/max preserving, see
:func:`~phalanx.fit.telemetry._downsample.downsample`), so the picture's size does not grow with the run.
Non-finite values break a line, as in matplotlib.

Example::

    >>> import numpy as np
    >>> svg = curves_svg({"loss": {0: (np.arange(3.0), np.array([3.0, 2.0, 1.0]))}}, world_size=1)
    >>> svg.startswith("<svg") and "<polyline" in svg and ">loss<" in svg
    True
"""

from __future__ import annotations

import html
import math
from typing import Sequence

import numpy as np

from ..fit.telemetry import downsample
from ._format import rank_colour
from ._series import MEAN, Points

MAX_PANELS = 6   # metrics drawn; the summary's table still lists every one
PANEL_W, PANEL_H = 420, 300
# Plot area inside a panel: room on the left for y tick labels, below for x labels and title.
LEFT, RIGHT, TOP, BOTTOM = 62, 12, 26, 40
PLOT_W, PLOT_H = PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM
MAX_TICKS = 8
_HUGE = 1e300
POINTS_PER_PIXEL = 4  # M4 keeps four points a bucket: one bucket per pixel column
LEGEND_MAX_RANKS = 8  # beyond this a per-rank legend would cover the plot; the mean keeps its own
# A line with more points than one per this many pixels is drawn as its band and its trend: a
# noisy loss over 1,300 steps drawn point by point (min/max zig-zags, a dashed mean on top)
# was a black mass.  Each bucket of that width shows its points' range as a light band and
# their mean as the line, so spikes stay visible and the trend reads at any length.
PIXELS_PER_BUCKET = 3


def wants_log_scale(values: Sequence[float] | np.ndarray) -> bool:
    """Log y when every value is positive and they span more than two decades (losses often do).

    Example::

        >>> wants_log_scale([10.0, 1.0, 0.01]), wants_log_scale([0.5, 0.4]), wants_log_scale([1.0, -1.0])
        (True, False, False)
    """
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if not finite.size or finite.min() <= 0:
        return False
    # compared as decades: max / min overflows for values near the float limits
    return math.log10(finite.max()) - math.log10(finite.min()) > 2


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values covering ``[lo, hi]``: steps of 1, 2 or 5 times a power of ten.

    Example::

        >>> nice_ticks(0.0, 1.0), nice_ticks(3.0, 3.0)
        ([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], [3.0])
    """
    if not hi > lo:
        return [lo]
    raw = hi / target - lo / target  # divided first: hi - lo overflows for values near 1e308
    if not math.isfinite(raw) or raw <= 0:
        return [lo, hi]
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9)
    ticks = [round((first + i) * step, 12) for i in range(int((hi - lo) / step + 1e-9) + 2)]
    return [t for t in ticks if lo - step * 1e-6 <= t <= hi + step * 1e-6]


def tick_label(value: float) -> str:
    """A tick's text: short, no float noise (``0.30000000000000004`` reads ``0.3``).

    Example::

        >>> tick_label(0.30000000000000004), tick_label(1e-05), tick_label(2000.0)
        ('0.3', '1e-05', '2000')
    """
    return f"{value:.6g}"


def curves_svg(points: Points, world_size: int, max_panels: int = MAX_PANELS) -> str | None:
    """The metric curves ``{metric: {rank or "mean": (steps, values)}}`` (a record's
    ``curves()``) as an SVG document; ``None`` when nothing was logged."""
    if not points:
        return None
    names = list(points)[:max_panels]
    cols = min(len(names), 3)
    rows = math.ceil(len(names) / cols)
    width, height = PANEL_W * cols, PANEL_H * rows
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>']
    for i, name in enumerate(names):
        x0, y0 = PANEL_W * (i % cols), PANEL_H * (i // cols)
        parts.append(f'<g transform="translate({x0},{y0})">')
        parts.extend(_panel(name, points[name], world_size))
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _ordered(lines: dict) -> list:
    """Ranks in order, the mean last (drawn on top)."""
    return sorted(k for k in lines if k != MEAN) + ([MEAN] if MEAN in lines else [])


def _panel(name: str, lines: dict, world_size: int) -> list[str]:
    drawn = {key: _drawable(*lines[key]) for key in _ordered(lines)}
    xs = np.concatenate([xy[0] for xy in drawn.values()] or [np.zeros(0)])
    ys = np.concatenate([xy[1] for xy in drawn.values()] or [np.zeros(0)])
    finite = np.isfinite(xs) & np.isfinite(ys)
    log = wants_log_scale(ys)
    title = f"{name} (log scale)" if log else name
    out = [f'<text x="{LEFT + PLOT_W / 2:g}" y="{TOP - 9}" text-anchor="middle" '
           f'font-size="12">{html.escape(title)}</text>',
           f'<text x="{LEFT + PLOT_W / 2:g}" y="{PANEL_H - 6}" text-anchor="middle">'
           f'step</text>']
    if not finite.any():
        out.append(f'<text x="{LEFT + PLOT_W / 2:g}" y="{TOP + PLOT_H / 2:g}" text-anchor="middle">'
                   f'no finite values</text>')
        return out + [_frame()]
    # beyond +-1e300 a span (hi - lo) overflows: such values are drawn at that bound
    xs, ys = np.clip(xs[finite], -_HUGE, _HUGE), np.clip(ys[finite], -_HUGE, _HUGE)
    x_scale = _Scale(float(xs.min()), float(xs.max()), LEFT, LEFT + PLOT_W, False)
    y_scale = _Scale(float(ys.min()), float(ys.max()), TOP + PLOT_H, TOP, log)
    out += _axes(x_scale, y_scale)
    for key, (x, y) in drawn.items():
        out.extend(_line(key, x_scale.place(x), y_scale.place(y)))
    out.append(_frame())
    out.extend(_legend([k for k in drawn if k == MEAN or world_size <= LEGEND_MAX_RANKS]))
    return out


def _drawable(xs: Sequence[float], ys: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """A line's points as float arrays, at most a few per pixel column."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(x) > PLOT_W * POINTS_PER_PIXEL:
        x, y = downsample(x, y, PLOT_W * POINTS_PER_PIXEL)
    return x, y


class _Scale:
    """Data to pixels along one axis: linear, or log10 (values > 0 only)."""

    def __init__(self, lo: float, hi: float, start: float, stop: float, log: bool) -> None:
        self.log = log
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        if hi - lo < 1e-12 * max(1.0, abs(lo)):  # one value: centre it in a span around it
            pad = abs(lo) * 0.05 or 1.0
            lo, hi = lo - pad, hi + pad
        else:  # a margin so extremes do not sit on the frame
            pad = (hi - lo) * 0.04
            lo, hi = lo - pad, hi + pad
        self.lo, self.hi, self.start, self.stop = lo, hi, start, stop

    def place(self, values: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.log10(values) if self.log else values
            v = np.where(np.isfinite(v), np.clip(v, -_HUGE, _HUGE), np.nan)  # nan breaks the line
        return self.start + (v - self.lo) / (self.hi - self.lo) * (self.stop - self.start)

    def ticks(self) -> list[tuple[float, str]]:
        """(pixel, label) of each tick: decades on a log axis, round values otherwise."""
        if self.log:  # every decade, or every few when they are many
            step = max(1, math.ceil((math.floor(self.hi) - math.ceil(self.lo) + 1) / MAX_TICKS))
            decades = range(math.ceil(self.lo / step) * step, math.floor(self.hi) + 1, step)
            values = [10.0 ** d for d in decades if -323 < d < 309]  # 0 and inf have no place
            return [(float(self.place(np.array([v]))[0]), tick_label(v)) for v in values]
        return [(float(self.place(np.array([t]))[0]), tick_label(t))
                for t in nice_ticks(self.lo, self.hi)]


def _axes(x_scale: _Scale, y_scale: _Scale) -> list[str]:
    out = []
    for px, label in x_scale.ticks():
        out.append(f'<line x1="{px:.1f}" y1="{TOP}" x2="{px:.1f}" y2="{TOP + PLOT_H}" '
                   f'stroke="#000" stroke-opacity="0.1"/>'
                   f'<text x="{px:.1f}" y="{TOP + PLOT_H + 14}" text-anchor="middle">'
                   f'{label}</text>')
    for py, label in y_scale.ticks():
        out.append(f'<line x1="{LEFT}" y1="{py:.1f}" x2="{LEFT + PLOT_W}" y2="{py:.1f}" '
                   f'stroke="#000" stroke-opacity="0.1"/>'
                   f'<text x="{LEFT - 5}" y="{py + 4:.1f}" text-anchor="end">{label}</text>')
    return out


def _frame() -> str:
    return (f'<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="none" '
            f'stroke="#444"/>')


def _colour(key: int | str) -> str:
    return "black" if key == MEAN else rank_colour(int(key))


def _style(key: int | str, dense: bool = False) -> str:
    if key == MEAN:  # dashes along a line that turns every few pixels read as a solid smear
        return 'stroke="black" stroke-width="2"' + ("" if dense else ' stroke-dasharray="6 3"')
    return f'stroke="{_colour(key)}" stroke-width="1" stroke-opacity="0.8"'


def _line(key: int | str, px: np.ndarray, py: np.ndarray) -> list[str]:
    """A polyline per run of finite points; a run of one point is drawn as a dot."""
    ok = np.isfinite(px) & np.isfinite(py)
    out = []
    colour = _colour(key)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], ok.astype(np.int8), [0]])))
    for start, stop in zip(edges[::2], edges[1::2]):
        if stop - start == 1:
            out.append(f'<circle cx="{px[start]:.1f}" cy="{py[start]:.1f}" r="3" fill="{colour}"/>')
            continue
        x, y = px[start:stop], py[start:stop]
        dense = stop - start > PLOT_W / PIXELS_PER_BUCKET
        if dense:
            x, y, low, high = _buckets(x, y)
            if key != MEAN:  # the mean is an average already: its band would only blur
                band = _coords(np.concatenate([x, x[::-1]]), np.concatenate([low, high[::-1]]))
                out.append(f'<polygon fill="{colour}" fill-opacity="0.18" stroke="none" '
                           f'points="{band}"/>')
        out.append(f'<polyline fill="none" {_style(key, dense)} points="{_coords(x, y)}"/>')
    return out


def _coords(x: np.ndarray, y: np.ndarray) -> str:
    # one %-format of the whole line: three times faster than joining a string per point
    return ("%.1f,%.1f " * len(x) % tuple(np.column_stack([x, y]).ravel().tolist())).rstrip()


def _buckets(px: np.ndarray, py: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Points grouped by PIXELS_PER_BUCKET-wide pixel columns: each group's mean x, mean y,
    lowest and highest y (pixel y grows downwards: "highest" is the largest pixel value)."""
    column = np.floor((px - px.min()) / PIXELS_PER_BUCKET).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, np.diff(column) != 0])  # px only grows along a line
    counts = np.diff(np.r_[starts, len(px)])
    mean_x = np.add.reduceat(px, starts) / counts
    mean_y = np.add.reduceat(py, starts) / counts
    return mean_x, mean_y, np.minimum.reduceat(py, starts), np.maximum.reduceat(py, starts)


def _legend(keys: list[int | str]) -> list[str]:
    if not keys:
        return []
    labels = ["mean" if k == MEAN else f"rank {k}" for k in keys]
    box_w = 30 + 6.5 * max(len(label) for label in labels)
    x, y = LEFT + PLOT_W - box_w - 6, TOP + 6
    out = [f'<rect x="{x:.1f}" y="{y}" width="{box_w:.1f}" height="{14 * len(keys) + 6}" '
           f'fill="white" fill-opacity="0.8" stroke="#ccc"/>']
    for i, (key, label) in enumerate(zip(keys, labels)):
        row = y + 13 + 14 * i
        out.append(f'<line x1="{x + 5:.1f}" y1="{row - 4}" x2="{x + 23:.1f}" y2="{row - 4}" '
                   f'{_style(key)}/><text x="{x + 27:.1f}" y="{row}">{label}</text>')
    return out
