"""The static result of a run, kept in the cell: it reads the same without a kernel.

:class:`RunSummary` wraps a :class:`~phalanx.fit.RunRecord`: its HTML is the record's table
(status, wall time, steps and final metrics per rank) followed by the metric curves as an SVG
picture embedded in the HTML (a base64 ``data:`` image, see :mod:`._svg_curves`), so GitHub,
nbviewer or a fresh Binder show the result of a saved notebook where no widget can be drawn.
Plain text falls back to the record's own ``repr``.

Example::

    summary = RunSummary(session.last_run())
    display(summary, metadata=summary.metadata)
"""

from __future__ import annotations

import base64
import html
import logging
from typing import Any

from ._svg_curves import curves_svg

log = logging.getLogger("phalanx")


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

    def __repr__(self) -> str:
        return repr(self.record)

    def _repr_html_(self) -> str:
        svg = self.svg()
        # an image rather than inline SVG: its styles and ids cannot clash with the page's, and
        # sanitizers treat it as they treat a data: PNG (JupyterLab's leaves an img's src alone)
        image = "" if svg is None else (
            f'<img alt="metric curves of {html.escape(self.record.name)}" style="max-width:100%" '
            f'src="data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode("ascii")}"/>')
        rows = f"<div><small>{len(self.record.history)} metric rows</small></div>"
        return f'<div class="phalanx-run-summary">{self.record._repr_html_()}{rows}{image}</div>'
