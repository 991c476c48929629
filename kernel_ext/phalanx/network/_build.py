"""How a network is built: :func:`source`, :func:`machine` and :func:`node`.

The public constructors of the building blocks (:mod:`._graph`): plain data becomes a source,
an estimator bound to its training arguments a machine, a function of nodes a static node.
Machine methods (``pca.transform(X)``) and arithmetic on nodes build the other nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import NetworkError
from ._graph import Machine, Node, Source, static_node


def source(data: Any = None, name: str | None = None) -> Source:
    """A source node holding ``data``.

    Example::

        >>> X = source([[1.0], [2.0]], name="X"); X()
        [[1.0], [2.0]]
    """
    return Source(data, name=name)


def machine(model: Any, *training_args: Any, name: str | None = None,
            fit_runner: Callable | None = None, cache: bool = True) -> Machine:
    """Bind ``model`` to its training arguments (nodes; plain data becomes a source).

    Example::

        >>> from sklearn.linear_model import Ridge
        >>> X, y = source([[0.0], [1.0]]), source([0.0, 1.0])
        >>> ridge = machine(Ridge(), X, y, name="ridge")
        >>> yhat = ridge.predict(X)
    """
    return Machine(model, training_args, name=name, fit_runner=fit_runner, cache=cache)


def node(fn: Callable, *args: Any, name: str | None = None) -> Node:
    """A static node computing ``fn(*args)``; ``args`` are nodes or constants.

    ``fn`` must be picklable by cloudpickle, because fits on a cluster ship it to engines.

    Example::

        >>> a = source([1.0, 2.0])
        >>> twice = node(lambda v: [2 * x for x in v], a, name="twice")
        >>> twice()
        [2.0, 4.0]
    """
    if not callable(fn):
        raise NetworkError(f"node {name or fn!r}: {type(fn).__name__} is not callable")
    return static_node(fn, args, name=name)
