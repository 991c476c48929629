"""Carry out a fit plan, serially in the kernel or on a cluster, and call nodes.

The plan's machines become tasks on a *backend*: :class:`SerialBackend` runs them lazily in
the kernel (the reference, and what calling a node uses); the dask backend in :mod:`._dask`
runs them on the engines.  The same wiring code turns nodes into tasks for both, so a shared
upstream output is one task, computed once per fit however many machines consume it.

Example::

    >>> import numpy as np
    >>> from sklearn.linear_model import Ridge
    >>> from phalanx.network import source, machine
    >>> X, y = source(np.arange(8.0).reshape(4, 2), name="X"), source(np.arange(4.0), name="y")
    >>> r = machine(Ridge(), X, y, name="r")
    >>> fit_network([r]).actions
    {'r': 'fit'}
    >>> fit_network([r]).actions
    {'r': 'skip'}
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from ._errors import MachineFitError, NetworkError
from ._events import Reporter
from ._fingerprint import select_rows
from ._fitlog import FitLog
from ._graph import _NO_DATA, Machine, Node, Source, operation_closure
from ._plan import FitPlan, Step, make_plan
from ._retrain_rules import UPDATE, MachineState, changed_params
from ._tasks import FitResult, apply_task, call_task, fit_task, runner_task, update_task
from ._topology import Network

if TYPE_CHECKING:
    from ._dask import ClusterArg
    from ._fingerprint import Rows

H = TypeVar("H")   # a backend's task handle
M = TypeVar("M")   # a model


def fit_network(targets: Sequence[Node | Machine], rows: Rows = None, force: bool = False,
                cluster: ClusterArg | None = None,
                on_event: Callable[[dict], None] | None = None) -> FitLog:
    """Plan and run a fit of everything ``targets`` depend on (see ``Node.fit``)."""
    network = Network(targets)
    plan = make_plan(network, rows=rows, force=force)
    if cluster is None:
        return run_plan(plan, SerialBackend(), Reporter(network, on_event), cluster)
    from ._dask import DaskBackend

    return run_plan(plan, DaskBackend(cluster), Reporter(network, on_event), cluster)


def run_plan(plan: FitPlan, backend: Backend[H], reporter: Reporter,
             cluster: ClusterArg | None = None) -> FitLog:
    """Submit the plan's fits to ``backend``, collect results, update machines, log."""
    started = time.perf_counter()
    reporter.begin(plan)
    outcomes = _execute(plan, backend, reporter, cluster)
    log = commit(plan, outcomes)
    log.backend, log.wall_s = backend.name, time.perf_counter() - started
    reporter.end(log)
    if log.failed:
        first = next(iter(log.failed.values()))
        raise MachineFitError(log.failed, log.cancelled, log) from first
    return log


def _execute(plan: FitPlan, backend: Backend[H], reporter: Reporter, cluster: ClusterArg | None
             ) -> dict[Machine, tuple[BaseException | None, object]]:
    # Task handles live only in this frame: once it returns, intermediate results on the
    # workers are released, even if the caller keeps the MachineFitError and its traceback.
    wiring = Wiring(backend, plan.rows)
    by_handle: dict[H, Step] = {}
    inputs: dict[Machine, list[H]] = {}
    for step in plan.to_run:
        inputs[step.machine] = _inputs(step, wiring, backend)
        handle = _submit_fit(step, inputs[step.machine], backend, cluster)
        wiring.fits[step.machine] = handle
        by_handle[handle] = step
    deps = {h: [wiring.fits[u] for u in plan.network.upstream[s.machine] if u in wiring.fits]
            for h, s in by_handle.items()}
    outcomes: dict[Machine, tuple[BaseException | None, object]] = {}
    for handle, error, value in backend.as_completed(
            list(by_handle), deps, on_start=lambda h: reporter.fitting(by_handle[h].name)):
        step = by_handle[handle]
        outcomes[step.machine] = (error, value)
        reporter.finished(step.name, error, value)
        if error is None and step.machine.cache:
            kept = [backend.keep(h) for h in inputs[step.machine]]
            step.machine._inputs = (backend.token, kept)
    return outcomes


def _inputs(step: Step, wiring: Wiring[H], backend: Backend[H]) -> list[H]:
    cached = step.machine._inputs
    if (step.reuse_inputs and cached is not None and cached[0] == backend.token
            and backend.valid(cached[1])):
        return cached[1]
    return [wiring.node(a) for a in step.machine.args]


def _submit_fit(step: Step, inputs: list[H], backend: Backend[H], cluster: ClusterArg | None
                ) -> H:
    m = step.machine
    if step.action == UPDATE:
        assert m._state.record is not None   # an update is only decided against a last fit
        estimator = backend.own(m.fitted)
        model_params = m.model.get_params(deep=False)
        params = {k: model_params[k] for k in changed_params(m._state.record, step.record)}
    else:
        estimator, params = clone_model(m.model), None
    if m.fit_runner is not None:
        if params:
            estimator.set_params(**params)
        return backend.local(runner_task, m.fit_runner, estimator, cluster, *inputs,
                             key=f"{step.name}-fit")
    if params is not None:
        return backend.submit(update_task, estimator, params, *inputs, key=f"{step.name}-update")
    return backend.submit(fit_task, estimator, *inputs, key=f"{step.name}-fit")


def commit(plan: FitPlan,
           outcomes: dict[Machine, tuple[BaseException | None, object]]) -> FitLog:
    """Apply fit outcomes to machines in training order and build the :class:`FitLog`.

    A failed machine keeps its previous fit (only its status says it failed); machines whose
    failure comes from upstream are *cancelled* and keep everything.
    """
    log, broken = FitLog(), set()
    for step in plan.steps:
        m, name = step.machine, step.name
        log.actions[name], log.reasons[name], log.times[name] = step.action, step.reason, 0.0
        if not step.runs:
            if m._state.status == "failed":
                # The failed attempt is moot: the previous fit matches the settings again.
                m._state = copy.copy(m._state)
                m._state.status, m._state.error = "fitted", None
            continue
        error, result = outcomes.get(m, (NetworkError("fit did not run"), None))
        if error is not None:
            broken.add(m)
            if any(up in broken for up in plan.network.upstream[m]):
                log.cancelled.append(name)
            else:
                log.failed[name] = error
                m._state = copy.copy(m._state)
                m._state.status, m._state.error = "failed", error
            continue
        assert isinstance(result, FitResult)   # what a fit task returns
        upstream = {up.uid: up._state.n_results for up in plan.network.upstream[m]}
        m._state = MachineState(
            fitted=result.estimator, n_results=m._state.n_results + 1,
            record=step.record.with_upstream(upstream), status="fitted",
            last_action=step.action, fit_time_s=result.ended - result.started)
        log.times[name] = result.ended - result.started
        log.spans[name] = (result.started, result.ended)
        log.workers[name] = result.worker
    return log


def evaluate(target: Node, rows: Rows = None, new_data: object = _NO_DATA) -> object:
    """Compute ``target`` in the kernel with the machines' current fits."""
    Network([target])   # resolves default names, so errors name machines as fit logs do
    closure = operation_closure([target])
    for m in closure.machines:
        if m.fitted is None:
            raise NetworkError(f"machine {m.name!r} is not trained yet; call .fit() on "
                               f"{target.name!r} first")
    overrides: dict[Source, object] = {}
    if new_data is not _NO_DATA:
        if len(closure.sources) != 1:
            names = ", ".join(repr(s.name) for s in closure.sources) or "none"
            raise NetworkError(f"{target.name!r}(X_new) needs a network with exactly one "
                               f"origin; it has {len(closure.sources)}: {names}")
        overrides[closure.sources[0]] = new_data
    backend = SerialBackend()
    return backend.result(Wiring(backend, rows, overrides=overrides).node(target))


def clone_model(model: M) -> M:
    """An unfitted copy of ``model`` (sklearn ``clone``; a deep copy for other models)."""
    if hasattr(model, "get_params"):
        from sklearn.base import clone

        return clone(model)
    return copy.deepcopy(model)


class Wiring(Generic[H]):
    """Turns nodes into backend tasks, one task per node (memoised)."""

    def __init__(self, backend: Backend[H], rows: Rows,
                 overrides: dict[Source, object] | None = None) -> None:
        self.backend = backend
        self.rows = rows
        self.overrides = overrides or {}
        self.fits: dict[Machine, H] = {}
        self._fitted: dict[Machine, H] = {}
        self._memo: dict[Node, H] = {}

    def handle(self, n: object) -> H | object:
        """The task computing node ``n`` (constants pass through unchanged)."""
        if not isinstance(n, Node):
            return n
        return self.node(n)

    def node(self, n: Node) -> H:
        """The task computing node ``n``."""
        if n not in self._memo:
            self._memo[n] = self._make(n)
        return self._memo[n]

    def _make(self, n: Node) -> H:
        if isinstance(n, Source):
            if n in self.overrides:
                return self.backend.put(self.overrides[n])
            return self.backend.put(select_rows(n.data, self.rows))
        args = [self.handle(a) for a in n.args]
        if n.machine is None:
            return self.backend.submit(call_task, n.fn, *args, key=n.name)
        return self.backend.submit(apply_task, self._estimator(n.machine), n.method, *args,
                                   key=f"{n.machine.name}-{n.method}")

    def _estimator(self, m: Machine) -> H:
        if m in self.fits:
            return self.fits[m]
        if m not in self._fitted:
            self._fitted[m] = self.backend.put(m.fitted)
        return self._fitted[m]


class Backend(Protocol[H]):
    """Where tasks run.  Handles are opaque: thunks in the kernel, dask futures on a cluster."""

    name: str    # shown in the FitLog
    token: str   # cached input handles are reusable by a backend with the same token

    def put(self, value: object) -> H:
        """A handle holding ``value`` (data shipped where tasks run)."""

    def submit(self, fn: Callable[..., object], *args: object, key: str = "") -> H:
        """A handle for ``fn(*args)``; handle arguments are replaced by their values."""

    def local(self, fn: Callable[..., object], *args: object, key: str = "") -> H:
        """Like :meth:`submit`, but ``fn`` runs in the kernel (a ``fit_runner``)."""

    def own(self, obj: M) -> M:
        """``obj`` as a task may mutate it (a copy unless shipping copies anyway)."""

    def keep(self, handle: H) -> H:
        """A handle safe to keep between fits: it retains its value and nothing upstream."""

    def valid(self, handles: list[H]) -> bool:
        """Whether kept handles can still be used."""

    def result(self, handle: H) -> object:
        """The value of ``handle``, raising its error."""

    def as_completed(self, handles: list[H], deps: dict[H, list[H]], on_start: Callable[[H], None]
                     ) -> Iterator[tuple[H, BaseException | None, object]]:
        """``(handle, error, value)`` as fit handles finish; ``on_start(handle)`` when each
        starts (``deps`` maps a handle to the fit handles it waits for)."""


class _Thunk:
    """A lazily computed serial task."""

    __slots__ = ("args", "done", "error", "fn", "value")

    def __init__(self, fn: Callable | None, args: tuple) -> None:
        self.fn, self.args = fn, args
        self.done = fn is None   # a thunk without a function holds a value from the start
        self.value: object = None
        self.error: BaseException | None = None


class SerialBackend:
    """The :class:`Backend` of the kernel: tasks run lazily in dependency order when a result
    is asked for, and errors flow downstream without running anything."""

    name = "serial"
    token = "serial"   # kept inputs are plain values, valid for any serial fit

    def put(self, value: object) -> _Thunk:
        t = _Thunk(None, ())
        t.value = value
        return t

    def submit(self, fn: Callable[..., object], *args: object, key: str = "") -> _Thunk:
        return _Thunk(fn, args)

    local = submit  # "run in the kernel" is what this backend always does

    def own(self, obj: M) -> M:
        # The task mutates what it gets; the machine must keep its previous fit if it fails.
        return copy.deepcopy(obj)

    def keep(self, t: _Thunk) -> _Thunk:
        # Only the value: the thunk itself would also hold its arguments and all data upstream.
        return self.put(t.value)

    def valid(self, handles: list[_Thunk]) -> bool:
        return True

    def result(self, t: _Thunk) -> object:
        self._run(t)
        if t.error is not None:
            raise t.error
        return t.value

    def as_completed(self, handles: list[_Thunk], deps: dict[_Thunk, list[_Thunk]],
                     on_start: Callable[[_Thunk], None]
                     ) -> Iterator[tuple[_Thunk, BaseException | None, object]]:
        for h in handles:  # handles come in training order, so this is a valid order
            self._run(h, before=functools.partial(on_start, h))
            yield h, h.error, h.value

    def _run(self, t: _Thunk, before: Callable[[], None] | None = None) -> None:
        if t.done:
            return
        values = []
        for a in t.args:
            if isinstance(a, _Thunk):
                self._run(a)
                if a.error is not None:
                    t.error, t.done = a.error, True
                    return
                a = a.value
            values.append(a)
        if before is not None:
            before()
        assert t.fn is not None   # only value thunks have none, and they are done
        try:
            t.value = t.fn(*values)
        except Exception as exc:  # noqa: BLE001 - recorded and reported per machine
            t.error = exc
        t.done = True
