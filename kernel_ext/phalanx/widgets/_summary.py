"""The static result of a run, kept in the cell: it reads the same without a kernel.

:class:`RunSummary` wraps a :class:`~phalanx.fit.RunRecord`: its HTML is the record's table
(status, wall time, steps and final metrics per rank) followed by the metric curves as an SVG
picture embedded in the HTML (a base64 ``data:`` image, see :mod:`._svg_curves`), so GitHub,
nbviewer or a fresh Binder show the result of a saved notebook where no widget can be drawn.
Plain text falls back to the record's own ``repr``.

A run that trained nothing (no step counted, no metric logged: a validation pass) is one line.
A run whose ``--steps`` did not match the steps its loop took says so here, once.

In a live frontend the run's live view draws the same curves above it: the picture carries a
class per run (:func:`summary_curves_class`) that the view hides with a style of its own, so
the picture shows exactly where the view cannot be drawn (see ``RunView``).

Example::

    summary = RunSummary(session.last_run())
    display(summary, metadata=summary.metadata)
"""

from __future__ import annotations

import base64
import html
import logging
import re
from typing import Any

from ._format import DOT, fmt_wall, total_note
from ._svg_curves import curves_svg

log = logging.getLogger("phalanx")


def summary_curves_class(run_id: str) -> str:
    """The CSS class of a run's summary picture (what its live view hides).

    Example::

        >>> summary_curves_class("ab12-3")
        'phalanx-curves-ab12-3'
    """
    return "phalanx-curves-" + re.sub(r"[^A-Za-z0-9_-]", "_", run_id)


class RunSummary:
    """A finished run as a static display: table and embedded SVG curves; text elsewhere."""

    def __init__(self, record: Any) -> None:
        self.record = record
        self._svg: str | None = None
        self._drawn = False

    @property
    def metadata(self) -> dict:
        """Display metadata: the run's manifest travels with the output (``{"phalanx": ...}``)."""
        return {"phalanx": {"manifest": self.record.manifest}}

    def svg(self) -> str | None:
        """The curves as an SVG document (drawn once); ``None`` when nothing was logged or
        the picture could not be drawn (the table still shows every final value)."""
        if not self._drawn:
            self._drawn = True
            try:
                self._svg = curves_svg(self.record.curves(), self.record.world_size)
            except Exception:  # a picture is not worth losing the run's summary over
                log.warning("phalanx: the metric curves of %s could not be drawn",
                            self.record.name, exc_info=True)
        return self._svg

    def trained_nothing(self) -> bool:
        """No rank counted a step and nothing was logged: a cell that only ran code."""
        return not any(self.record.steps.values()) and len(self.record.history) == 0

    def _mismatch(self) -> str:
        return total_note(getattr(self.record, "total_steps", None), self.record.steps,
                          self.record.status)

    def notes(self) -> list[str]:
        """What the table does not say: the metric rows, a ``--steps`` that did not match."""
        rows = len(self.record.history)
        return [f"{rows} metric rows"] * bool(rows) + [self._mismatch()] * bool(self._mismatch())

    def _one_line(self) -> str:
        r = self.record
        return (f"{r.name}: {r.status} in {fmt_wall(r.wall_s)} on {r.world_size} rank(s){DOT}"
                "no steps counted, no metrics logged")

    def bundle(self) -> dict[str, str]:
        """What IPython's display makes of it (its text and its HTML), built directly."""
        return {"text/plain": repr(self), "text/html": self._repr_html_()}

    def __repr__(self) -> str:
        if self.trained_nothing():
            return self._one_line()
        mismatch = self._mismatch()
        return repr(self.record) + (f"\n  {mismatch}" if mismatch else "")

    def _repr_html_(self) -> str:
        record = self.record
        if self.trained_nothing():
            return f'<div class="phalanx-run-summary">{html.escape(self._one_line())}</div>'
        svg = self.svg()
        # an image rather than inline SVG: its styles and ids cannot clash with the page's, and
        # sanitizers treat it as they treat a data: PNG (JupyterLab's leaves an img's src alone)
        image = "" if svg is None else (
            f'<img class="{summary_curves_class(record.run_id)}" '
            f'alt="metric curves of {html.escape(record.name)}" style="max-width:100%" '
            f'src="data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode("ascii")}"/>')
        notes = self.notes()
        said = f"<div><small>{html.escape(DOT.join(notes))}</small></div>" if notes else ""
        return f'<div class="phalanx-run-summary">{record._repr_html_()}{said}{image}</div>'
