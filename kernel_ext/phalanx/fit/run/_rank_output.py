"""What the ranks other than 0 print, kept per rank in the cell: one ``<details>`` each.

In a notebook, rank 0's lines stream into the cell as they come; the other ranks' lines go into
one output of the cell, a closed ``<details>`` per rank (its summary says how many lines and
the last one), kept up to date while the run goes on and saved with the notebook as plain HTML,
so a shared notebook shows what each rank said without a kernel or a widget.  ``text/plain``
carries the same lines with a ``[rank r]`` prefix for frontends that show no HTML.

Example::

    >>> outputs = RankOutputs()
    >>> outputs.add(1, ["hello from 1", "<done>"])
    >>> print(outputs.bundle()["text/plain"])
    [rank 1] hello from 1
    [rank 1] <done>
    >>> "&lt;done&gt;" in outputs.bundle()["text/html"]
    True
"""

from __future__ import annotations

import html
import time
from collections import deque
from typing import Any

KEEP_LINES = 1000   # per rank: the last ones (each update resends them, and the notebook keeps them)
SHOW_EVERY_S = 1.0  # while the run goes on, the output is redrawn at most this often
_SUMMARY_CHARS = 80


class RankOutputs:
    """The other ranks' printed lines and the one cell output that shows them."""

    def __init__(self) -> None:
        self.lines: dict[int, deque[str]] = {}
        self.counts: dict[int, int] = {}
        self._handle: Any = None
        self._shown_at = 0.0
        self._changed = False

    def add(self, rank: int, lines: list[str]) -> None:
        if not lines:
            return
        self.lines.setdefault(rank, deque(maxlen=KEEP_LINES)).extend(lines)
        self.counts[rank] = self.counts.get(rank, 0) + len(lines)
        self._changed = True

    def show(self, final: bool = False) -> None:
        """Draw what changed (at most every :data:`SHOW_EVERY_S` until ``final``)."""
        if not self._changed or (not final and time.monotonic() - self._shown_at < SHOW_EVERY_S):
            return
        from IPython.display import display

        self._changed, self._shown_at = False, time.monotonic()
        if self._handle is None:
            self._handle = display(self.bundle(), raw=True, display_id=True)
        else:
            self._handle.update(self.bundle(), raw=True)

    def bundle(self) -> dict[str, str]:
        ranks = sorted(self.lines)
        plain = "\n".join(f"[rank {rank}] {line}" for rank in ranks for line in self.lines[rank])
        blocks = "".join(self._details(rank) for rank in ranks)
        return {"text/plain": plain, "text/html": f'<div class="phalanx-rank-output">{blocks}</div>'}

    def _details(self, rank: int) -> str:
        lines, count = self.lines[rank], self.counts[rank]
        last = lines[-1] if lines else ""
        last = last if len(last) <= _SUMMARY_CHARS else last[:_SUMMARY_CHARS - 1] + "…"
        left_out = count - len(lines)
        earlier = f"… {left_out} earlier line(s) not kept\n" if left_out else ""
        return (f"<details><summary>rank {rank} printed {count} line(s); last: "
                f"<code>{html.escape(last)}</code></summary>"
                f"<pre>{html.escape(earlier + chr(10).join(lines))}</pre></details>")
