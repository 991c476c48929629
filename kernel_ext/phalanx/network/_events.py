"""Node states of a network as :mod:`phalanx.events` ``network`` events.

A :class:`Reporter` follows one fit and calls ``on_event`` with a full
:func:`phalanx.events.network_state` dict whenever a node changes state (queued, fitting,
fitted, failed).  :func:`network_event` describes a network at rest, for a view that attaches
late or for the notebook drawing.

Example::

    >>> import numpy as np
    >>> from sklearn.linear_model import Ridge
    >>> from phalanx.network import source, machine
    >>> X, y = source(np.ones((3, 1)), name="X"), source(np.arange(3.0), name="y")
    >>> r = machine(Ridge(), X, y, name="r")
    >>> ev = network_event(r.predict(X))
    >>> [(n["id"], n["state"]) for n in ev["nodes"]]
    [('X', 'fitted'), ('y', 'fitted'), ('r', 'fresh')]
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..events import network_state
from ._graph import operation_closure
from ._plan import make_plan
from ._topology import Network

if TYPE_CHECKING:
    from ._fitlog import FitLog
    from ._graph import Machine, Node, Source
    from ._plan import FitPlan

log = logging.getLogger("phalanx")

# Worst first: a static node shows the worst state among the machines it is computed from.
_SEVERITY = ("failed", "fitting", "queued", "stale", "fresh", "fitted")


def network_event(target: Node | Machine, network_id: str | None = None) -> dict:
    """A ``network`` event describing ``target``'s network now (stale machines marked).

    Example::

        >>> import numpy as np
        >>> from sklearn.linear_model import Ridge
        >>> from phalanx.network import machine, source
        >>> X, y = source(np.ones((4, 2)), name="X"), source(np.arange(4.0), name="y")
        >>> yhat = machine(Ridge(), X, y, name="ridge").predict(X)
        >>> event = network_event(yhat)
        >>> event["type"], [node["state"] for node in event["nodes"]]
        ('network', ['fitted', 'fitted', 'fresh'])
    """
    network = Network([target])
    plan = make_plan(network, preview=True)
    states = {s.name: _rest_state(s.machine, s.runs) for s in plan.steps}
    return describe(network, states, network_id)


def describe(network: Network, states: dict[str, str], network_id: str | None = None) -> dict:
    """The ``network`` event for ``network`` with machine ``states`` (by machine name)."""
    nodes = [_source_dict(s) for s in network.sources]
    nodes += [_machine_dict(m, states.get(m.name, _rest_state(m, False)))
              for m in network.machines]
    for s in network.statics:
        ups = operation_closure(s.args).machines
        state = _worst([states.get(m.name, _rest_state(m, False)) for m in ups])
        nodes.append(_node_dict(s.name, s.name, "static", state))
    name = network_id or _target_name(network)
    return network_state(name, nodes, network.edges())


class Reporter:
    """Emits a ``network`` event each time a machine's state changes during a fit."""

    def __init__(self, network: Network, on_event: Callable[[dict], None] | None,
                 network_id: str | None = None) -> None:
        self.network, self.on_event, self.network_id = network, on_event, network_id
        self.states: dict[str, str] = {}
        self._by_name = {m.name: m for m in network.machines}

    def begin(self, plan: FitPlan) -> None:
        """Machines that will train are queued; the rest show their resting state."""
        for step in plan.steps:
            self.states[step.name] = "queued" if step.runs else _rest_state(step.machine, False)
        self._emit()

    def fitting(self, name: str) -> None:
        """``name`` started training."""
        self._set(name, "fitting")

    def finished(self, name: str, error: BaseException | None, value: object) -> None:
        """``name`` finished (``error`` set when it, or something upstream, failed)."""
        if error is None:
            self._set(name, "fitted")
            return
        machine = self._by_name.get(name)
        ups = [] if machine is None else self.network.upstream.get(machine, [])
        cancelled = any(self.states.get(up.name) in ("failed", "stale") for up in ups)
        self._set(name, "stale" if cancelled else "failed")

    def end(self, log: FitLog) -> None:
        """Final states: cancelled machines go back to stale, nothing is left in flight."""
        for m in self.network.machines:
            if m.name in log.cancelled or self.states.get(m.name) in ("queued", "fitting"):
                self.states[m.name] = _rest_state(m, True)
        self._emit()

    def _set(self, name: str, state: str) -> None:
        if self.states.get(name) != state:
            self.states[name] = state
            self._emit()

    def _emit(self) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(describe(self.network, self.states, self.network_id))
        except Exception:  # noqa: BLE001 - a broken view must never break a fit
            log.exception("network event callback failed; the fit goes on")


def _rest_state(m: Machine, would_run: bool) -> str:
    if m.status == "failed":
        return "failed"
    if m.fitted is None:
        return "fresh"
    return "stale" if would_run else "fitted"


def _worst(states: list[str]) -> str:
    for s in _SEVERITY:
        if s in states:
            return s
    return "fitted"


def _target_name(network: Network) -> str:
    target = network.targets[0] if network.targets else None
    return getattr(target, "name", "network")


def _source_dict(s: Source) -> dict:
    return _node_dict(s.name, s.name, "source", "fresh" if s.data is None else "fitted")


def _machine_dict(m: Machine, state: str) -> dict:
    d = _node_dict(m.name, m.name, "machine", state)
    d.update(fit_time_s=m._state.fit_time_s, estimator=type(m.model).__name__,
             params=_short_params(m.model), last_action=m._state.last_action)
    return d


def _node_dict(id_: str, label: str, kind: str, state: str) -> dict:
    return {"id": id_, "label": label, "kind": kind, "state": state, "fit_time_s": None,
            "estimator": None, "params": {}, "last_action": None}


def _short_params(model: object) -> dict[str, str]:
    if not hasattr(model, "get_params"):
        return {}
    out = {}
    for key, value in model.get_params(deep=False).items():
        text = repr(value)
        out[key] = text if len(text) <= 40 else text[:37] + "..."
    return out
