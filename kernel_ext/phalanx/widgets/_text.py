"""Plain-text progress: for terminals and ``--no-widget``.

One line, rewritten in place (``\\r``) at most once a second from the tracker's publisher thread,
and ended with a newline when the run is over, so a log or a saved notebook keeps one final line.

Example::

    text = TextProgress("run-1")
    unsubscribe = session.events.subscribe(text.handle)
    ...
    text.finish(record)
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Mapping, TextIO

from .._cell_line import draw
from ._format import progress_line
from ._throttle import Throttle

PRINT_INTERVAL_S = 1.0


class TextProgress:
    """A throttled single progress line of one run."""

    def __init__(self, run_id: str, name: str, stream: TextIO | None = None,
                 interval_s: float = PRINT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_id, self.name = run_id, name
        self._stream = stream
        self._throttle = Throttle(interval_s, clock)
        self._clock, self._started = clock, clock()
        self._ranks: list[Mapping[str, Any]] = []
        self._width = 0
        self._lock = threading.Lock()
        self.lines = 0

    def handle(self, event: Mapping[str, Any]) -> None:
        """Bus subscriber: keep the latest progress, print it when the throttle allows."""
        if event.get("run") != self.run_id or event.get("type") != "progress":
            return
        with self._lock:
            self._ranks = list(event["ranks"])
            # A rank in its debugger owns the cell's lines (its answers, the prompt) until it
            # goes on: no redraw between them.  The tracker says so before the debugger speaks.
            if any(r.get("paused") for r in self._ranks):
                return
            if self._throttle.ready():
                self._write(progress_line(self.name, self._ranks, self._clock() - self._started))

    def finish(self, record: Any = None) -> None:
        """Rewrite the line with the final state and end it."""
        with self._lock:
            if record is not None:
                ranks = [{**p, "step": record.steps.get(p["rank"], p["step"])} for p in self._ranks] \
                    or [{"rank": r, "step": s} for r, s in sorted(record.steps.items())]
                line = progress_line(self.name, ranks, record.wall_s, record.status)
            else:
                line = progress_line(self.name, self._ranks, self._clock() - self._started, "stopped")
            self._write(line, end="\n")

    def _write(self, line: str, end: str = "") -> None:
        stream = self._stream or sys.stdout  # looked up late: the kernel swaps sys.stdout per cell
        padding = " " * max(self._width - len(line), 0)  # cover the tail of a longer previous line
        self._width = len(line)
        draw(stream, "\r" + line + padding + end, ended=bool(end))
        self.lines += 1
