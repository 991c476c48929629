"""One log file per cluster for what its processes say that is not the user's.

ipyparallel sends each engine's and the controller's own output (their logging, the nanny's,
tracebacks of threads that die outside a cell) to a file per process in the profile's ``log``
folder, and removes that file when the process stops.  The cell shows only what the user's code
prints (through the engines' streams); this module keeps the rest, out of the cell and the
terminal: each process's output is appended to ``phalanx-<cluster id>.log`` in that folder as it
stops.  Only the newest :data:`KEEP` such files of a profile are kept.

Example::

    >>> import tempfile
    >>> log = EngineLog(tempfile.mkdtemp(), "abc")
    >>> os.path.basename(log.path)
    'phalanx-abc.log'
    >>> class Stopped:
    ...     def get_output(self): return "Event loop stopped before Future completed.\\n"
    >>> log.keep("engine slot-0", Stopped(), {"exit_code": 1})
    >>> print(open(log.path).read().splitlines()[1])
    Event loop stopped before Future completed.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from typing import Any

KEEP = 20          # cluster logs of a profile kept (newest first)
LINES = 2000       # the last lines of each process's output kept (a controller logs each request)
TAIL_LINES = 200   # what the panel's log shows


class EngineLog:
    """The log file of one cluster (``profile_dir/log/phalanx-<cluster_id>.log``)."""

    def __init__(self, profile_dir: str, cluster_id: str) -> None:
        self.path = os.path.join(profile_dir, "log", f"phalanx-{cluster_id}.log")
        self._lock = threading.Lock()

    def keep(self, what: str, launcher: Any, stop_data: Any = None) -> None:
        """Append the output of ``launcher`` (an ipyparallel launcher that has stopped: it read
        its file before removing it) under a line naming ``what`` stopped and how."""
        try:
            text = "".join((launcher.get_output() or "").splitlines(True)[-LINES:])
        except Exception as exc:  # its file went with a folder: say so rather than fail a stop
            text = f"(its output could not be read: {exc})\n"
        code = stop_data.get("exit_code") if isinstance(stop_data, dict) else None
        header = f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {what} stopped (exit code {code})\n"
        with self._lock:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            with open(self.path, "a", encoding="utf-8", errors="replace") as f:
                f.write(header + text + ("" if not text or text.endswith("\n") else "\n"))


def prune(profile_dir: str, keep: int = KEEP) -> None:
    """Remove all but the newest ``keep`` cluster logs of ``profile_dir``."""
    paths = glob.glob(os.path.join(profile_dir, "log", "phalanx-*.log"))
    for path in sorted(paths, key=_modified, reverse=True)[keep:]:
        try:
            os.remove(path)
        except OSError:
            continue


def _modified(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def tail(log_path: str | None, cluster: Any = None, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a cluster's log: what its stopped processes said (the log
    file), then what its running ones have said so far (ipyparallel's output file of each),
    each under a line naming it.  Read, never moved: a running process's output is kept in
    the log when it stops, as before.

    Example::

        >>> import tempfile
        >>> log = EngineLog(tempfile.mkdtemp(), "abc")
        >>> class Stopped:
        ...     def get_output(self): return "engine 0 said this\\n"
        >>> log.keep("engine slot-0", Stopped())
        >>> tail(log.path, lines=1)
        ['engine 0 said this']
    """
    text: list[str] = []
    if log_path:
        text += _read_lines(log_path)
    for what, path in _running_outputs(cluster):
        said = _read_lines(path)
        if said:
            text += [f"--- {what} (running)"] + said
    return text[-lines:] if lines > 0 else []


def _running_outputs(cluster: Any) -> list[tuple[str, str]]:
    """(name, output file) of each process of ``cluster`` still running on this host.  Their
    ``get_output()`` is not called: it caches what it reads, and the log would then keep only
    what a process had said by now."""
    if cluster is None:
        return []
    found: list[tuple[str, str]] = []
    controller = getattr(cluster, "controller", None)
    if _output_file(controller):
        found.append(("controller", _output_file(controller)))
    for set_id, engine_set in list((getattr(cluster, "engines", None) or {}).items()):
        launchers = getattr(engine_set, "launchers", None) or {}
        if launchers:  # a set of engines, each with its own file
            found += [(f"engine set {set_id} ({name})", _output_file(launcher))
                      for name, launcher in list(launchers.items()) if _output_file(launcher)]
        elif _output_file(engine_set):
            found.append((f"engine set {set_id}", _output_file(engine_set)))
    return found


def _output_file(launcher: Any) -> str:
    """Where an ipyparallel launcher on this host writes its process's output ('' if none)."""
    return str(getattr(launcher, "output_file", "") or "")


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:  # not written yet, or gone with a stopped process
        return []
