"""BokehJS in the notebook page: jupyter_bokeh draws with the page's BokehJS, loaded first.

jupyter_bokeh's widget renders a bokeh document with the ``Bokeh`` object of the page; without
it the view fails ("Cannot read properties of undefined (reading 'require')").  bokeh's
``load_notebook`` publishes the loader; it is done once per kernel, before the first live view.

BokehJS is sent inline (once) so plots draw where the browser cannot reach bokeh's CDN
(clusters are often offline); setting ``BOKEH_RESOURCES`` (bokeh's own switch, e.g. ``cdn``)
picks another source.  Only the bundles the live view's models need are sent
(:data:`COMPONENTS`): bokeh's default adds MathJax, tables and WebGL, 2.4 times the code for the
browser to receive and evaluate before the first chart draws.  The loader's output is emptied when the run ends: the page keeps the
loaded code, and a saved notebook does not carry megabytes of JavaScript.

Example::

    handle = load_bokehjs(shell)      # before displaying the first BokehModel
    ...
    forget_loader(handle)             # when the run is over
"""

from __future__ import annotations

import os
from typing import Any

_FLAG = "_phalanx_bokehjs_loaded"  # on the shell: once per kernel, like the session itself
# The live view's models are plots, tabs and one Div (a widget); its labels are never TeX
# (PlainText), so neither MathJax nor tables nor WebGL are loaded.  tests/test_widgets_run_view.py
# checks this list against what bokeh says the view's document needs.
COMPONENTS = ["bokeh", "bokeh-widgets"]


def load_bokehjs(shell: Any) -> Any:
    """Publish the BokehJS loader once per kernel; a display handle to empty later, or None."""
    if shell is None or getattr(shell, _FLAG, False):
        return None
    from bokeh.io.notebook import load_notebook
    from bokeh.resources import INLINE, Resources
    from bokeh.settings import settings
    from IPython.display import display
    from IPython.utils.capture import capture_output

    source = Resources(mode=settings.resources()) if os.environ.get("BOKEH_RESOURCES") else INLINE
    resources = source.clone(components=list(COMPONENTS))
    with capture_output(stdout=False, stderr=False) as published:  # to republish with an id
        load_notebook(resources=resources, hide_banner=True)
    handle = None
    for output in published.outputs:
        handle = display(output.data, raw=True, display_id=True)
    setattr(shell, _FLAG, True)
    return handle


def forget_loader(handle: Any) -> None:
    """Empty the loader's output (the code it loaded stays in the page)."""
    if handle is not None:
        handle.update({"text/plain": ""}, raw=True)
