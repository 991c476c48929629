"""Per-rank progress bars (ipywidgets): steps, steps/s, ETA, latest metrics, straggler mark.

Fed with the ``ranks`` list of ``progress`` events; each bar's value is the rank's optimizer
step count, its maximum the ``--steps`` total (or, without one, the leading rank's count).

Example::

    panel = ProgressPanel(world_size=2, total_steps=100)
    display(panel.widget)
    panel.update([{"rank": 0, "step": 10, "total": 100, ...}, ...])
"""

from __future__ import annotations

import html
from typing import Any, Mapping

from ._format import DOT, bar_range, memory_text, rank_text, time_text
from ._parts_bar import parts_bar_html

_STRAGGLER = '<span style="color:#c75000;font-weight:bold">⚠</span> '
_FINAL_STYLE = {"done": "success", "failed": "danger", "timeout": "danger", "interrupted": "warning"}


class ProgressPanel:
    """One row per rank: a label, an ``IntProgress`` bar and a detail line."""

    def __init__(self, world_size: int, total_steps: int | None) -> None:
        import ipywidgets as w
        from ipywidgets.widgets.widget_int import ProgressStyle
        from ipywidgets.widgets.widget_string import HTMLStyle

        self.total_steps = total_steps
        self.bars: list[Any] = []
        self.details: list[Any] = []
        self.widget = w.VBox([])
        # Every widget opens a comm, and so does each layout and style it creates for itself:
        # the rows share the ones no row changes (a row's own layout hides it; see show_ranks).
        # The label and the bar keep their width (flex 0 0): a long detail line (step parts,
        # memory) otherwise squeezes the label until "rank 0" wraps onto two lines.
        self._shared = {"label": w.Layout(width="4.5em", flex="0 0 auto"),
                        "bar": w.Layout(width="40%", flex="0 0 auto"),
                        "detail": w.Layout(flex="1 1 auto"), "text": HTMLStyle(),
                        "progress": ProgressStyle()}
        self.show_ranks(world_size)
        self.memory: dict[int, Mapping[str, Any]] = {}   # each rank's latest memory sample
        self.times: dict[int, Mapping[str, Any]] = {}    # each rank's time in collectives
        self._last: dict[int, Mapping[str, Any]] = {}     # each rank's latest progress row

    def show_ranks(self, world_size: int) -> None:
        """One row per rank of ``world_size``: an elastic run that grew gets rows for its new
        ranks; rows of ranks it no longer has are hidden (their last figures kept)."""
        import ipywidgets as w

        shared = self._shared
        rows = []
        for rank in range(len(self.bars), world_size):
            self.bars.append(w.IntProgress(value=0, min=0, max=self.total_steps or 1,
                                           bar_style="info", layout=shared["bar"],
                                           style=shared["progress"]))
            self.details.append(w.HTML(value=self._detail(
                {"rank": rank, "step": 0, "total": self.total_steps}),
                layout=shared["detail"], style=shared["text"]))
            label = w.HTML(f"<code>rank {rank}</code>", layout=shared["label"], style=shared["text"])
            rows.append(w.HBox([label, self.bars[rank], self.details[rank]]))
        if rows:
            self.widget.children = (*self.widget.children, *rows)
        for rank, row in enumerate(self.widget.children):
            row.layout.display = "" if rank < world_size else "none"

    def update(self, ranks: list[Mapping[str, Any]]) -> None:
        """Show the ranks' latest progress (one ``progress`` event's ``ranks``)."""
        top = bar_range(ranks)
        for p in ranks:
            rank = int(p["rank"])
            if not 0 <= rank < len(self.bars):
                continue
            bar = self.bars[rank]
            with bar.hold_sync():  # one comm message per bar, not one per trait
                bar.max = max(top, int(p["step"]), 1)
                bar.value = int(p["step"])
                bar.bar_style = "warning" if p.get("straggler") else "info"
            self._last[rank] = p
            self._show(rank)

    def update_memory(self, samples: list[Mapping[str, Any]]) -> None:
        """Show the ranks' latest memory (one ``memory`` event's ``ranks``) after their progress."""
        self._keep(self.memory, samples)

    def update_times(self, parts: list[Mapping[str, Any]]) -> None:
        """Show the ranks' time in collectives (one ``time`` event's ``ranks``)."""
        self._keep(self.times, parts)

    def _keep(self, store: dict, entries: list[Mapping[str, Any]]) -> None:
        for entry in entries:
            rank = int(entry["rank"])
            if 0 <= rank < len(self.details):
                store[rank] = entry
                self._show(rank)

    def _show(self, rank: int) -> None:
        last = self._last.get(rank, {"rank": rank, "step": 0, "total": self.total_steps})
        self.details[rank].value = self._detail(last, self.memory.get(rank), self.times.get(rank))

    def finish(self, steps: Mapping[int, int], status: str) -> None:
        """Final counts (the engines' own) and a colour for how the run ended."""
        top = self.total_steps or max([*steps.values(), 1])
        for rank, bar in enumerate(self.bars):
            with bar.hold_sync():
                bar.max = max(top, steps.get(rank, 0), 1)
                bar.value = int(steps.get(rank, bar.value))
                bar.bar_style = _FINAL_STYLE.get(status, "info")

    @staticmethod
    def _detail(p: Mapping[str, Any], memory: Mapping[str, Any] | None = None,
                times: Mapping[str, Any] | None = None) -> str:
        extra = [t for t in (memory_text(memory), time_text(times)) if t]
        text = html.escape(DOT.join([rank_text(p), *extra]))
        return ((_STRAGGLER if p.get("straggler") else "") + f"<small>{text}</small>"
                + parts_bar_html(times))
