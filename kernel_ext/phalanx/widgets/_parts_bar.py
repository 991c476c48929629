"""One rank's step time as a stacked bar (HTML): the parts of a ``time`` event entry.

The parts (data & forward, backward, waiting for a peer, moving bytes, optimizer, log(), other)
add up to the rank's step time; the bar draws each as its share, the caption names those of 1% or
more and, on a rank marked slow, the part that makes it slow.  The panel draws the same bar from
the same event (``labextension/src/panel/parts.ts``).

Example::

    >>> html = parts_bar_html({"steps": 2, "step_s": 1.0, "slow": "data & forward 80% of step time",
    ...                        "parts": {"data": 0.8, "backward": 0.1, "wait": 0.1}})
    >>> 'data-part="data"' in html and "slow: data &amp; forward 80%" in html
    True
    >>> parts_bar_html({"collective_s": 1.0})
    ''
    >>> 'background:#e45756' in parts_legend_html() and "waiting for a peer" in parts_legend_html()
    True
"""

from __future__ import annotations

import html
from typing import Any, Mapping

from ..fit.telemetry import PART_NAMES, breakdown_text, part_label

PART_COLOURS = {"data": "#4c78a8", "backward": "#72b7b2", "wait": "#e45756", "move": "#f58518",
                "optimizer": "#54a24b", "log": "#b279a2", "other": "#bab0ac"}


def parts_bar_html(t: Mapping[str, Any] | None) -> str:
    """The bar and caption of one rank, or ``""`` before it finished a step."""
    if not t or not t.get("step_s") or not t.get("parts"):
        return ""
    split, total = t["parts"], t["step_s"]
    hooked = split.get("backward", 0.0) > 0
    segments = "".join(
        f'<div data-part="{n}" title="{html.escape(part_label(n, hooked))}: '
        f'{split[n] / total:.0%}" style="width:{100 * split[n] / total:.2f}%;'
        f'background:{PART_COLOURS[n]}"></div>'
        for n in PART_NAMES if split.get(n, 0.0) > 0)
    caption = html.escape(breakdown_text({**t, "steps": t.get("steps", 1)}))
    slow = (f'<br><b style="color:#c75000">slow: {html.escape(t["slow"])}</b>'
            if t.get("slow") else "")
    return ('<div class="phalanx-parts" style="display:flex;height:6px;width:100%;'
            f'border-radius:3px;overflow:hidden;background:#eee;margin:2px 0">{segments}</div>'
            f"<small>{caption}{slow}</small>")


def parts_legend_html() -> str:
    """What the bars' colours mean: one line of swatches, shown once above the ranks' bars (the
    colours alone named nothing; a caption per bar names only the parts of 1% or more)."""
    items = "".join(
        f'<span style="white-space:nowrap;margin-right:1em"><span style="display:inline-block;'
        f'width:.8em;height:.8em;border-radius:2px;vertical-align:middle;'
        f'background:{PART_COLOURS[n]}"></span> {html.escape(part_label(n))}</span>'
        for n in PART_NAMES)
    return f'<small class="phalanx-parts-legend">{items}</small>'
