"""Can the frontend show widgets?  Decides between the live widgets and plain text.

Only a Jupyter kernel (``ZMQInteractiveShell``) has a frontend that renders ipywidgets; terminal
IPython, plain Python and test shells get the text fallback.

Example::

    >>> widgets_available(None)
    False
"""

from __future__ import annotations

from typing import Any


def widgets_available(shell: Any) -> bool:
    """True in a Jupyter kernel with ipywidgets and jupyter_bokeh importable."""
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return False
    try:
        import ipywidgets  # noqa: F401
        import jupyter_bokeh  # noqa: F401
    except ImportError:
        return False
    return True
