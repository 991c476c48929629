"""The static result of a run, kept in the cell: it reads the same without a kernel.

:class:`RunSummary` wraps a :class:`~phalanx.fit.RunRecord`: its HTML is the record's table
(status, wall time, steps and final metrics per rank) followed by the metric curves as a PNG
embedded in the HTML (base64), so GitHub, nbviewer or a fresh Binder show the result of a saved
notebook where no widget can be drawn.  Plain text falls back to the record's own ``repr``.

Example::

    summary = RunSummary(session.last_run())
    display(summary, metadata=summary.metadata)
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any, Sequence

from ._format import rank_colour
from ._series import MEAN, Points

MAX_PANELS = 6            # metrics drawn; the table still lists every one
MAX_POINTS_PER_LINE = 4000  # a PNG a few hundred pixels wide cannot show more


def wants_log_scale(values: Sequence[float]) -> bool:
    """Log y when every value is positive and they span more than two decades (losses often do).

    Example::

        >>> wants_log_scale([10.0, 1.0, 0.01]), wants_log_scale([0.5, 0.4]), wants_log_scale([1.0, -1.0])
        (True, False, False)
    """
    finite = [v for v in values if math.isfinite(v)]
    if not finite or min(finite) <= 0:
        return False
    return max(finite) / min(finite) > 100


def thin(xs: Sequence[float], ys: Sequence[float], limit: int = MAX_POINTS_PER_LINE) -> tuple[list, list]:
    """At most about ``limit`` evenly spaced points, the last one always kept.

    Example::

        >>> thin(list(range(10)), list(range(10)), limit=4)
        ([0, 3, 6, 9], [0, 3, 6, 9])
    """
    if len(xs) <= limit:
        return list(xs), list(ys)
    stride = math.ceil(len(xs) / limit)
    keep = list(range(0, len(xs), stride))
    if keep[-1] != len(xs) - 1:
        keep.append(len(xs) - 1)
    return [xs[i] for i in keep], [ys[i] for i in keep]


def curves_png(points: Points, world_size: int, max_panels: int = MAX_PANELS) -> bytes | None:
    """The metric curves ``{metric: {rank or "mean": (steps, values)}}`` (a record's
    ``curves()``: downsampled, so the image costs the same for any run length) as PNG bytes.

    ``None`` when nothing was logged.  Uses matplotlib's Agg canvas directly: no pyplot, so no
    global figure state and no interactive backend is touched.
    """
    if not points:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(points)[:max_panels]
    cols = min(len(names), 3)
    rows = math.ceil(len(names) / cols)
    width, height = 4.2 * cols, 3.0 * rows
    fig = Figure(figsize=(width, height), dpi=100)
    # Fixed margins, in inches, for tick labels, titles and axis labels: matplotlib's layout
    # engines cost 0.1 to 0.4 s more per image, paid at the end of every run that logged.
    fig.subplots_adjust(left=0.7 / width, right=1 - 0.15 / width, bottom=0.5 / height,
                        top=1 - 0.3 / height, wspace=0.85 / (4.2 - 0.85), hspace=0.8 / (3.0 - 0.8))
    for i, name in enumerate(names):
        _draw_panel(fig.add_subplot(rows, cols, i + 1), name, points[name], world_size)
    buffer = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buffer)
    return buffer.getvalue()


def _draw_panel(ax: Any, name: str, lines: dict, world_size: int) -> None:
    values: list[float] = []
    for key in sorted(k for k in lines if k != MEAN) + ([MEAN] if MEAN in lines else []):
        xs, ys = thin(*lines[key])
        values.extend(ys)
        marker = "o" if len(xs) == 1 else None  # a single point has no line to draw
        if key == MEAN:
            ax.plot(xs, ys, color="black", linewidth=2, linestyle="--", marker=marker, label="mean")
        else:
            ax.plot(xs, ys, color=rank_colour(int(key)), linewidth=1, alpha=0.8, marker=marker,
                    label=f"rank {key}" if world_size <= 8 else None)
    log_scale = wants_log_scale(values)
    if log_scale:
        ax.set_yscale("log")
        ax.minorticks_off()  # a log axis's minor ticks cost more to lay out than the rest
    # A title at a fixed height: placed automatically, matplotlib lays out the x axis's ticks
    # twice more to find room for it, half the image's cost.
    ax.set_title(f"{name} (log scale)" if log_scale else name, y=1.0, pad=4)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")  # "best" searches every point for a free corner


class RunSummary:
    """A finished run as a static display: table and embedded PNG curves; text elsewhere."""

    def __init__(self, record: Any) -> None:
        self.record = record
        self._png: bytes | None = None
        self._drawn = False

    @property
    def metadata(self) -> dict:
        """Display metadata: the run's manifest travels with the output (``{"phalanx": ...}``)."""
        return {"phalanx": {"manifest": self.record.manifest}}

    def png(self) -> bytes | None:
        """The curves as PNG bytes (drawn once)."""
        if not self._drawn:
            self._png = curves_png(self.record.curves(), self.record.world_size)
            self._drawn = True
        return self._png

    def __repr__(self) -> str:
        return repr(self.record)

    def _repr_html_(self) -> str:
        png = self.png()
        image = "" if png is None else (
            f'<img alt="metric curves of {html.escape(self.record.name)}" style="max-width:100%" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}"/>')
        rows = f"<div><small>{len(self.record.history)} metric rows</small></div>"
        return f'<div class="phalanx-run-summary">{self.record._repr_html_()}{rows}{image}</div>'
