"""Display without waiting on the kernel's IO thread when no text waits to be sent.

ipykernel flushes stdout and stderr before every display message, so that text printed before
a display is shown before it.  Each flush hands the stream to the kernel's IO thread and waits
for it: two waits per display, whether or not anything was printed (120 us of CPU each on an
idle 2-core machine; a warm re-run's first line took 1.06 ms with them, 0.25 ms without, and its
summary is a second such display).  A stream that holds no unsent text has nothing to
order, so inside :func:`flushing_pending_only` only a stream with text waiting is flushed.

Text written before the display on this thread is waiting (ipykernel marks it as it is
written), so it is flushed and stays before the display.  What is not ordered is text whose
own flush the IO thread has begun but not yet queued, a window of microseconds once every 0.2 s
at most: such text, written by another thread, could follow the display.

Example::

    with flushing_pending_only():
        handle = display(bundle, raw=True, display_id=True)
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Iterator

_lock = threading.Lock()
_inside = 0  # callers inside the block (threads may overlap): the last one out restores


def _flush_pending_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        # not ipykernel's stream (a capture, a terminal): flushed as before
        if getattr(stream, "_flush_pending", True) or getattr(stream, "_subprocess_flush_pending", False):
            stream.flush()


@contextlib.contextmanager
def flushing_pending_only(shell: Any = None) -> Iterator[None]:
    """Within the block, the shell's displays flush only the streams holding unsent text."""
    global _inside
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    publisher = getattr(shell, "display_pub", None)
    if publisher is None or not hasattr(publisher, "_flush_streams"):
        yield  # not ipykernel's publisher: nothing to change
        return
    with _lock:
        if _inside == 0:
            publisher._flush_streams = _flush_pending_streams  # the instance's, over the method
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                vars(publisher).pop("_flush_streams", None)
