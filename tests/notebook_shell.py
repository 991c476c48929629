"""The notebook the tests type into: one real IPython shell per pytest process, with phalanx
loaded, and a clean namespace for every test module.

IPython's shell is a process singleton, so every module a worker runs types into the same
shell.  Names one module left behind would otherwise reach the next: a suggestion such as "did
you mean 'model'?" would list a name another module defined, and a test would pass or fail by
which modules xdist happened to put on the same worker.  So the namespace is put back to what it
was right after ``%load_ext phalanx`` before each module (:func:`clean_notebook`), and tests
that assert on the namespace call it themselves before they build the names they need.

Example (in ``conftest.py``)::

    pytest_plugins = ["notebook_shell"]
"""

from __future__ import annotations

from typing import Any

import pytest

# The namespace right after the extension loaded: IPython's own names (In, Out, exit, ...)
_BASELINE: dict[str, Any] = {}


@pytest.fixture(scope="session")
def shell():
    """One IPython shell for the test session (IPython's shell is a process singleton)."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "phalanx")
    _BASELINE.clear()
    _BASELINE.update(ip.user_ns)
    yield ip
    from phalanx._session import close_session

    close_session(ip)


def clean_notebook() -> list[str]:
    """Put the shell's namespace back to its state after ``%load_ext phalanx``; returns the names
    removed.  Nothing to do before the shell exists."""
    from IPython.core.interactiveshell import InteractiveShell

    if not InteractiveShell.initialized() or not _BASELINE:
        return []
    user_ns = InteractiveShell.instance().user_ns
    removed = [name for name in user_ns if name not in _BASELINE]
    for name in removed:
        del user_ns[name]
    user_ns.update(_BASELINE)
    return removed


@pytest.fixture(scope="module", autouse=True)
def _fresh_notebook_per_module():
    """Every test module starts from a notebook no other module typed into."""
    clean_notebook()
    yield
