"""A failed run's frames, kept on its engine for ``%debug`` until the next run.

When the cell raises on a rank, the exception's traceback (and through it every frame and the
cell's namespace) is kept in the engine's state: one failure per engine, dropped when the next
run starts there, so what it holds (a model, its GPU memory) lives no longer than a person can
use it.  ``%debug`` in the kernel then calls :func:`open_post_mortem` and
:func:`post_mortem_command` on that engine, one call per line typed (the engine is idle: the
run is over).

Example (what the kernel calls on rank 1's engine)::

    open_post_mortem("ab12cd34-3")       # "ValueError: boom\\n> <distributed_fit>(6)..."
    post_mortem_command("p step")         # ("5\\n", False)
    post_mortem_command("q")              # ("", True): the engine is as before
"""

from __future__ import annotations

import bdb
import gc
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ._remote_pdb import RemotePdb
from ..run._engine_state import engine_state


class NoFramesError(RuntimeError):
    """This engine holds no frames of the run asked for (a later run or a restart replaced them)."""


@dataclass
class FailureFrames:
    """One rank's failure of one run: what ``%debug`` opens."""

    run_id: str
    rank: int
    error: str                      # "ValueError: boom", the first line shown
    tb: TracebackType
    debugger: RemotePdb | None = None


def keep_failure(run_id: str, rank: int, exc: BaseException) -> bool:
    """Keep ``exc``'s frames for ``%debug`` (replacing any earlier failure's); an interrupt
    (a Stop, a peer's fault) or a debugger's ``q`` keeps nothing: its frames would only hold
    the run's memory."""
    state = engine_state()
    state.post_mortem = None
    if isinstance(exc, (KeyboardInterrupt, bdb.BdbQuit)) or exc.__traceback__ is None:
        return False  # a quit debugger ended the run on purpose: nothing to look at
    error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    state.post_mortem = FailureFrames(run_id, rank, error, exc.__traceback__)
    return True


def forget_failure() -> None:
    """A new run starts: the last failure's frames (and the objects they hold) go."""
    state = engine_state()
    if state.post_mortem is not None:
        state.post_mortem = None
        gc.collect()  # the frames' namespace is in reference cycles (functions, optimizers)


def open_post_mortem(run_id: str) -> str:
    """Open a debugger on the kept frames of ``run_id``; returns the first lines to show."""
    kept = _kept(run_id)
    kept.debugger = RemotePdb()
    return f"rank {kept.rank}: {kept.error}\n" + kept.debugger.start_post_mortem(kept.tb)


def post_mortem_command(run_id: str, line: str) -> tuple[str, bool]:
    """One line typed at ``(Pdb)``; (output, done).  Done, the frames stay: ``%debug`` again
    opens them afresh, as in a plain notebook."""
    kept = _kept(run_id)
    if kept.debugger is None:
        raise NoFramesError("the debugger on this rank was closed; run %debug again")
    text, done = kept.debugger.command(line)
    if done:
        kept.debugger = None
    return text, done


def _kept(run_id: str) -> Any:
    kept = engine_state().post_mortem
    if kept is None or kept.run_id != run_id:
        raise NoFramesError("its frames are gone: a later run on its engine replaced them "
                            "(a failure's frames are kept until the next run)")
    return kept
