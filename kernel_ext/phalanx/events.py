"""The one event schema shared by the notebook widgets and the JupyterLab panel.

Every event is a plain JSON-able dict ``{"v": SCHEMA_VERSION, "type": <type>, ...fields}``.
The kernel emits them on the session's event bus; the notebook widgets render them and the
lab panel receives them over the ``phalanx`` comm.  Messages from the panel to the kernel are
*requests* (also listed here) and never contain code.

Both ends validate: :func:`validate_event` and :func:`validate_request` raise
:class:`SchemaError` with a message naming the offending field, so a bad message is logged and
dropped instead of crashing anything.

Example::

    >>> ev = cluster_state(engines=[], max_engines=8)
    >>> validate_event(ev)["type"]
    'cluster'
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

SCHEMA_VERSION = 1
COMM_TARGET = "phalanx"

# Node states of a learning network, in the order a fit walks through them.
NODE_STATES = ("fresh", "stale", "queued", "fitting", "fitted", "failed")
ENGINE_STATES = ("starting", "idle", "busy", "dead", "stopping")
RUN_STATES = ("running", "done", "failed", "interrupted", "timeout")
# A zoomed chart asks for at most this many points per line (one answer stays a few MB).
MAX_WINDOW_POINTS = 100_000


class SchemaError(ValueError):
    """A message that does not fit the schema."""


# --- field checks -----------------------------------------------------------------------------

_NUM = (int, float)


def _need(msg: Mapping[str, Any], key: str, types: type | tuple, where: str) -> Any:
    if key not in msg:
        raise SchemaError(f"{where}: missing field {key!r}")
    value = msg[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise SchemaError(f"{where}: field {key!r} must be {_names(types)}, got bool")
    if not isinstance(value, types):
        raise SchemaError(f"{where}: field {key!r} must be {_names(types)}, got {type(value).__name__}")
    return value


def _names(types: type | tuple) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ if t is not type(None) else "null" for t in types)


def _opt_num(msg: Mapping[str, Any], key: str, where: str) -> None:
    if msg.get(key) is not None:
        _need(msg, key, _NUM, where)


def _check_engine(e: Any, where: str) -> None:
    if not isinstance(e, Mapping):
        raise SchemaError(f"{where}: engine entry must be an object")
    _need(e, "rank", int, where)
    _need(e, "engine_id", int, where)
    _need(e, "host", str, where)
    state = _need(e, "state", str, where)
    if state not in ENGINE_STATES:
        raise SchemaError(f"{where}: engine state {state!r} not one of {ENGINE_STATES}")
    for key in ("memory_mb", "step", "pid", "cuda_allocated_mb", "cuda_reserved_mb", "cuda_peak_mb"):
        _opt_num(e, key, where)


def _check_rank_progress(p: Any, where: str) -> None:
    if not isinstance(p, Mapping):
        raise SchemaError(f"{where}: rank progress must be an object")
    _need(p, "rank", int, where)
    _need(p, "step", int, where)
    for key in ("total", "steps_per_s", "eta_s"):
        _opt_num(p, key, where)
    if not isinstance(p.get("metrics", {}), Mapping):
        raise SchemaError(f"{where}: 'metrics' must be an object")


def _check_row(r: Any, where: str) -> None:
    if not isinstance(r, Mapping):
        raise SchemaError(f"{where}: metric row must be an object")
    _need(r, "rank", int, where)
    _need(r, "step", int, where)
    _need(r, "t", _NUM, where)
    metrics = _need(r, "metrics", Mapping, where)
    for name, value in metrics.items():
        if not isinstance(value, _NUM) or isinstance(value, bool):
            raise SchemaError(f"{where}: metric {name!r} must be a number")


def _check_means(m: Mapping[str, Any], where: str) -> None:
    """Optional ``means``: ``{metric: [[step, mean], ...]}``, the mean over ranks by step."""
    means = m.get("means")
    if means is None:
        return
    if not isinstance(means, Mapping):
        raise SchemaError(f"{where}: 'means' must be an object of metric -> [[step, mean], ...]")
    for name, points in means.items():
        if not isinstance(points, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(
                    isinstance(v, _NUM) and not isinstance(v, bool) for v in p) for p in points):
            raise SchemaError(f"{where}: means of {name!r} must be a list of [step, mean] numbers")


def _check_node(n: Any, where: str) -> None:
    if not isinstance(n, Mapping):
        raise SchemaError(f"{where}: node must be an object")
    _need(n, "id", str, where)
    _need(n, "label", str, where)
    _need(n, "kind", str, where)
    state = _need(n, "state", str, where)
    if state not in NODE_STATES:
        raise SchemaError(f"{where}: node state {state!r} not one of {NODE_STATES}")
    _opt_num(n, "fit_time_s", where)


def _check_cluster(m: Mapping[str, Any]) -> None:
    engines = _need(m, "engines", list, "cluster")
    for e in engines:
        _check_engine(e, "cluster")
    _need(m, "max_engines", int, "cluster")
    _need(m, "busy", bool, "cluster")
    if m.get("error") is not None:
        _need(m, "error", str, "cluster")
    if m.get("notice") is not None:
        _need(m, "notice", str, "cluster")


def _check_run_started(m: Mapping[str, Any]) -> None:
    _need(m, "run", str, "run_started")
    _need(m, "world_size", int, "run_started")
    _opt_num(m, "total_steps", "run_started")
    if m.get("name") is not None:
        _need(m, "name", str, "run_started")


def _check_progress(m: Mapping[str, Any]) -> None:
    _need(m, "run", str, "progress")
    for p in _need(m, "ranks", list, "progress"):
        _check_rank_progress(p, "progress")


def _check_metrics(m: Mapping[str, Any]) -> None:
    _need(m, "run", str, "metrics")
    for r in _need(m, "rows", list, "metrics"):
        _check_row(r, "metrics")
    _check_means(m, "metrics")


def _check_run_ended(m: Mapping[str, Any]) -> None:
    _need(m, "run", str, "run_ended")
    status = _need(m, "status", str, "run_ended")
    if status not in RUN_STATES:
        raise SchemaError(f"run_ended: status {status!r} not one of {RUN_STATES}")
    _need(m, "wall_s", _NUM, "run_ended")


def _check_network(m: Mapping[str, Any]) -> None:
    _need(m, "network", str, "network")
    for n in _need(m, "nodes", list, "network"):
        _check_node(n, "network")
    for edge in _need(m, "edges", list, "network"):
        if not (isinstance(edge, list) and len(edge) == 2 and all(isinstance(x, str) for x in edge)):
            raise SchemaError("network: each edge must be a [source_id, target_id] pair of strings")


def _per_rank(m: Mapping[str, Any], kind: str, required: tuple, optional: tuple = ()) -> None:
    """An event of one run with a ``ranks`` list of ``{rank, <numbers>}`` entries."""
    _need(m, "run", str, kind)
    for entry in _need(m, "ranks", list, kind):
        if not isinstance(entry, Mapping):
            raise SchemaError(f"{kind}: rank entry must be an object")
        _need(entry, "rank", int, kind)
        for key in required:
            _need(entry, key, _NUM, kind)
        for key in optional:
            _opt_num(entry, key, kind)


def _check_memory(m: Mapping[str, Any]) -> None:
    _per_rank(m, "memory", ("t",), ("rss_mb", "cuda_allocated_mb", "cuda_reserved_mb",
                                    "cuda_peak_mb", "cuda_total_mb"))


def _check_time(m: Mapping[str, Any]) -> None:
    _per_rank(m, "time", ("collective_s", "collective_wait_s", "collective_move_s",
                          "collectives", "log_s"), ("steps", "step_s", "dominant_share"))
    for entry in m["ranks"]:  # the step's parts, once the rank has finished a step
        parts = entry.get("parts")
        if parts is not None:
            if not isinstance(parts, Mapping):
                raise SchemaError("time: field 'parts' must be an object of part -> seconds")
            for key in parts:
                _need(parts, key, _NUM, "time parts")
        for key in ("dominant", "slow"):
            if entry.get(key) is not None:
                _need(entry, key, str, "time")


def _check_window(m: Mapping[str, Any], where: str) -> None:
    """A step window ``[start, end]`` of one run (a zoomed chart)."""
    _need(m, "run", str, where)
    start, end = _need(m, "start", _NUM, where), _need(m, "end", _NUM, where)
    if end < start:
        raise SchemaError(f"{where}: end ({end}) is before start ({start}); give start <= end")


def _check_history_window(m: Mapping[str, Any]) -> None:
    _check_window(m, "history_window")
    for r in _need(m, "rows", list, "history_window"):
        _check_row(r, "history_window")
    _check_means(m, "history_window")


def _check_snapshot(m: Mapping[str, Any]) -> None:
    for ev in _need(m, "events", list, "snapshot"):
        validate_event(ev)


_EVENT_CHECKS = {
    "cluster": _check_cluster,
    "run_started": _check_run_started,
    "progress": _check_progress,
    "metrics": _check_metrics,
    "run_ended": _check_run_ended,
    "network": _check_network,
    "snapshot": _check_snapshot,
    "memory": _check_memory,
    "time": _check_time,
    "history_window": _check_history_window,
}


def _check_scale(m: Mapping[str, Any]) -> None:
    n = _need(m, "n", int, "scale")
    if n < 1:
        raise SchemaError(f"scale: n must be at least 1, got {n}")


def _no_fields(m: Mapping[str, Any]) -> None:
    return None


def _check_window_request(m: Mapping[str, Any]) -> None:
    _check_window(m, "request_window")
    if m.get("max_points") is not None:
        n = _need(m, "max_points", int, "request_window")
        if not 1 <= n <= MAX_WINDOW_POINTS:
            raise SchemaError(f"request_window: max_points must be between 1 and "
                              f"{MAX_WINDOW_POINTS}, got {n}")


def _check_profile_next(m: Mapping[str, Any]) -> None:
    steps = m.get("steps")
    if steps is not None and (_need(m, "steps", int, "profile_next") < 1):
        raise SchemaError(f"profile_next: steps must be at least 1, got {steps}")


_REQUEST_CHECKS = {
    "request_snapshot": _no_fields,
    "scale": _check_scale,
    "stop": _no_fields,
    "stop_run": _no_fields,
    "request_window": _check_window_request,
    "profile_next": _check_profile_next,  # the next run records ``steps`` (5) steps: --profile
}


def _validate(msg: Any, checks: Mapping[str, Any], kind: str) -> dict:
    if not isinstance(msg, Mapping):
        raise SchemaError(f"{kind} must be a JSON object, got {type(msg).__name__}")
    version = msg.get("v")
    if version != SCHEMA_VERSION:
        raise SchemaError(f"{kind} has schema version {version!r}; this side speaks {SCHEMA_VERSION}")
    kind_name = msg.get("type")
    if kind_name not in checks:
        raise SchemaError(f"unknown {kind} type {kind_name!r}; known: {sorted(checks)}")
    checks[kind_name](msg)
    return dict(msg)


def validate_event(msg: Any) -> dict:
    """Check a kernel -> frontend event; return it as a dict or raise :class:`SchemaError`.

    Example::

        >>> validate_event({"v": 1, "type": "run_ended", "run": "r1", "status": "done", "wall_s": 1.5})["status"]
        'done'
    """
    return _validate(msg, _EVENT_CHECKS, "event")


def validate_request(msg: Any) -> dict:
    """Check a frontend -> kernel request; return it as a dict or raise :class:`SchemaError`.

    Example::

        >>> validate_request({"v": 1, "type": "scale", "n": 3})["n"]
        3
    """
    return _validate(msg, _REQUEST_CHECKS, "request")


# --- constructors (the kernel side builds events only through these) ----------------------------


def _event(type_: str, **fields: Any) -> dict:
    return {"v": SCHEMA_VERSION, "type": type_, **fields}


def cluster_state(engines: Iterable[Mapping[str, Any]], max_engines: int, busy: bool = False,
                  error: str | None = None, launcher: str = "local",
                  notice: str | None = None) -> dict:
    """Engines of the cluster: ``[{rank, engine_id, host, pid, device, state, memory_mb, step}]``
    (``notice``: a change asked for that waits for the run, e.g. "scale to 3 after run-4")."""
    return _event("cluster", engines=[dict(e) for e in engines], max_engines=max_engines,
                  busy=busy, error=error, launcher=launcher, notice=notice)


def run_started(run: str, world_size: int, total_steps: int | None, strategy: str,
                name: str | None = None) -> dict:
    """A ``%%distributed_fit`` run began (``name``: the ``--name`` shown to people)."""
    return _event("run_started", run=run, world_size=world_size, total_steps=total_steps,
                  strategy=strategy, name=name)


def progress(run: str, ranks: Iterable[Mapping[str, Any]]) -> dict:
    """Per-rank progress: ``[{rank, step, total, steps_per_s, eta_s, metrics, straggler}]``."""
    return _event("progress", run=run, ranks=[dict(r) for r in ranks])


def metrics(run: str, rows: Iterable[Mapping[str, Any]],
            means: Mapping[str, list] | None = None) -> dict:
    """New metric rows ``[{rank, step, t, metrics: {name: number}}]``, appended to the history;
    to a panel also the means over ranks settled since, ``{metric: [[step, mean], ...]}``."""
    event = _event("metrics", run=run, rows=[dict(r) for r in rows])
    if means is not None:
        event["means"] = dict(means)
    return event


def run_ended(run: str, status: str, wall_s: float, error: str | None = None) -> dict:
    """A run finished (``status`` one of :data:`RUN_STATES`)."""
    return _event("run_ended", run=run, status=status, wall_s=wall_s, error=error)


def network_state(network: str, nodes: Iterable[Mapping[str, Any]],
                  edges: Iterable[tuple[str, str]]) -> dict:
    """A learning network's DAG: nodes ``{id, label, kind, state, fit_time_s, estimator, params,
    last_action}`` and edges ``[source_id, target_id]``."""
    return _event("network", network=network, nodes=[dict(n) for n in nodes],
                  edges=[[a, b] for a, b in edges])


def memory(run: str, ranks: Iterable[Mapping[str, Any]]) -> dict:
    """Each rank's latest memory sample, about once a second during a run:
    ``[{rank, t, rss_mb, cuda_allocated_mb?, cuda_reserved_mb?, cuda_peak_mb?, cuda_total_mb?}]``
    (CUDA figures only from ranks that use CUDA; MB = 2**20 bytes).

    Example::

        >>> memory("r1", [{"rank": 0, "t": 1.0, "rss_mb": 512.0}])["ranks"][0]["rss_mb"]
        512.0
    """
    return _event("memory", run=run, ranks=[dict(r) for r in ranks])


def time_parts(run: str, ranks: Iterable[Mapping[str, Any]]) -> dict:
    """Each rank's seconds so far in phalanx collectives (``collective_s``, split into
    ``collective_wait_s`` waiting for the slowest peer and ``collective_move_s`` moving bytes;
    ``collectives`` calls) and in ``log()`` (``log_s``); sent when they change.  Once a rank has
    finished a step: ``steps``, ``step_s`` (their time) and ``parts`` (``{data, backward, wait,
    move, optimizer, log, other}``: seconds that add up to ``step_s``), ``dominant`` (the largest
    part) and ``dominant_share``; ``slow`` ("data & forward 61% of step time") on a rank whose own
    work per step is well above the others'.

    Example::

        >>> ev = time_parts("r1", [{"rank": 0, "collective_s": 1.0, "collective_wait_s": 0.75,
        ...                         "collective_move_s": 0.25, "collectives": 4, "log_s": 0.01}])
        >>> validate_event(ev)["type"]
        'time'
    """
    return _event("time", run=run, ranks=[dict(r) for r in ranks])


def history_window(run: str, start: float, end: float, rows: Iterable[Mapping[str, Any]],
                   means: Mapping[str, list] | None = None) -> dict:
    """The answer to a panel's ``request_window``: the run's rows with ``start <= step <= end``,
    every row up to the asked number of points per line (min/max downsampled beyond), and the
    mean over ranks of each metric in the window (``{metric: [[step, mean], ...]}``).

    Example::

        >>> row = {"rank": 0, "step": 5, "t": 1.0, "metrics": {"loss": 0.5}}
        >>> validate_event(history_window("r1", 0, 10, [row]))["rows"][0]["step"]
        5
    """
    event = _event("history_window", run=run, start=start, end=end, rows=[dict(r) for r in rows])
    if means is not None:
        event["means"] = dict(means)
    return event


def snapshot(events: Iterable[Mapping[str, Any]]) -> dict:
    """Everything a freshly attached view needs, as a list of the events above."""
    return _event("snapshot", events=[dict(e) for e in events])
