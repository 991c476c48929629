"""A fit plan: the retraining decision for every machine of a network, before anything runs.

Decisions are taken in training order, so a machine knows whether something upstream of it
will produce a new result in this same fit.  Source contents are hashed once per plan.

Example::

    >>> import numpy as np
    >>> from sklearn.linear_model import Ridge
    >>> from phalanx.network import source, machine
    >>> from phalanx.network._topology import Network
    >>> X, y = source(np.ones((3, 1)), name="X"), source(np.arange(3.0), name="y")
    >>> r = machine(Ridge(), X, y, name="r")
    >>> [(s.name, s.action, s.reason) for s in make_plan(Network([r.predict(X)])).steps]
    [('r', 'fit', 'never trained')]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._errors import NetworkError
from ._fingerprint import fingerprint, n_rows, param_fingerprints, rows_fingerprint, scalar_params
from ._graph import Machine, Node, Source, operation_closure
from ._retrain_rules import FIT, SKIP, UPDATE, FitRecord, decide, same_inputs
from ._topology import Network

if TYPE_CHECKING:
    from ._fingerprint import Rows


@dataclass(frozen=True)
class Step:
    """One machine's part in a fit."""

    machine: Machine
    name: str
    action: str
    reason: str
    record: FitRecord
    reuse_inputs: bool = False   # training inputs are those of the last fit: use its cache

    @property
    def runs(self) -> bool:
        """Whether this step trains anything."""
        return self.action in (FIT, UPDATE)


@dataclass(frozen=True)
class FitPlan:
    """Steps for every machine of ``network``, upstream first."""

    network: Network
    steps: tuple[Step, ...]
    rows: Rows = None

    @property
    def to_run(self) -> list[Step]:
        """Steps that fit or update, in training order."""
        return [s for s in self.steps if s.runs]

    def step(self, m: Machine) -> Step:
        """The step of machine ``m``."""
        return next(s for s in self.steps if s.machine is m)


def make_plan(network: Network, rows: Rows = None, force: bool = False,
              preview: bool = False) -> FitPlan:
    """Decide what each machine of ``network`` does in a fit with ``rows`` and ``force``.

    ``preview`` ignores rows (a drawing does not know which rows the next fit will use) and
    skips the length check.
    """
    data = {s.uid: fingerprint(s.data) for s in network.sources}
    rows_fp = rows_fingerprint(rows)
    named: list[Source | Machine] = [*network.sources, *network.machines]
    names = {x.uid: x.name for x in named}
    steps: list[Step] = []
    running: set[Machine] = set()
    for m in network.machines:
        current = current_record(network, m, data, rows_fp)
        refitting = [up.name for up in network.upstream[m] if up in running]
        d = decide(m._state, current, frozen=m.frozen, force=force,
                   refitting_upstream=refitting, names=names, ignore_rows=preview)
        if d.action != SKIP:
            running.add(m)
            if not preview:
                check_lengths(network, m)
        reuse = not refitting and same_inputs(m._state.record, current)
        steps.append(Step(m, m.name, d.action, d.reason, current, reuse))
    return FitPlan(network, tuple(steps), rows)


def current_record(network: Network, m: Machine, data: dict[str, str], rows_fp: str
                   ) -> FitRecord:
    """The record ``m`` would store if it were fitted now."""
    model = m.model
    return FitRecord(
        model_type=f"{type(model).__module__}.{type(model).__qualname__}",
        params=param_fingerprints(model),
        scalars=scalar_params(model),
        upstream={up.uid: up._state.n_results for up in network.upstream[m]},
        data={s.uid: data[s.uid] for s in network.data_sources[m]},
        rows=rows_fp,
        structure=training_structure(m),
    )


def training_structure(m: Machine) -> str:
    """Fingerprint of how ``m``'s training data is computed, free of node identities.

    Nodes are described by position, static functions and constants by content, machines and
    sources by uid (stable across a rebuilt network that adopted the old machines), so a
    rebuilt identical graph gives the same fingerprint and a changed function does not.
    """
    closure = operation_closure(m.args)
    index = {n: i for i, n in enumerate(closure.nodes)}

    def ref(a: object) -> object:
        return ("node", index[a]) if isinstance(a, Node) else ("const", fingerprint(a))

    parts: list[object] = [[ref(a) for a in m.args]]
    for n in closure.nodes:
        if n.kind == "source":
            parts.append(("source", n.uid))
        elif n.machine is not None:
            parts.append(("op", n.machine.uid, n.method, [ref(a) for a in n.args]))
        else:
            parts.append(("static", fingerprint(n.fn), [ref(a) for a in n.args]))
    return fingerprint(parts)


def check_lengths(network: Network, m: Machine) -> None:
    """Raise when sources of different lengths reach ``m``'s training data."""
    sized = [(s, n_rows(s.data)) for s in network.data_sources[m]]
    sized = [(s, n) for s, n in sized if n is not None]
    for s, n in sized[1:]:
        first, n0 = sized[0]
        if n != n0:
            raise NetworkError(
                f"machine {m.name!r}: its training data comes from sources of different "
                f"lengths: {first.name!r} has {n0} rows, {s.name!r} has {n} rows")
