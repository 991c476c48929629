"""How nodes and machines reach the layers built on them: fitting, computing and drawing.

``node.fit()``, ``node()`` and a node's notebook drawing are carried out by the scheduler and
the drawing code, which are themselves written in terms of nodes and machines.  So that the
building blocks (:mod:`._graph`) never import those layers, the package installs them here
once, when ``phalanx.network`` is imported, and nodes and machines look them up when a method
is called.  Nothing here knows what a node is: targets are passed through untouched.

Example::

    >>> hooks().fit.__name__, hooks().evaluate.__name__, hooks().draw.__name__
    ('fit_network', 'evaluate', 'network_html')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ._fitlog import FitLog

if TYPE_CHECKING:
    from ._dask import ClusterArg
    from ._fingerprint import Rows
    from ._graph import Machine, Node


class FitNetwork(Protocol):
    """Fit everything ``targets`` (nodes or machines) depend on; see ``Node.fit``."""

    def __call__(self, targets: Sequence[Node | Machine], rows: Rows = None, force: bool = False,
                 cluster: ClusterArg | None = None, on_event: Callable[[dict], None] | None = None
                 ) -> FitLog: ...


class Evaluate(Protocol):
    """Compute node ``target`` in the kernel, on ``rows`` of its training data or new data."""

    def __call__(self, target: Node, rows: Rows, new_data: object) -> object: ...


@dataclass(frozen=True)
class Hooks:
    """The layers above the building blocks, as the building blocks call them."""

    fit: FitNetwork
    evaluate: Evaluate
    draw: Callable[[Node | Machine], str]   # a node's or machine's network as notebook HTML


_installed: Hooks | None = None


def install(installed: Hooks) -> None:
    """Make ``installed`` the hooks every node and machine uses from now on."""
    global _installed
    _installed = installed


def hooks() -> Hooks:
    """The installed hooks."""
    if _installed is None:
        # Only reachable by loading this module without its package, whose import installs them.
        raise RuntimeError("phalanx.network is not imported: nodes cannot fit, compute or draw")
    return _installed
