"""``breakpoint()`` in a run: the rank pauses in Python's debugger, typed from the notebook.

The run's ledger makes ``sys.breakpointhook`` this module's for the run (undone at its end,
however it ends).  A rank that reaches ``breakpoint()`` (or ``phalanx.breakpoint(rank=R)`` on
rank R) stops in a :class:`PausedDebugger` on its main thread and announces the pause on
ipyparallel's data channel (``publish_data``: the kernel's wait loop sees it in the task's
data).  The kernel then holds the other ranks' collective deadlines and sends the person's
lines as control requests, which the engine's control thread hands to the paused debugger and
answers with what it printed (see :mod:`phalanx.runtime.run._control_channel`).

``c`` continues the run untraced (so it ends as it would have); ``q`` raises ``BdbQuit`` in the
cell, which ends the run on every rank as one failure the kernel reports as a quit.

Example (in a ``%%distributed_fit`` cell)::

    for step in range(100):
        ...
        if rank == 1 and step == 5:
            breakpoint()            # or phalanx.breakpoint(rank=1)
"""

from __future__ import annotations

import io
import linecache
import pdb
import queue
import sys
from types import FrameType
from typing import Any

from ..run._control_channel import answer_on_control
from ..run._engine_state import RunContext, current_run, engine_state
from ..transport._comm_util import DEADLINES

from ...wire._control_requests import DEBUG_REQUEST, HOLD_REQUEST, PAUSE_KEY  # noqa: E402
QUIT_ERROR = "BdbQuit"
# Stepping never stops in the machinery around the cell (the person's code is ``__main__``)
_SKIP = ["phalanx.*", "ipyparallel.*", "ipykernel.*", "IPython.*", "tornado.*", "zmq.*",
         "asyncio.*", "threading", "contextlib"]
_ANSWER_POLL_S = 0.5


class PausedDebugger(pdb.Pdb):
    """pdb on a rank's main thread; its lines come from, and its output goes to, the control
    thread (one answer per prompt, or a last one when the debugger lets the run go on)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._lines: queue.Queue[str] = queue.Queue()
        self._answers: queue.Queue[tuple[str, bool]] = queue.Queue()
        self._out = io.StringIO()
        self.pauses = 0          # stops announced to the kernel (breakpoint() calls, `b` stops)
        self.attached = False    # the kernel is talking to this stop
        self.called_at = 0       # the line of the breakpoint() call being stopped for
        super().__init__(stdin=self, stdout=self, skip=_SKIP, readrc=False, nosigint=True)  # type: ignore[arg-type]
        self.prompt = "(Pdb) "

    # --- pdb's stdin and stdout -------------------------------------------------------------

    def write(self, text: str) -> int:
        return self._out.write(text)

    def flush(self) -> None:
        return None

    def readline(self) -> str:
        """pdb wants the next command: what it printed is the answer to the last one."""
        self._answer(done=False)
        return self._lines.get() + "\n"

    def _answer(self, done: bool) -> None:
        text, self._out = self._out.getvalue(), io.StringIO()
        if text.endswith(self.prompt):
            text = text[:-len(self.prompt)]
        self._answers.put((text, done))

    # --- stops ------------------------------------------------------------------------------

    def interaction(self, frame: FrameType | None, tb: Any) -> None:
        if not self.attached:
            self.attached = True  # before the kernel hears of it: its first request may be quick
            if not self._announce(frame):
                self.attached = False
                self.set_continue()
                return
        super().interaction(frame, tb)
        if self.quitting or self.stoplineno == -1:  # q, or c: the kernel's session ends here
            self.attached = False
            self._answer(done=True)

    def _announce(self, frame: FrameType | None) -> bool:
        """Tell the kernel this rank stopped, where (the task's data, read by its wait loop)."""
        run = engine_state().run
        # where the cell called breakpoint() (pdb stops at the line after it), else the stop
        line, self.called_at = self.called_at or (frame.f_lineno if frame is not None else 0), 0
        filename = frame.f_code.co_filename if frame is not None else ""
        self.pauses += 1
        pause = {"seq": self.pauses, "line": line, "file": filename,
                 "source": linecache.getline(filename, line).strip(),
                 "step": run.progress if run is not None else 0}
        try:
            from ipyparallel.datapub import publish_data

            publish_data({PAUSE_KEY: pause})
            return True
        except Exception as exc:  # not an ipyparallel engine: nobody could type here
            print(f"phalanx: breakpoint() on rank {self.rank} skipped: the kernel cannot be "
                  f"told ({type(exc).__name__}: {exc})", file=sys.stderr)
            return False

    def take_line(self, line: str | None) -> tuple[str, bool]:
        """The control thread's side: hand over ``line`` (None: only the stop's first output)
        and wait for the answer."""
        if line is not None:
            self._lines.put(line)
        while True:
            try:
                return self._answers.get(timeout=_ANSWER_POLL_S)
            except queue.Empty:
                if not self.attached and engine_state().run is None:  # the run ended meanwhile
                    return "", True

    def close(self) -> None:
        """The run is over: stop tracing, and end a session the kernel may still be in."""
        sys.settrace(None)
        if self.attached:
            self.attached = False
            self._answer(done=True)


def install_breakpoints(run: RunContext) -> None:
    """Make ``breakpoint()`` pause this rank for the run (written in the run's ledger)."""
    DEADLINES.hold(False)  # a hold the last run's end left behind is no longer meant
    answer_on_control(DEBUG_REQUEST, _debug_request)
    answer_on_control(HOLD_REQUEST, _hold_request)
    run.patches.set(sys, "breakpointhook", _breakpointhook, "breakpoint() in the run")
    run.patches.on_undo(lambda: _close(run), "the run's debugger")


def breakpoint_on(rank: int | None, frame: FrameType) -> None:
    """Pause at ``frame`` on ``rank`` (every rank that reaches it when None)."""
    run = current_run()
    if rank is not None and not 0 <= rank < run.world_size:
        raise ValueError(f"phalanx.breakpoint(rank={rank}): ranks are 0..{run.world_size - 1}")
    if rank is None or rank == run.rank:
        if run.debugger is None:
            run.debugger = PausedDebugger(run.rank)
        run.debugger.called_at = frame.f_lineno
        run.debugger.set_trace(frame)


def _breakpointhook(*args: Any, **kwargs: Any) -> None:
    breakpoint_on(None, sys._getframe(1))


def _close(run: RunContext) -> None:
    if run.debugger is not None:
        run.debugger.close()


def _debug_request(content: dict) -> dict:
    run = engine_state().run
    debugger = run.debugger if run is not None else None
    if debugger is None or not debugger.attached:
        return {"output": "", "done": True}
    text, done = debugger.take_line(content.get("line"))
    return {"output": text, "done": done}


def _hold_request(content: dict) -> dict:
    DEADLINES.hold(bool(content.get("hold")))
    return {}
