"""Python's own debugger, driven one command at a time by the kernel instead of a terminal.

A rank's debugger has no terminal: the person types into the notebook, and each line reaches the
engine as one call (after a failure) or one control message (at a breakpoint).
:class:`RemotePdb` is ``pdb.Pdb`` with its output captured per command, so what ``p``, ``up``
or ``l`` print goes back as that call's answer.  ``l`` shows the cell's lines as the editor
numbers them: the engine compiles the cell under a name whose source ``linecache`` holds.

Example::

    debugger = RemotePdb()
    first = debugger.start_post_mortem(traceback)   # "> <distributed_fit>(4)<module>()\\n-> ..."
    text, done = debugger.command("p step")          # ("5\\n", False)
    text, done = debugger.command("q")               # ("", True)
"""

from __future__ import annotations

import io
import pdb
from types import TracebackType

from ...wire._seam import CELL_FILENAME


class RemotePdb(pdb.Pdb):
    """``pdb.Pdb`` whose commands come one by one and whose output is returned per command."""

    def __init__(self) -> None:
        # stdin is never read (commands come through :meth:`command`); readrc: an engine's
        # home .pdbrc is not the person's
        super().__init__(stdin=io.StringIO(), stdout=io.StringIO(), readrc=False, nosigint=True)
        self.prompt = "(Pdb) "

    def start_post_mortem(self, tb: TracebackType) -> str:
        """Open on a failure's frames (the innermost current, as ``%debug`` does); returns the
        first lines to show."""
        self.reset()
        self.setup(None, cell_traceback(tb))
        return self.capture(lambda: self.print_stack_entry(self.stack[self.curindex]))

    def command(self, line: str) -> tuple[str, bool]:
        """Run one line as typed at ``(Pdb)``; returns (what it printed, whether the debugger
        is done: ``q``, ``c``, a step out of a post-mortem's frames)."""
        done = False

        def run() -> None:
            nonlocal done
            self.cmdqueue.append(line)
            while self.cmdqueue and not done:  # ``a ;; b`` queues ``b`` after ``a``
                typed = self.precmd(self.cmdqueue.pop(0))
                done = bool(self.postcmd(self.onecmd(typed), typed))

        return self.capture(run), done

    def capture(self, action: object) -> str:
        out = io.StringIO()
        self.stdout = out
        action()  # type: ignore[operator]
        return out.getvalue()

    def do_interact(self, arg: str) -> None:
        """Statements typed at the prompt run in the current frame; an interactive console
        would read the engine's own stdin, which nobody types into."""
        self.message("interact is not available on a rank: type Python statements at the "
                     "(Pdb) prompt (or ! statement)")


def cell_traceback(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from the cell's first frame on: phalanx's frames above it are not the person's."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename != CELL_FILENAME:
        first = first.tb_next
    return first or tb
