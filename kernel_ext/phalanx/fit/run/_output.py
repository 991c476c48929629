r"""Stream what the ranks print into the cell as it arrives, one ``[rank r]`` prefix per line.

In a notebook only rank 0's lines stream; the other ranks' lines are kept per rank in one
output of the cell, a click away (:mod:`._rank_output`).  A terminal gets every rank's.

A progress bar (tqdm, which Hugging Face, Lightning and most loops use) redraws its line with
carriage returns: a terminal shows only the last drawing.  So does the cell: each line comes out
as its last frame once the line is complete, one line per bar per rank, not one per redraw.

Example::

    >>> as_shown("epoch 1\r 10%|#   | 1/10\r100%|##########| 10/10\n")
    ['100%|##########| 10/10']
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

from ..._cell_line import writing
from ._rank_output import RankOutputs

# Terminal control sequences (colours, cursor show/hide): a frame made only of them draws nothing.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class OutputStreamer:
    """Print new complete lines of each rank's stdout/stderr (ipyparallel collects them)."""

    def __init__(self, ars: list[Any], per_rank: bool | None = None) -> None:
        # ipyparallel appends each rank's output to its task's metadata dict in place: read the
        # dicts directly (an AsyncResult's attribute access waits, and parses its dates, each time)
        self._metadata = [getattr(ar, "metadata", None) or {} for ar in ars]
        self._seen = {(r, s): 0 for r in range(len(ars)) for s in ("stdout", "stderr")}
        per_rank = _in_notebook() if per_rank is None else per_rank
        self.others = RankOutputs() if per_rank and len(ars) > 1 else None

    def flush(self, final: bool = False) -> None:
        for rank, metadata in enumerate(self._metadata):
            for stream, sink in (("stdout", sys.stdout), ("stderr", sys.stderr)):
                text = _text(metadata.get(stream, ""))
                start = self._seen[(rank, stream)]
                end = len(text) if final else text.rfind("\n", start) + 1
                if end > start:
                    chunk = text[start:end]
                    self._seen[(rank, stream)] = end
                    if rank and self.others is not None:
                        self.others.add(rank, as_shown(chunk))
                    else:
                        with writing():  # after an open progress line: on a line of its own
                            sink.write("".join(f"[rank {rank}] {line}\n"
                                               for line in as_shown(chunk)))
        if self.others is not None:
            self.others.show(final)

    def finish(self, returned: list[Any], grace_s: float) -> None:
        """Print the rest, the last line too when it has no newline. ipyparallel can deliver a
        task's result before its last output: wait up to ``grace_s`` in all for the output of
        the tasks that ``returned`` (those of dead engines may never complete)."""
        deadline = time.monotonic() + grace_s
        for ar in returned:
            ar.wait_for_output(max(0.0, deadline - time.monotonic()))
        self.flush(final=True)


def _in_notebook() -> bool:
    """Whether the cell is drawn by a Jupyter frontend (HTML), not a terminal."""
    from IPython.core.getipython import get_ipython

    return type(get_ipython()).__name__ == "ZMQInteractiveShell"


def _text(value: Any) -> str:
    if isinstance(value, list):  # a multi-engine result; ours are single-engine
        return value[0] if value else ""
    return value or ""


def as_shown(chunk: str) -> list[str]:
    """The lines of ``chunk`` as a terminal leaves them: each line's last non-blank frame (the
    text after its last carriage return: tqdm redraws so); a line that only sets the terminal
    (shows the cursor again) is left out."""
    lines = chunk[:-1].split("\n") if chunk.endswith("\n") else chunk.split("\n")
    shown = []
    for line in lines:
        frames = [frame for frame in line.split("\r") if _ANSI.sub("", frame).strip()]
        if frames or not line:  # a blank line stays; one of control sequences goes
            shown.append(frames[-1] if frames else "")
    return shown
