"""Warnings about a person's cell, shown at that cell rather than inside phalanx.

Python places a warning at a frame picked by ``stacklevel``, counted from the call.  Counted by
hand from phalanx's own modules it lands on ``_magics.py`` or ``_run.py`` as soon as a call is
added in between, and the notebook shows a file the person never wrote.  :func:`warn_at_cell`
finds the frame of the notebook cell that ran the magic (a file IPython compiled for a cell)
and warns there, so the warning reads as one about that cell, like any warning of their code.

Example::

    warn_at_cell("--checkpoint-every committed nothing", CheckpointWarning)
"""

from __future__ import annotations

import sys
import types
import warnings


def _cell_files() -> dict:
    """The file names IPython gave the cells it compiled (none outside IPython)."""
    from IPython.core.getipython import get_ipython

    shell = get_ipython()
    return getattr(getattr(shell, "compile", None), "_filename_map", None) or {}


def cell_stacklevel(fallback: int = 2) -> int:
    """``stacklevel`` for a ``warnings.warn`` made by this function's caller that points at the
    innermost notebook cell on the stack; ``fallback`` where none is."""
    cells = _cell_files()
    frame: types.FrameType | None = sys._getframe(1)
    level = 1  # the caller's own warn() line
    while frame is not None:
        if frame.f_code.co_filename in cells:
            return level
        frame, level = frame.f_back, level + 1
    return fallback


def warn_at_cell(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)``, shown at the notebook cell running now."""
    warnings.warn(message, category, stacklevel=cell_stacklevel(fallback=3))
