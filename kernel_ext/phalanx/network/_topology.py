"""The shape of a learning network: which machines, sources and nodes it holds, in what order.

Two kinds of edges matter.  *Operation* edges carry values: a node's arguments and, for
``m.predict(Z)``, the machine ``m``.  *Training* edges bind a machine to its training
arguments.  A machine's fit depends on the machines and sources in the operation closure of
its training arguments (a frozen machine's own training data does not reach downstream).

Example::

    >>> import numpy as np
    >>> from sklearn.preprocessing import StandardScaler
    >>> from phalanx.network import source, machine
    >>> X = source(np.ones((2, 2)), name="X")
    >>> s = machine(StandardScaler(), X, name="s")
    >>> net = Network([s.transform(X)])
    >>> [m.name for m in net.machines], [x.name for x in net.sources]
    (['s'], ['X'])
"""

from __future__ import annotations

from collections.abc import Sequence

from ._errors import NetworkError
from ._graph import Closure, Machine, Node, Source, operation_closure


class Network:
    """A resolved view of the network behind some target nodes or machines.

    Holds machines in training order (upstream first), their training dependencies, every
    node, and unique names for sources, machines and static nodes.
    """

    def __init__(self, targets: Sequence[Node | Machine]) -> None:
        self.targets = list(targets)
        self.upstream: dict[Machine, list[Machine]] = {}
        self.data_sources: dict[Machine, list[Source]] = {}
        self.nodes: list[Node] = []
        self._collect()
        self.machines = self._training_order()
        self.sources = [n for n in self.nodes if isinstance(n, Source)]
        self.statics = [n for n in self.nodes if n.kind == "static"]
        self._resolve_names()

    def _collect(self) -> None:
        seen_nodes: set[int] = set()
        roots = [t for t in self.targets if isinstance(t, Node)]
        pending = [t for t in self.targets if isinstance(t, Machine)]
        self._found: list[Machine] = []
        self._add_nodes(operation_closure(roots), seen_nodes, pending)
        while pending:
            m = pending.pop(0)
            if m in self.upstream:
                continue
            self._found.append(m)
            closure = operation_closure(m.args)
            self.upstream[m] = closure.machines
            self.data_sources[m] = closure.sources
            self._add_nodes(closure, seen_nodes, pending)

    def _add_nodes(self, closure: Closure, seen: set[int], pending: list[Machine]) -> None:
        for n in closure.nodes:
            if id(n) not in seen:
                seen.add(id(n))
                self.nodes.append(n)
        pending.extend(m for m in closure.machines if m not in self.upstream)

    def _training_order(self) -> list[Machine]:
        order: list[Machine] = []
        done: set[Machine] = set()

        def visit(m: Machine) -> None:
            # Training dependencies form a DAG by construction (a node can only use machines
            # that already exist), so plain depth-first post-order is a topological order.
            if m in done:
                return
            done.add(m)
            for up in self.upstream[m]:
                visit(up)
            order.append(m)

        for m in self._found:
            visit(m)
        return order

    def _resolve_names(self) -> None:
        named: list[Node | Machine] = [*self.sources, *self.machines, *self.statics]
        taken: dict[str, object] = {}
        for obj in named:
            if obj._name is None:
                continue
            if obj._name in taken:
                raise NetworkError(f"two parts of this network are named {obj._name!r}")
            taken[obj._name] = obj
        for obj in named:
            if obj._name is not None:
                continue
            pinned = obj._auto_name
            if pinned is not None and pinned not in taken:
                taken[pinned] = obj
                continue
            obj._auto_name = _free_name(obj.default_name(), taken)
            taken[obj._auto_name] = obj

    # --- queries --------------------------------------------------------------------------------
    def downstream(self, m: Machine) -> list[Machine]:
        """Machines whose training depends, directly or not, on ``m``."""
        hit = {m}
        for other in self.machines:
            if any(up in hit for up in self.upstream[other]):
                hit.add(other)
        return [x for x in self.machines if x in hit and x is not m]

    def operations(self, m: Machine) -> list[Node]:
        """The nodes of this network computed by machine ``m``."""
        return [n for n in self.nodes if n.machine is m]

    def edges(self) -> list[tuple[str, str]]:
        """Drawing edges ``(producer name, consumer name)``; operations fold into machines."""
        out: list[tuple[str, str]] = []
        for m in self.machines:
            for arg in (*m.args, *[a for op in self.operations(m) for a in op.args]):
                out.extend((p, m.name) for p in _producers(arg))
        for s in self.statics:
            for arg in s.args:
                out.extend((p, s.name) for p in _producers(arg))
        return list(dict.fromkeys(out))


def _producers(arg: object) -> list[str]:
    if not isinstance(arg, Node):
        return []
    if arg.machine is not None:
        return [arg.machine.name]
    return [arg.name]


def _free_name(base: str, taken: dict[str, object]) -> str:
    if base not in taken:
        return base
    k = 2
    while f"{base}{k}" in taken:
        k += 1
    return f"{base}{k}"
