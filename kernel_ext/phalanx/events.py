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

from typing import Iterable, Mapping

from ._schema import Field, SchemaError, Shape, check, kind_of

SCHEMA_VERSION = 1
COMM_TARGET = "phalanx"

# Node states of a learning network, in the order a fit walks through them.
NODE_STATES = ("fresh", "stale", "queued", "fitting", "fitted", "failed")
ENGINE_STATES = ("starting", "idle", "busy", "dead", "stopping")
RUN_STATES = ("running", "done", "failed", "interrupted", "timeout")
# A zoomed chart asks for at most this many points per line (one answer stays a few MB).
MAX_WINDOW_POINTS = 100_000
# The panel's Log asks for at most this many of the cluster log's last lines.
MAX_LOG_LINES = 2000


# --- the schema: what each event and request holds (mirrored in the lab extension's protocol.ts)

# "number?": a figure the kernel may not know yet, absent or null.
_ENGINE: Shape = {
    "rank": "int", "engine_id": "int", "host": "string",
    "state": Field("string", choices=ENGINE_STATES),
    **dict.fromkeys(("memory_mb", "step", "pid", "cuda_allocated_mb", "cuda_reserved_mb",
                     "cuda_peak_mb"), "number?"),
}
_RANK_PROGRESS: Shape = {
    "rank": "int", "step": "int", "total": "number?", "steps_per_s": "number?", "eta_s": "number?",
    "metrics": "object?",
}
_ROWS = Field("list", items={"rank": "int", "step": "int", "t": "number",
                             "metrics": Field("object", items="number")})
# The mean over ranks of each metric by step: {metric: [[step, mean], ...]}.
_MEANS = Field("object", optional=True, items=Field("list", items=Field("pair", items="number")))
_NODE: Shape = {
    "id": "string", "label": "string", "kind": "string",
    "state": Field("string", choices=NODE_STATES), "fit_time_s": "number?",
}
_RANK_MEMORY: Shape = {
    "rank": "int", "t": "number",
    **dict.fromkeys(("rss_mb", "cuda_allocated_mb", "cuda_reserved_mb", "cuda_peak_mb",
                     "cuda_total_mb"), "number?"),
}
# Seconds in collectives and log(); once the rank finished a step, the step's parts too.
_RANK_TIME: Shape = {
    "rank": "int",
    **dict.fromkeys(("collective_s", "collective_wait_s", "collective_move_s", "collectives",
                     "log_s"), "number"),
    **dict.fromkeys(("steps", "step_s", "dominant_share"), "number?"),
    "parts": Field("object", optional=True, items="number"), "dominant": "string?",
    "slow": "string?",
}
# A step window of one run (a zoomed chart), start <= end.
_WINDOW: Shape = {"run": "string", "start": "number", "end": Field("number", not_before="start")}
# One of the kernel's runs (the panel's run list) and what a finished run's record holds besides.
_RUN_ENTRY: Shape = {
    "run": "string", "name": "string?", "status": Field("string", choices=RUN_STATES),
    "world_size": "int", "wall_s": "number?", "error": "string?",
}


def _inner_event(event: object) -> None:
    """One event of a snapshot: any valid event but another snapshot."""
    if validate_event(event)["type"] == "snapshot":
        raise SchemaError("a snapshot cannot contain a snapshot")


EVENT_FIELDS: dict[str, Shape] = {
    "cluster": {"engines": Field("list", items=_ENGINE), "max_engines": "int", "busy": "bool",
                "error": "string?", "notice": "string?"},
    "run_started": {"run": "string", "world_size": "int", "total_steps": "number?",
                    "name": "string?"},
    "progress": {"run": "string", "ranks": Field("list", items=_RANK_PROGRESS)},
    "metrics": {"run": "string", "rows": _ROWS, "means": _MEANS},
    "run_ended": {"run": "string", "status": Field("string", choices=RUN_STATES),
                  "wall_s": "number", "error": "string?"},
    "network": {"network": "string", "nodes": Field("list", items=_NODE),
                "edges": Field("list", items=Field("pair", items="string"))},
    "snapshot": {"events": Field("list", items=Field("object", then=_inner_event))},
    "memory": {"run": "string", "ranks": Field("list", items=_RANK_MEMORY)},
    "time": {"run": "string", "ranks": Field("list", items=_RANK_TIME)},
    "history_window": {**_WINDOW, "rows": _ROWS, "means": _MEANS},
    "runs": {"runs": Field("list", items=_RUN_ENTRY)},
    "run_record": {**_RUN_ENTRY, "total_steps": "number?", "strategy": "string?",
                   "ranks": Field("list", items=_RANK_PROGRESS),
                   "times": Field("list", items=_RANK_TIME)},
    # the answer to request_log: the cluster log's file and last lines
    "engine_log": {"path": "string?", "lines": Field("list", items="string")},
}

REQUEST_FIELDS: dict[str, Shape] = {
    "request_snapshot": {},
    "scale": {"n": Field("int", least=1)},
    "stop": {},
    "stop_run": {},
    "request_window": {**_WINDOW, "max_points": Field("int", optional=True, least=1,
                                                      most=MAX_WINDOW_POINTS)},
    # the next run records ``steps`` (5) steps: --profile
    "profile_next": {"steps": Field("int", optional=True, least=1)},
    # an earlier run's record (run_record, then its curves as metrics)
    "request_run": {"run": "string"},
    # the last ``lines`` (200) lines of the cluster's log: what its engines said that is not the user's
    "request_log": {"lines": Field("int", optional=True, least=1, most=MAX_LOG_LINES)},
}


def _validate(msg: object, shapes: Mapping[str, Shape], kind: str) -> dict:
    if not isinstance(msg, Mapping):
        raise SchemaError(f"{kind} must be a JSON object, got {kind_of(msg)}")
    version = msg.get("v")
    if version != SCHEMA_VERSION:
        raise SchemaError(f"{kind} has schema version {version!r}; this side speaks {SCHEMA_VERSION}")
    kind_name = msg.get("type")
    if not isinstance(kind_name, str) or kind_name not in shapes:
        raise SchemaError(f"unknown {kind} type {kind_name!r}; known: {', '.join(sorted(shapes))}")
    check(shapes[kind_name], msg, kind_name)
    return dict(msg)


def validate_event(msg: object) -> dict:
    """Check a kernel -> frontend event; return it as a dict or raise :class:`SchemaError`.

    Example::

        >>> validate_event({"v": 1, "type": "run_ended", "run": "r1", "status": "done", "wall_s": 1.5})["status"]
        'done'
        >>> validate_event({"v": 1, "type": "run_ended", "run": "r1", "status": "done"})
        Traceback (most recent call last):
        ...
        phalanx._schema.SchemaError: run_ended: missing field 'wall_s'
    """
    return _validate(msg, EVENT_FIELDS, "event")


def validate_request(msg: object) -> dict:
    """Check a frontend -> kernel request; return it as a dict or raise :class:`SchemaError`.

    Example::

        >>> validate_request({"v": 1, "type": "scale", "n": 3})["n"]
        3
    """
    return _validate(msg, REQUEST_FIELDS, "request")


# --- constructors (the kernel side builds events only through these) ----------------------------


def _event(type_: str, **fields: object) -> dict:
    return {"v": SCHEMA_VERSION, "type": type_, **fields}


def cluster_state(engines: Iterable[Mapping[str, object]], max_engines: int, busy: bool = False,
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


def progress(run: str, ranks: Iterable[Mapping[str, object]]) -> dict:
    """Per-rank progress: ``[{rank, step, total, steps_per_s, eta_s, metrics, straggler}]``."""
    return _event("progress", run=run, ranks=[dict(r) for r in ranks])


def metrics(run: str, rows: Iterable[Mapping[str, object]],
            means: Mapping[str, list] | None = None) -> dict:
    """New metric rows ``[{rank, step, t, metrics: {name: number}}]``, appended to the history;
    to a panel also the means over ranks settled since, ``{metric: [[step, mean], ...]}``."""
    event = _event("metrics", run=run, rows=[dict(r) for r in rows])
    if means is not None:
        event["means"] = dict(means)
    return event


def run_ended(run: str, status: str, wall_s: float, error: str | None = None) -> dict:
    """A run finished (``status`` one of :data:`RUN_STATES`; ``error``: for a run that did not
    finish, the first line of the cell's error, naming the rank, the exception and the step)."""
    return _event("run_ended", run=run, status=status, wall_s=wall_s, error=error)


def network_state(network: str, nodes: Iterable[Mapping[str, object]],
                  edges: Iterable[tuple[str, str]]) -> dict:
    """A learning network's DAG: nodes ``{id, label, kind, state, fit_time_s, estimator, params,
    last_action}`` and edges ``[source_id, target_id]``."""
    return _event("network", network=network, nodes=[dict(n) for n in nodes],
                  edges=[[a, b] for a, b in edges])


def memory(run: str, ranks: Iterable[Mapping[str, object]]) -> dict:
    """Each rank's latest memory sample, about once a second during a run:
    ``[{rank, t, rss_mb, cuda_allocated_mb?, cuda_reserved_mb?, cuda_peak_mb?, cuda_total_mb?}]``
    (CUDA figures only from ranks that use CUDA; MB = 2**20 bytes).

    Example::

        >>> memory("r1", [{"rank": 0, "t": 1.0, "rss_mb": 512.0}])["ranks"][0]["rss_mb"]
        512.0
    """
    return _event("memory", run=run, ranks=[dict(r) for r in ranks])


def time_parts(run: str, ranks: Iterable[Mapping[str, object]]) -> dict:
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


def history_window(run: str, start: float, end: float, rows: Iterable[Mapping[str, object]],
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


def runs(entries: Iterable[Mapping[str, object]]) -> dict:
    """The kernel's runs, oldest first: ``[{run, name, status, world_size, wall_s, error}]``.

    Example::

        >>> ev = runs([{"run": "r1", "name": "train", "status": "done", "world_size": 2,
        ...             "wall_s": 3.5}])
        >>> validate_event(ev)["runs"][0]["name"]
        'train'
    """
    return _event("runs", runs=[dict(e) for e in entries])


def run_record(entry: Mapping[str, object], total_steps: int | None, strategy: str | None,
               ranks: Iterable[Mapping[str, object]], times: Iterable[Mapping[str, object]]) -> dict:
    """An earlier run as the panel shows it when picked: its run list ``entry`` with its
    ``total_steps`` and ``strategy``, each rank's last progress (``ranks``, as in
    :func:`progress`) and step parts (``times``, as in :func:`time_parts`); its curves follow
    as :func:`metrics` events."""
    return _event("run_record", **dict(entry), total_steps=total_steps, strategy=strategy,
                  ranks=[dict(r) for r in ranks], times=[dict(t) for t in times])


def engine_log(path: str | None, lines: Iterable[str]) -> dict:
    """The answer to a panel's ``request_log``: the cluster's log file (None before any cluster
    started) and its last lines, what the running engines and controller said so far included.

    Example::

        >>> validate_event(engine_log("/tmp/phalanx-abc.log", ["engine 0 ready"]))["lines"]
        ['engine 0 ready']
    """
    return _event("engine_log", path=path, lines=list(lines))


def snapshot(events: Iterable[Mapping[str, object]]) -> dict:
    """Everything a freshly attached view needs, as a list of the events above."""
    return _event("snapshot", events=[dict(e) for e in events])
