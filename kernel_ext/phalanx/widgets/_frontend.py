"""Can the frontend show widgets?  Decides between the live widgets and plain text.

Only a Jupyter kernel (``ZMQInteractiveShell``) has a frontend that renders ipywidgets; terminal
IPython, plain Python and test shells get the text fallback.

Example::

    >>> widgets_available(None)
    False
"""

from __future__ import annotations

import importlib.util
from typing import Any


def widgets_available(shell: Any) -> bool:
    """True in a Jupyter kernel with ipywidgets and jupyter_bokeh installed."""
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return False
    # Found, not imported: jupyter_bokeh imports bokeh (about a second), which the run's
    # first line and bars must not wait for; the plot imports it later.  Found once, found for
    # the session (a search of the path costs every run 0.1 ms); not found is asked again, as
    # a package installed meanwhile counts.
    global _found
    if not _found:
        _found = all(importlib.util.find_spec(name) is not None
                     for name in ("ipywidgets", "jupyter_bokeh"))
    return _found


_found = False  # both packages found (then for the rest of the session)
