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
