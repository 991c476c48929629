"""Where this rank is right now: its main thread's Python stack, read from another thread.

``%cluster stacks`` must answer while a run is hung, so it cannot queue behind the run on the
engine's shell channel: it is a control request (see :mod:`phalanx.runtime.run._control_channel`), answered with
:func:`rank_stack` from ``sys._current_frames()``.  The run is not stopped or slowed: reading
the frames takes the GIL for a moment.

A rank waiting in a collective is found on its stack: phalanx's transports wait in a Python loop
whose deadline (a ``Backoff``) and name (``what``) are the loop's locals, so the stack says
which collective and for how long.

Example::

    install_stacks_handler()   # on the engine, once per process (each run makes sure)
    rank_stack()               # {"pid": 4242, "in_run": True, "frames": [...], "waiting": {...}}
"""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
import threading
import time
import traceback
from types import FrameType
from typing import Any

from ..run._control_channel import answer_on_control
from ...wire._seam import CELL_FILENAME
from ..run._engine_state import engine_state

from ...wire._control_requests import STACKS_REQUEST  # noqa: E402
_RUNTIME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # phalanx/runtime
_TRANSPORT = os.path.join(_RUNTIME, "transport") + os.sep
_PACKAGE = os.path.dirname(_RUNTIME) + os.sep
_LIBRARIES = tuple({_PACKAGE, *(p + os.sep for p in (sysconfig.get_paths()[k]
                                                     for k in ("stdlib", "purelib", "platlib")))})


def install_stacks_handler() -> bool:
    """Let the engine's control thread answer ``%cluster stacks`` (False where the process is
    not an ipyparallel engine)."""
    return answer_on_control(STACKS_REQUEST, lambda content: rank_stack())


def rank_stack() -> dict[str, Any]:
    """This process's main thread: its frames from the cell on (or the innermost few), the
    collective it waits in, and the run's progress.  Plain data (it travels as JSON)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    run = engine_state().run
    info: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname(),
                            "in_run": run is not None,
                            "step": run.progress if run is not None else None,
                            "frames": [], "waiting": None}
    if frame is None:
        return info
    summary = traceback.extract_stack(frame)
    cell = [i for i, f in enumerate(summary) if f.filename == CELL_FILENAME]
    shown = summary[cell[0]:] if cell else summary[-8:]
    info["frames"] = [[f.filename, f.lineno, f.name, (f.line or "").strip(),
                       _is_library(f.filename)] for f in shown]
    info["waiting"] = _collective_wait(frame)
    return info


def _is_library(filename: str) -> bool:
    """Whether a frame is in phalanx, an installed package or the standard library (not code
    the person wrote in the notebook)."""
    return filename.startswith(_LIBRARIES)


def _collective_wait(frame: FrameType | None) -> dict[str, Any] | None:
    """The collective a transport's wait loop is in (innermost first), and for how long."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(_TRANSPORT):
            local = frame.f_locals
            backoff, what = local.get("backoff"), local.get("what")
            if backoff is not None and isinstance(what, str):
                return {"what": what, "waited_s": round(time.perf_counter() - backoff.start, 2),
                        "deadline_in_s": round(backoff.deadline - time.monotonic(), 2)}
        frame = frame.f_back
    return None


def stack_when_idle() -> dict[str, Any]:
    """:func:`rank_stack` asked as an ordinary call (the engine is idle), making sure the
    control thread can answer the next time, when it may be busy."""
    install_stacks_handler()
    return rank_stack()
