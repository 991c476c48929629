"""Notebook views of phalanx: live run view, text progress, run summary, cluster widget.

Every view reads the session's event bus (:mod:`phalanx.events`) and calls only session verbs;
the magics create them and show what they return.

Example::

    shown = RunDisplay(session, shell)          # what a %%distributed_fit cell shows
    panel = cluster_view(session)               # what %cluster with no arguments shows
"""

from ._cluster import ClusterWidget, cluster_view
from ._cluster_table import ClusterStatus
from ._display import RunDisplay
from ._frontend import widgets_available
from ._summary import RunSummary
from ._text import TextProgress

__all__ = ["RunDisplay", "RunSummary", "TextProgress", "ClusterWidget", "ClusterStatus", "cluster_view",
           "widgets_available"]
