"""Notebook views of phalanx: live run view, text progress, run summary, cluster widget.

Every view reads the session's event bus (:mod:`phalanx.events`) and calls only session verbs;
the magics create them and show what they return.

Example::

    shown = RunDisplay(session, shell)          # what a %%distributed_fit cell shows
    panel = cluster_view(session)               # what %cluster with no arguments shows
"""


from __future__ import annotations

import importlib
from typing import Any

# Each name is loaded from its module on first use: a cell's first line (``_status_line``)
# must reach the page before ipywidgets and the views are imported.
_HOMES = {"RunDisplay": "_display", "RunSummary": "_summary", "TextProgress": "_text",
          "ClusterWidget": "_cluster", "ClusterStatus": "_cluster_table",
          "cluster_view": "_cluster", "widgets_available": "_frontend"}

__all__ = ["RunDisplay", "RunSummary", "TextProgress", "ClusterWidget", "ClusterStatus", "cluster_view",
           "widgets_available"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
