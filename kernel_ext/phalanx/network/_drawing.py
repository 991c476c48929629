"""Drawing a network in the notebook: a left-to-right layered SVG with node states coloured.

:func:`layered_layout` is pure (names and edges in, grid positions out); :func:`render_svg`
turns a ``network`` event into SVG, so the notebook drawing shows exactly what the panel gets.

Example::

    >>> layered_layout(["X", "pca", "ridge"], [("X", "pca"), ("pca", "ridge"), ("X", "ridge")])
    {'X': (0, 0), 'pca': (1, 0), 'ridge': (2, 0)}
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from ._events import network_event

if TYPE_CHECKING:
    from ._graph import Machine, Node

STATE_COLOURS = {
    "fresh": "#e0e0e0", "stale": "#ffd27f", "queued": "#b3d4ff",
    "fitting": "#5aa0ff", "fitted": "#9ad29a", "failed": "#f28b82",
}
_COL_W, _ROW_H, _BOX_W, _BOX_H, _PAD = 170, 64, 136, 40, 16


def layered_layout(ids: Sequence[str], edges: Sequence[tuple[str, str]]
                   ) -> dict[str, tuple[int, int]]:
    """Grid position ``(column, row)`` for each id: column = longest path from a root.

    Within a column, nodes are ordered by the mean row of their predecessors (one barycentre
    pass), which keeps most edges from crossing in the small DAGs networks are.

    Example::

        >>> layered_layout(["a", "b", "c"], [("a", "c"), ("b", "c")])
        {'a': (0, 0), 'b': (0, 1), 'c': (1, 0)}
    """
    preds: dict[str, list[str]] = {i: [] for i in ids}
    for a, b in edges:
        if a in preds and b in preds:
            preds[b].append(a)
    column: dict[str, int] = {}

    def col(i: str, trail: frozenset = frozenset()) -> int:
        if i not in column:
            if i in trail:  # a cycle cannot come from the graph API; guard the recursion anyway
                return 0
            column[i] = 1 + max((col(p, trail | {i}) for p in preds[i]), default=-1)
        return column[i]

    for i in ids:
        col(i)
    pos: dict[str, tuple[int, int]] = {}
    for c in range(max(column.values(), default=-1) + 1):
        members = [i for i in ids if column[i] == c]
        order = {i: k for k, i in enumerate(members)}
        members.sort(key=lambda i: _barycentre(i, preds, pos, order))
        for row, i in enumerate(members):
            pos[i] = (c, row)
    return {i: pos[i] for i in ids}


def _barycentre(i: str, preds: dict, pos: dict, order: dict) -> tuple[float, int]:
    rows = [pos[p][1] for p in preds[i] if p in pos]
    return (sum(rows) / len(rows) if rows else 0.0, order[i])


def render_svg(event: dict) -> str:
    """SVG of a ``network`` event: boxes coloured by state, arrows left to right."""
    nodes = {n["id"]: n for n in event["nodes"]}
    edges = [tuple(e) for e in event["edges"]]
    pos = layered_layout(list(nodes), edges)
    n_cols = 1 + max((c for c, _ in pos.values()), default=0)
    n_rows = 1 + max((r for _, r in pos.values()), default=0)
    width = max(n_cols * _COL_W + _PAD, len(STATE_COLOURS) * 70 + _PAD)
    height = n_rows * _ROW_H + _PAD + 24
    # The viewBox lets the picture scale to its box (a narrow notebook column, nbviewer's
    # page): without it a wide network was clipped at the output's edge.
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" style="max-width:100%;height:auto" '
             f'font-family="sans-serif" font-size="12">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
             'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#666"/>'
             '</marker></defs>']
    parts += [_edge_svg(pos[a], pos[b]) for a, b in edges if a in pos and b in pos]
    parts += [_node_svg(nodes[i], pos[i]) for i in nodes]
    parts.append(_legend_svg(height - 12))
    parts.append("</svg>")
    return "".join(parts)


def _xy(p: tuple[int, int]) -> tuple[int, int]:
    return _PAD + p[0] * _COL_W, _PAD + p[1] * _ROW_H


def _edge_svg(a: tuple[int, int], b: tuple[int, int]) -> str:
    (x1, y1), (x2, y2) = _xy(a), _xy(b)
    x1, y1, y2 = x1 + _BOX_W, y1 + _BOX_H // 2, y2 + _BOX_H // 2
    mid = (x1 + x2) / 2
    return (f'<path d="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}" fill="none" '
            f'stroke="#666" marker-end="url(#arrow)"/>')


def _node_svg(n: dict, p: tuple[int, int]) -> str:
    x, y = _xy(p)
    colour = STATE_COLOURS.get(n["state"], "#ffffff")
    radius = 18 if n["kind"] == "source" else 4
    sub = n.get("estimator") or n["kind"]
    if n.get("fit_time_s") is not None:
        sub += f" · {n['fit_time_s']:.2f}s"
    tip = escape(f"{n['label']}: {n['state']}" + (f" ({n['last_action']})"
                                                   if n.get("last_action") else ""))
    return (f'<g><title>{tip}</title><rect x="{x}" y="{y}" width="{_BOX_W}" height="{_BOX_H}" '
            f'rx="{radius}" fill="{colour}" stroke="#444"/>'
            f'<text x="{x + _BOX_W / 2}" y="{y + 16}" text-anchor="middle" font-weight="bold">'
            f'{escape(_clip(n["label"]))}</text>'
            f'<text x="{x + _BOX_W / 2}" y="{y + 31}" text-anchor="middle" fill="#333">'
            f'{escape(_clip(sub))}</text></g>')


def _legend_svg(y: int) -> str:
    out, x = [], _PAD
    for state, colour in STATE_COLOURS.items():
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}" '
                   f'stroke="#444"/><text x="{x + 14}" y="{y}">{state}</text>')
        x += 70
    return "".join(out)


def _clip(text: str, limit: int = 20) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def network_html(target: Node | Machine) -> str:
    """HTML for a node or machine: the drawing of its network with current states."""
    event = network_event(target)
    return f'<div class="phalanx-network">{render_svg(event)}</div>'
