"""The cell's one unfinished line, and everything else the kernel writes under a cell.

Text progress (``--no-widget``, terminals) redraws a single line in place with ``\\r`` and
leaves it open.  Text written after it without a newline first would join it: a rank's
output or the debugger's answer would read ``... 2.0 steps/s5``.  So the progress line is
drawn with :func:`draw`, and the kernel's other writes during a run go through :func:`say`
(or ``with writing():``), which ends an open progress line first.  One lock orders them, so a
redraw from the publisher thread cannot slip between ending the line and the text.

Example::

    draw(sys.stdout, "\\rrun-1 running 3 s · 2 rank(s)", ended=False)
    say("[rank 0] epoch 1")      # starts on a line of its own
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Iterator, TextIO

_LOCK = threading.RLock()
_open: TextIO | None = None  # the stream whose last line is a progress line not yet ended


def draw(stream: TextIO, text: str, ended: bool) -> None:
    """Write the progress line's ``text``; ``ended``: it finished with a newline."""
    global _open
    with _LOCK:
        stream.write(text)
        stream.flush()
        _open = None if ended else stream


@contextmanager
def writing() -> Iterator[None]:
    """Hold the cell's line for other text: an open progress line is ended first."""
    global _open
    with _LOCK:
        if _open is not None:
            stream, _open = _open, None
            try:
                stream.write("\n")
                stream.flush()
            except ValueError:  # closed since (a terminal gone): nothing to end
                pass
        yield


def say(text: str, file: TextIO | None = None) -> None:
    """``print(text)`` on a line of its own (stdout unless ``file``)."""
    with writing():
        print(text, file=file or sys.stdout, flush=True)
