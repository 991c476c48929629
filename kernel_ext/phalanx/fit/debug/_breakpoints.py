"""The kernel's side of ``breakpoint()`` in a run: one paused rank at a time, in the cell.

The run's wait loop calls :meth:`PausedRanks.serve` every poll.  A rank that stopped in its
debugger announced it in its task's data (``runtime/debug/_breakpoints.py``); the lowest such rank
is served first: the cell says which rank paused where, the other ranks' collective deadlines
are held (they wait at their next collective, however long the person takes), and each line
read from the notebook's input box goes to the rank as a control request, its answer printed.
When the debugger lets the run go on (``c``, or ``q`` which ends the run) the deadlines are
released and the loop goes back to waiting.

A ``--background`` run has no input box: its breakpoints are passed (``c``), said in the cell.

Example (inside the wait loop)::

    paused = PausedRanks(cluster, slots, ars)
    paused.serve(pending)   # returns at once unless a rank paused
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable

from ..._cell_line import say
from ...wire._control_requests import DEBUG_REQUEST, HOLD_REQUEST, PAUSE_KEY
from ..run._engine_calls import registered
from ..run._engine_control import ask_engines, send_request

HOLD_ANSWER_S = 2.0
_REPLY_POLL_S = 0.5


class PausedRanks:
    """Finds ranks paused at a breakpoint and runs their debugger in the cell, rank order."""

    def __init__(self, cluster: Any, slots: list, ars: list,
                 read: Callable[[str], str] | None = None,
                 write: Callable[[str], None] = say,
                 on_pause: Callable[[int, dict | None], None] | None = None) -> None:
        self.cluster, self.slots, self.ars = cluster, slots, ars
        self.read, self.write = read, write
        self.on_pause = on_pause  # told when a rank's debugger opens (its pause) and closes (None)
        self.seen: dict[int, int] = {}  # rank -> the last stop served

    def serve(self, pending: set[int]) -> None:
        for rank in sorted(pending):
            pause = _pause_of(self.ars[rank])
            if pause is not None and pause.get("seq", 0) > self.seen.get(rank, 0):
                self.seen[rank] = pause["seq"]
                self._debug(rank, pause)

    def _debug(self, rank: int, pause: dict) -> None:
        others = [s.engine_id for r, s in enumerate(self.slots) if r != rank]
        ask_engines(self.cluster, others, HOLD_REQUEST, {"hold": True}, HOLD_ANSWER_S)
        if self.on_pause is not None:
            self.on_pause(rank, pause)
        try:
            step = f", step {pause['step']}" if pause.get("step") else ""
            self.write(f"phalanx: rank {rank} paused at line {pause['line']} of the cell{step}: "
                       f"{pause['source']}\nthe other ranks wait at their next collective; c "
                       "continues the run, q ends it")
            if threading.current_thread() is not threading.main_thread():
                self._send(rank, None)
                self._send(rank, "c")
                self.write(f"phalanx: rank {rank} continued: a --background run has no input "
                           "box to type into")
                return
            text, done = self._send(rank, None)
            while True:
                if text:
                    self.write(text.rstrip("\n"))
                if done:
                    return
                text, done = self._send(rank, self._read_line())
        finally:
            ask_engines(self.cluster, others, HOLD_REQUEST, {"hold": False}, HOLD_ANSWER_S)
            if self.on_pause is not None:
                self.on_pause(rank, None)

    def _read_line(self) -> str:
        try:
            if self.read is not None:
                return self.read("(Pdb) ")
            import builtins  # looked up now: ipykernel's input is the notebook's input box

            return builtins.input("(Pdb) ")
        except (EOFError, KeyboardInterrupt):  # the box closed, or the kernel was interrupted
            return "q"

    def _send(self, rank: int, line: str | None) -> tuple[str, bool]:
        """One line to the paused rank; (its output, whether the debugger let the run go on).
        A rank whose engine went is done."""
        slot = self.slots[rank]
        future = send_request(self.cluster, slot.engine_id, DEBUG_REQUEST, {"line": line})
        while future is not None:
            try:
                (reply,) = future.result(timeout=_REPLY_POLL_S)
            except concurrent.futures.TimeoutError:
                if slot.state == "dead" or not registered(self.cluster, slot.engine_id):
                    break
                continue  # the rank is still running the command (`n` over a long line)
            except Exception:
                break
            content = reply["content"]
            if content.get("status") != "ok":
                return f"phalanx: {content.get('error')}", True
            return content["output"], bool(content["done"])
        return f"phalanx: rank {rank}'s engine is gone", True


def _pause_of(ar: Any) -> dict | None:
    """The last stop a rank's task announced (ipyparallel keeps published data per task)."""
    try:
        data = ar.metadata.get("data") or {}
    except Exception:  # an undelivered task has no metadata
        return None
    pause = data.get(PAUSE_KEY)
    return pause if isinstance(pause, dict) else None
