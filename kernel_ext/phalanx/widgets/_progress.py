"""Per-rank progress (ipywidgets): one line per rank, the time breakdown behind a toggle.

Fed with the ``ranks`` list of ``progress`` events.  Each rank gets one line: its bar, steps,
rate, ETA, latest metrics and a straggler mark.  Where its step time goes (the stacked parts bar
and its caption, time in collectives) and its memory sit in a collapsed ``Accordion`` below the
lines, with one legend for the parts' colours: a newcomer's first run showed three or four
wrapped lines of timing per rank, with colours nothing named.  The accordion opens in the
browser alone (its selected index is model state), so it answers while the cell runs and the
kernel reads no widget messages.

A bar fills towards the total steps while that total holds.  Without one (no ``--steps``, or a
rank went past it) there is nothing to fill towards: the bars are hidden until the run ends,
when they show how each rank finished.  Nothing shows before the first step is counted, so a
cell that trains nothing never shows empty bars.

Example::

    panel = ProgressPanel(world_size=2, total_steps=100)
    display(panel.widget)
    panel.update([{"rank": 0, "step": 10, "total": 100, ...}, ...])
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any, Mapping

from ._format import DOT, bar_range, known_total, memory_text, rank_text, time_text
from ._parts_bar import parts_bar_html, parts_legend_html

if TYPE_CHECKING:
    import ipywidgets

_STRAGGLER = '<span style="color:#c75000;font-weight:bold" title="behind the other ranks">⚠</span> '
_FINAL_STYLE = {"done": "success", "failed": "danger", "timeout": "danger", "interrupted": "warning"}
DETAILS_TITLE = "time per step & memory"
_LINE = '<div style="white-space:nowrap;overflow:hidden;text-overflow:ellipsis">{}</div>'


class ProgressPanel:
    """A line per rank (label, ``IntProgress`` bar, text) and the per-rank details toggle."""

    def __init__(self, world_size: int, total_steps: int | None) -> None:
        import ipywidgets as w
        from ipywidgets.widgets.widget_int import ProgressStyle
        from ipywidgets.widgets.widget_string import HTMLStyle

        self.total_steps = total_steps
        self.bars: list[ipywidgets.IntProgress] = []
        self.lines: list[ipywidgets.HTML] = []     # each rank's one line of text
        self.details: list[ipywidgets.HTML] = []   # each rank's time breakdown and memory (in the toggle)
        # Every widget opens a comm, and so does each layout and style it creates for itself:
        # the rows share the ones no row changes (a row's own layout hides it; see show_ranks).
        # The bars share one layout too: they are shown or hidden together (one message).
        # The label and the bar keep their width (flex 0 0): a long line otherwise squeezes
        # the label until "rank 0" wraps onto two lines.
        self._shared = {"label": w.Layout(width="4.5em", flex="0 0 auto"),
                        "bar": w.Layout(width="35%", flex="0 0 auto",
                                        display="" if total_steps else "none"),
                        "line": w.Layout(flex="1 1 auto", overflow="hidden"), "text": HTMLStyle(),
                        "progress": ProgressStyle()}
        self.rows = w.VBox([])
        self.legend = w.HTML(parts_legend_html(), layout=w.Layout(display="none"))
        self.details_box = w.VBox([self.legend])
        self.toggle = w.Accordion(children=[self.details_box], titles=(DETAILS_TITLE,),
                                  selected_index=None, layout=w.Layout(display="none"))
        self.widget = w.VBox([self.rows, self.toggle], layout=w.Layout(display="none"))
        self.memory: dict[int, Mapping[str, Any]] = {}   # each rank's latest memory sample
        self.times: dict[int, Mapping[str, Any]] = {}    # each rank's time in collectives
        self._last: dict[int, Mapping[str, Any]] = {}     # each rank's latest progress row
        self.show_ranks(world_size)

    def show_ranks(self, world_size: int) -> None:
        """One row per rank of ``world_size``: an elastic run that grew gets rows for its new
        ranks; rows of ranks it no longer has are hidden (their last figures kept)."""
        import ipywidgets as w

        shared = self._shared
        rows, details = [], []
        for rank in range(len(self.bars), world_size):
            self.bars.append(w.IntProgress(value=0, min=0, max=self.total_steps or 1,
                                           bar_style="info", layout=shared["bar"],
                                           style=shared["progress"]))
            self.lines.append(w.HTML(value=self._line(self._progress(rank)),
                                     layout=shared["line"], style=shared["text"]))
            self.details.append(w.HTML(value=self._detail(rank), style=shared["text"]))
            label = w.HTML(f"<code>rank {rank}</code>", layout=shared["label"], style=shared["text"])
            rows.append(w.HBox([label, self.bars[rank], self.lines[rank]]))
            details.append(self.details[rank])
        if rows:
            self.rows.children = (*self.rows.children, *rows)
            self.details_box.children = (*self.details_box.children, *details)
        for rank, row in enumerate(self.rows.children):
            row.layout.display = "" if rank < world_size else "none"
            self.details[rank].layout.display = row.layout.display

    def update(self, ranks: list[Mapping[str, Any]]) -> None:
        """Show the ranks' latest progress (one ``progress`` event's ``ranks``)."""
        top = bar_range(ranks)
        self._shared["bar"].display = "" if top else "none"
        for p in ranks:
            rank = int(p["rank"])
            if not 0 <= rank < len(self.bars):
                continue
            bar = self.bars[rank]
            with bar.hold_sync():  # one comm message per bar, not one per trait
                bar.max = max(top or 1, 1)
                bar.value = min(int(p["step"]), bar.max) if top else 0
                bar.bar_style = "warning" if p.get("straggler") else "info"
            self._last[rank] = p
            self.lines[rank].value = self._line(p)
        if any(int(p["step"]) > 0 for p in ranks):
            self.widget.layout.display = ""

    @property
    def counts(self) -> list[int]:
        """Each rank's step count as its line shows it (a bar without a total shows none)."""
        return [int(self._progress(rank)["step"]) for rank in range(len(self.bars))]

    def update_memory(self, samples: list[Mapping[str, Any]]) -> None:
        """Keep the ranks' latest memory (one ``memory`` event's ``ranks``) in the details."""
        self._keep(self.memory, samples)

    def update_times(self, parts: list[Mapping[str, Any]]) -> None:
        """Keep the ranks' step parts and time in collectives (one ``time`` event's ``ranks``)."""
        self._keep(self.times, parts)
        if any(t.get("parts") for t in parts):
            self.legend.layout.display = ""

    def _keep(self, store: dict, entries: list[Mapping[str, Any]]) -> None:
        for entry in entries:
            rank = int(entry["rank"])
            if 0 <= rank < len(self.details):
                store[rank] = entry
                self.details[rank].value = self._detail(rank)
                self.toggle.layout.display = ""

    def _progress(self, rank: int) -> Mapping[str, Any]:
        return self._last.get(rank, {"rank": rank, "step": 0, "total": self.total_steps})

    def finish(self, steps: Mapping[int, int], status: str, failed_rank: int | None = None) -> None:
        """Final counts (the engines' own) and a colour for how the run ended; the bars show
        again, filled towards the total if the run kept to it, else towards the leading rank.
        A failed run's rank at fault is red, the ranks it released amber: one rank failed, not
        every one."""
        counted = max([*steps.values(), 0])
        top = self.total_steps if self.total_steps and counted <= self.total_steps else counted
        self._shared["bar"].display = ""
        for rank, bar in enumerate(self.bars):
            with bar.hold_sync():
                bar.max = max(top, steps.get(rank, 0), 1)
                bar.value = int(steps.get(rank, bar.value))
                bar.bar_style = _FINAL_STYLE.get(status, "info")
                if status == "failed" and failed_rank is not None and rank != failed_rank:
                    bar.bar_style = "warning"
            last = self._progress(rank)
            final = {**last, "step": int(steps.get(rank, last["step"])), "eta_s": None,
                     "straggler": False}
            self._last[rank] = final
            final["total"] = known_total({**final, "total": self.total_steps})
            self.lines[rank].value = self._line(final)
        if counted > 0:
            self.widget.layout.display = ""

    @staticmethod
    def _line(p: Mapping[str, Any]) -> str:
        text = f"<small>{html.escape(rank_text(p))}</small>"
        return _LINE.format((_STRAGGLER if p.get("straggler") else "") + text)

    def _detail(self, rank: int) -> str:
        times = self.times.get(rank)
        said = [t for t in (memory_text(self.memory.get(rank)), time_text(times)) if t]
        text = f"<small>{html.escape(DOT.join(said))}</small>" if said else ""
        return f"<code>rank {rank}</code> {text}{parts_bar_html(times)}"
