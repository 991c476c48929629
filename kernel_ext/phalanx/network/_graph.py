"""The building blocks of a learning network: sources, machines and nodes.

A :class:`Source` holds data; a :class:`Machine` binds an estimator to training arguments and
keeps what its last fit produced; a :class:`Node` is a value computed on demand, either by a
machine's method (``pca.transform(W)``) or by a plain function (a *static* node).

Nothing here fits, schedules or draws anything: ``Node.fit``, calling a node and its notebook
drawing hand the graph to the layers the package installs in :mod:`phalanx.network._upper_layers`.

The functions that build them, :func:`source`, :func:`machine` and :func:`node`, are in
:mod:`._build`.

Example::

    >>> import numpy as np
    >>> from sklearn.preprocessing import StandardScaler
    >>> from phalanx.network import machine, source
    >>> X = source(np.arange(6.0).reshape(3, 2), name="X")
    >>> stand = machine(StandardScaler(), X, name="stand")
    >>> W = stand.transform(X)
    >>> W.fit().actions
    {'stand': 'fit'}
    >>> W().shape
    (3, 2)
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._errors import NetworkError
from ._fingerprint import select_rows
from ._fitlog import FitLog
from ._upper_layers import hooks
from ._retrain_rules import MachineState

if TYPE_CHECKING:
    from ._dask import ClusterArg
    from ._fingerprint import Rows

# Methods a machine exposes as node-building operations.
_OPERATIONS = ("transform", "predict", "inverse_transform", "predict_proba",
               "predict_log_proba", "decision_function")


class Node:
    """A value in a learning network, computed on demand from its arguments.

    Build nodes with :func:`node`, machine methods (``m.predict(Z)``) or arithmetic
    (``0.5 * y1 + 0.5 * y2``).  Call the node to compute it: ``yhat()`` on the training data,
    ``yhat(rows=idx)`` on some of its rows, ``yhat(X_new)`` on new data for its single origin.
    """

    kind = "static"

    def __init__(self, fn: Callable | None, args: tuple, name: str | None = None,
                 machine: Machine | None = None, method: str | None = None) -> None:
        self.fn = fn
        self.args = tuple(args)
        self.machine = machine
        self.method = method
        self.uid = uuid.uuid4().hex
        self._name = name
        self._auto_name: str | None = None
        if machine is not None:
            self.kind = "operation"

    # --- identity -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The node's name: given, or a default made unique within its network when it is used."""
        return self._name or self._auto_name or self.default_name()

    def default_name(self) -> str:
        """Name used when none was given (before it is made unique)."""
        if self.machine is not None:
            return f"{self.machine.name}.{self.method}"
        fn_name = getattr(self.fn, "__name__", "node")
        return "node" if fn_name == "<lambda>" else fn_name

    @property
    def label(self) -> str:
        """Short human description, used in error messages."""
        if self.machine is not None:   # an operation node
            return f"{self.machine.name}.{self.method}(...)"
        return self.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label!r}>"

    # --- fitting and calling --------------------------------------------------------------------
    def fit(self, rows: Rows = None, force: bool = False, cluster: ClusterArg | None = None,
            on_event: Callable[[dict], None] | None = None) -> FitLog:
        """Fit every machine this node depends on, retraining only what changed.

        ``rows`` restricts all sources to those rows for training; ``force`` refits every
        machine that is not frozen; ``cluster`` (an ipyparallel ``Client``, a dask
        ``distributed.Client`` or an object with a ``.client``) fits on the engines;
        ``on_event`` receives :func:`phalanx.events.network_state` dicts as nodes change state.
        Returns a :class:`FitLog`; raises :class:`MachineFitError` when a machine fails.

        Example::

            >>> import numpy as np
            >>> from sklearn.linear_model import Ridge
            >>> from phalanx.network import machine, source
            >>> X, y = source(np.arange(8.0).reshape(4, 2), name="X"), source(np.arange(4.0), name="y")
            >>> yhat = machine(Ridge(), X, y, name="ridge").predict(X)
            >>> log = yhat.fit()
            >>> log.actions
            {'ridge': 'fit'}
            >>> yhat.fit().actions                 # nothing changed: nothing retrains
            {'ridge': 'skip'}
        """
        return hooks().fit([self], rows=rows, force=force, cluster=cluster, on_event=on_event)

    def __call__(self, *new_data: Any, rows: Any = None) -> Any:
        """Compute the node: on the training data, on ``rows`` of it, or on new data.

        Example::

            >>> import numpy as np
            >>> from sklearn.linear_model import Ridge
            >>> from phalanx.network import machine, source
            >>> X, y = source(np.arange(8.0).reshape(4, 2), name="X"), source(np.arange(4.0), name="y")
            >>> yhat = machine(Ridge(), X, y, name="ridge").predict(X)
            >>> _ = yhat.fit()
            >>> yhat().shape, yhat(rows=[0, 1]).shape, yhat(np.zeros((1, 2))).shape
            ((4,), (2,), (1,))
        """
        if len(new_data) > 1:
            raise NetworkError(f"{self.label}: pass at most one new data set, got {len(new_data)}")
        if new_data and rows is not None:
            raise NetworkError(f"{self.label}: give either new data or rows, not both")
        return hooks().evaluate(self, rows=rows,
                                new_data=new_data[0] if new_data else _NO_DATA)

    @property
    def origins(self) -> list[Source]:
        """The sources this node's value is computed from (training edges excluded)."""
        return operation_closure([self]).sources

    def _repr_html_(self) -> str:
        return hooks().draw(self)

    # --- arithmetic builds static nodes --------------------------------------------------------
    def __add__(self, other): return static_node(operator.add, (self, other))
    def __radd__(self, other): return static_node(operator.add, (other, self))
    def __sub__(self, other): return static_node(operator.sub, (self, other))
    def __rsub__(self, other): return static_node(operator.sub, (other, self))
    def __mul__(self, other): return static_node(operator.mul, (self, other))
    def __rmul__(self, other): return static_node(operator.mul, (other, self))
    def __truediv__(self, other): return static_node(operator.truediv, (self, other))
    def __rtruediv__(self, other): return static_node(operator.truediv, (other, self))
    def __pow__(self, other): return static_node(operator.pow, (self, other))
    def __matmul__(self, other): return static_node(operator.matmul, (self, other))
    def __neg__(self): return static_node(operator.neg, (self,))

    # Nodes are used as dict keys by identity; never compare them elementwise.
    __hash__ = object.__hash__


class Source(Node):
    """A node holding data: the entry point of a network.  ``rebind`` swaps the data."""

    kind = "source"

    def __init__(self, data: object, name: str | None = None) -> None:
        super().__init__(None, (), name=name)
        self.data = data

    def default_name(self) -> str:
        """Sources are called ``source`` unless named (made unique within a network)."""
        return "source"

    def rebind(self, data: object) -> Source:
        """Hold ``data`` from now on; machines depending on this source retrain at next fit.

        Example::

            >>> y = Source([1, 2, 3]); _ = y.rebind([4, 5, 6]); y()
            [4, 5, 6]
        """
        self.data = data
        return self

    def __call__(self, *new_data: Any, rows: Any = None) -> Any:
        if new_data:
            return new_data[0]
        return select_rows(self.data, rows)


class Machine:
    """An estimator bound to its training arguments, with the state of its last fit.

    ``.model`` is the estimator you tune; fits run on clones of it, so it stays unfitted and
    ``.fitted`` holds the trained copy.  ``fit_runner`` (optional) replaces the default
    ``clone.fit(*inputs)`` for models trained by other machinery, such as a data-parallel
    fit across the engines: it is called in the kernel as
    ``fit_runner(estimator, *inputs, cluster=cluster)`` and returns the fitted estimator.
    With ``cache`` (the default) the machine keeps its last training inputs (in the kernel, or
    on the workers for cluster fits), so a refit after a hyperparameter change does not
    recompute anything upstream.
    """

    def __init__(self, model: Any, args: tuple, name: str | None = None,
                 fit_runner: Callable | None = None, cache: bool = True) -> None:
        if not hasattr(model, "fit") and fit_runner is None:
            raise NetworkError(f"machine {name or type(model).__name__!r}: "
                               f"{type(model).__name__} has no fit method")
        self._model = model
        self.args = tuple(a if isinstance(a, Node) else Source(a) for a in args)
        self.fit_runner = fit_runner
        self.cache = cache
        self._inputs: tuple[str, list] | None = None   # (backend token, input handles)
        self.frozen = False
        self.uid = uuid.uuid4().hex
        self._name = name
        self._auto_name: str | None = None
        self._methods: set[str] = set()
        self._state = MachineState()

    @property
    def name(self) -> str:
        """The machine's name: given, or the estimator class made unique within its network."""
        return self._name or self._auto_name or self.default_name()

    def default_name(self) -> str:
        """The estimator's class name (made unique within a network)."""
        return type(self._model).__name__

    @property
    def model(self) -> Any:
        """The estimator whose hyperparameters you tune (it is never fitted in place)."""
        return self._model

    @model.setter
    def model(self, new_model: Any) -> None:
        for method in self._methods:
            _require_method(self, new_model, method)
        self._model = new_model

    @property
    def fitted(self) -> Any:
        """The estimator trained by the last successful fit, or ``None``."""
        return self._state.fitted

    @property
    def status(self) -> str:
        """``"fresh"`` (never trained), ``"fitted"`` or ``"failed"`` (last attempt raised)."""
        return self._state.status

    def freeze(self) -> Machine:
        """Keep the current fit: once trained, later fits skip this machine."""
        self.frozen = True
        return self

    def thaw(self) -> Machine:
        """Undo :meth:`freeze`."""
        self.frozen = False
        return self

    def fit(self, rows: Rows = None, force: bool = False, cluster: ClusterArg | None = None,
            on_event: Callable[[dict], None] | None = None) -> FitLog:
        """Fit this machine and what it depends on (see :meth:`Node.fit`)."""
        return hooks().fit([self], rows=rows, force=force, cluster=cluster, on_event=on_event)

    # --- operations -----------------------------------------------------------------------------
    def operation(self, method: str, *args: Any) -> Any:
        """A node computing ``fitted.<method>(*args)``; with no node among ``args``, the value.

        Example::

            >>> import numpy as np
            >>> from sklearn.decomposition import PCA
            >>> from phalanx.network import machine, source
            >>> W = source(np.arange(12.0).reshape(4, 3), name="W")
            >>> pca = machine(PCA(2), W, name="pca")
            >>> Z = pca.operation("transform", W)   # same as pca.transform(W)
            >>> Z
            <Node 'pca.transform(...)'>
            >>> _ = Z.fit()
            >>> pca.operation("transform", np.zeros((1, 3))).shape   # not a node: the value
            (1, 2)
        """
        _require_method(self, self._model, method)
        if not any(isinstance(a, Node) for a in args):
            if self.fitted is None:
                raise NetworkError(f"machine {self.name!r} is not trained yet")
            return getattr(self.fitted, method)(*args)
        self._methods.add(method)
        return Node(None, args, machine=self, method=method)

    def transform(self, *args: Any) -> Any:
        """Node for ``transform``."""
        return self.operation("transform", *args)

    def predict(self, *args: Any) -> Any:
        """Node for ``predict``."""
        return self.operation("predict", *args)

    def inverse_transform(self, *args: Any) -> Any:
        """Node for ``inverse_transform``."""
        return self.operation("inverse_transform", *args)

    def predict_proba(self, *args: Any) -> Any:
        """Node for ``predict_proba``."""
        return self.operation("predict_proba", *args)

    def predict_log_proba(self, *args: Any) -> Any:
        """Node for ``predict_log_proba``."""
        return self.operation("predict_log_proba", *args)

    def decision_function(self, *args: Any) -> Any:
        """Node for ``decision_function``."""
        return self.operation("decision_function", *args)

    def _adopt(self, old: Machine) -> None:
        """Take over ``old``'s identity and fit state (used when a network is rebuilt)."""
        self.uid = old.uid
        self._state = old._state
        self._inputs = old._inputs

    def __getstate__(self) -> dict:
        # Cached inputs are data (or futures bound to a live cluster): never pickle them.
        return {**self.__dict__, "_inputs": None}

    def __repr__(self) -> str:
        return f"<Machine {self.name!r} {type(self._model).__name__} {self.status}>"

    def _repr_html_(self) -> str:
        return hooks().draw(self)


class _NoData:
    """Marker: a node was called without new data."""


_NO_DATA = _NoData()


def _require_method(m: Machine, model: object, method: str) -> None:
    if not hasattr(model, method):
        raise NetworkError(f"machine {m.name!r}: {type(model).__name__} has no method "
                           f"{method!r}")


def static_node(fn: Callable, args: tuple, name: str | None = None) -> Node:
    """A static node computing ``fn(*args)``, refused at once when it could not be shipped."""
    n = Node(fn, args, name=name)
    _check_shippable(n)
    return n


def _check_shippable(n: Node) -> None:
    import cloudpickle

    try:
        cloudpickle.dumps((n.fn, [a for a in n.args if not isinstance(a, Node)]))
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
        code = getattr(n.fn, "__code__", None)
        where = f" (defined at {code.co_filename}:{code.co_firstlineno})" if code else ""
        raise NetworkError(
            f"static node {n.name!r}{where} cannot be shipped to engines: "
            f"{type(exc).__name__}: {exc}") from exc


@dataclass
class Closure:
    """Everything reachable from some nodes through operation edges, in discovery order."""

    nodes: list[Node] = field(default_factory=list)
    machines: list[Machine] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)


def operation_closure(roots: Iterable[object]) -> Closure:
    """Nodes, machines and sources that the values of ``roots`` (constants ignored) come from."""
    out, seen, seen_m = Closure(), set(), set()
    stack = list(reversed([r for r in roots if isinstance(r, Node)]))
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        out.nodes.append(n)
        if isinstance(n, Source):
            out.sources.append(n)
        if n.machine is not None and id(n.machine) not in seen_m:
            seen_m.add(id(n.machine))
            out.machines.append(n.machine)
        stack.extend(reversed([a for a in n.args if isinstance(a, Node)]))
    return out
