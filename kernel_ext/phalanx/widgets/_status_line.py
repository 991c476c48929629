"""One light line under a cell, shown at once, that later gives its place to the real output.

A ``%%distributed_fit`` or ``%cluster start`` cell can be silent for seconds while names are
packed, engines start or the first widgets are built.  :class:`StatusLine` is the first thing
the cell shows: a plain HTML output with a display id, sent before anything heavy is imported
(this module imports nothing but IPython's display), then rewritten in place as the work goes
on and finally replaced by what the cell really shows (the live view, the run's summary, the
engine table).  Replacing, not adding: a saved notebook keeps only the last thing the slot
held, so a finished run's file holds its static summary, not a widget that no reopened page
can draw.

Updates may come from any thread that runs inside the cell's context (IPython addresses
display messages by the context's parent message): :meth:`StatusLine.follow` starts such a
thread for work that gives no callbacks, re-reading a description twice a second.

Example::

    line = StatusLine.show("starting: packing the notebook's names…")
    line.say("waiting for rank 1")
    line.replace_with(summary, metadata=summary.metadata)
"""

from __future__ import annotations

import contextvars
import html
import threading
import time
from typing import Any, Callable

from ._pending_flush import flushing_pending_only

STYLE = "color:var(--jp-ui-font-color2,#666);font-size:0.9em"
FOLLOW_INTERVAL_S = 0.5


def _line_bundle(text: str) -> dict:
    return {"text/html": f'<div class="phalanx-status" style="{STYLE}">{html.escape(text)}</div>',
            "text/plain": text}


class StatusLine:
    """A display slot under the cell: a line of text, then whatever replaces it."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._lock = threading.Lock()
        self.text: str | None = None
        self.replaced = False
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None

    @classmethod
    def show(cls, text: str) -> "StatusLine":
        """Display ``text`` under the running cell now; the line to update later."""
        from IPython.display import display

        with flushing_pending_only():
            line = cls(display(_line_bundle(text), raw=True, display_id=True))
        line.text = text
        return line

    def say(self, text: str) -> None:
        """Rewrite the line (nothing is sent when the text is the same, or once replaced)."""
        with self._lock:
            if self.replaced or text == self.text:
                return
            self.text = text
            with flushing_pending_only():
                self._handle.update(_line_bundle(text), raw=True)

    def replace_with(self, obj: Any, metadata: dict | None = None, raw: bool = False) -> None:
        """Put ``obj`` (a widget, a summary, a table: anything IPython displays; with ``raw``,
        a mime bundle) in the line's place; later calls replace it again.  Stops :meth:`follow`."""
        self.stop_following()
        with self._lock:
            self.replaced = True
            with flushing_pending_only():
                self._handle.update(obj, metadata=metadata or None, raw=raw)

    def clear(self) -> None:
        """Leave the slot empty (the work said what it had to say elsewhere, e.g. an error)."""
        self.stop_following()
        with self._lock:
            self.replaced = True
            with flushing_pending_only():
                self._handle.update({"text/plain": ""}, raw=True)

    def follow(self, describe: Callable[[float], str | None],
               interval_s: float = FOLLOW_INTERVAL_S) -> None:
        """Say ``describe(seconds since now)`` every ``interval_s`` until replaced (None: keep
        the line as it is).  The thread runs in a copy of the caller's context, so its updates
        are addressed to the caller's cell."""
        begun = time.monotonic()

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    text = describe(time.monotonic() - begun)
                except Exception:  # the line is a courtesy: what it reads may be half-built
                    continue
                if text is not None:
                    self.say(text)

        context = contextvars.copy_context()
        self._follower = threading.Thread(target=context.run, args=(loop,), daemon=True,
                                          name="phalanx-status-line")
        self._follower.start()

    def stop_following(self) -> None:
        """End :meth:`follow`'s thread (it sends nothing after this returns)."""
        self._stop.set()
        follower, self._follower = self._follower, None
        if follower is not None and follower is not threading.current_thread():
            follower.join()
