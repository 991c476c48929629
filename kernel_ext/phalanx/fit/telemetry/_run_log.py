"""Every run of a notebook, kept on disk: what ``phalanx.runs()`` lists across kernel restarts.

One folder per notebook (``<root>/<notebook>-<hash of its path>``), one folder per run in it:
``run.json`` (name, cell, start, wall time, status, final metrics, each rank's steps) and
``history/`` (the run's complete metric history, ``part-*.npz``), so any earlier run's curves
open again.  The root is ``$PHALANX_RUNS_DIR``, else ``<Jupyter data dir>/phalanx/runs``; the
newest ``$PHALANX_KEEP_RUNS`` runs of a notebook are kept (100 by default; 0 keeps none beyond
the kernel).  Run numbers continue from the log, so ``run-1`` is never named twice in a
notebook, restarts included.

The notebook is the one the kernel was started for (ipykernel's ``__session__``, which
JupyterLab sets to the notebook's path), else the kernel's working directory.

Example::

    >>> import tempfile
    >>> log = RunLog(tempfile.mkdtemp(), keep=10)
    >>> log.started("ab-1", 1, "run-1", "for i in range(3): log(loss=i)", world_size=2)
    >>> log.ended("ab-1", "done", 1.5, steps={0: 3, 1: 3}, metrics={"loss": 2.0})
    >>> [(e["name"], e["status"], e["metrics"]) for e in log.entries()], log.next_number()
    ([('run-1', 'done', {'loss': 2.0})], 2)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from typing import Any

RUNS_DIR_ENV = "PHALANX_RUNS_DIR"
KEEP_ENV = "PHALANX_KEEP_RUNS"
DEFAULT_KEEP = 100
MAX_CELL_CHARS = 20_000  # a cell pasted with data in it must not make the log heavy
ENTRY = "run.json"
PRUNE_EVERY = 10  # runs started between two prunings (the log holds at most keep + 10)
LOST = "the kernel ended during the run"


def keep_setting() -> int:
    """How many runs of a notebook are kept (``$PHALANX_KEEP_RUNS``); a clear error if wrong."""
    text = os.environ.get(KEEP_ENV, str(DEFAULT_KEEP))
    try:
        keep = int(text)
    except ValueError:
        raise ValueError(f"{KEEP_ENV}={text!r}: expected a whole number of runs to keep "
                         f"(0 keeps none beyond the kernel)") from None
    if keep < 0:
        raise ValueError(f"{KEEP_ENV}={keep}: must be 0 or more")
    return keep


def runs_root() -> str:
    """Where every notebook's runs are kept."""
    if os.environ.get(RUNS_DIR_ENV):
        return os.environ[RUNS_DIR_ENV]
    from jupyter_core.paths import jupyter_data_dir

    return os.path.join(jupyter_data_dir(), "phalanx", "runs")


def notebook_folder(user_ns: dict | None, root: str | None = None) -> str:
    """The run log folder of the notebook whose namespace is ``user_ns``.

    Example::

        >>> notebook_folder({"__session__": "/home/me/train.ipynb"}, "/r").startswith("/r/train-")
        True
    """
    path = (user_ns or {}).get("__session__") or os.environ.get("JPY_SESSION_NAME") or os.getcwd()
    path = os.path.abspath(str(path))
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.splitext(os.path.basename(path))[0])[:40]
    digest = hashlib.sha256(path.encode()).hexdigest()[:10]
    return os.path.join(root if root is not None else runs_root(), f"{stem or 'kernel'}-{digest}")


def _run_order(folder: str) -> tuple[int, str]:
    """A run folder's place, oldest first: its run's number (``<session>-<number>``)."""
    number = folder.rpartition("-")[2]
    return (int(number) if number.isdigit() else -1, folder)


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


class RunLog:
    """The runs of one notebook in ``directory``, the newest ``keep`` of them (0: none kept
    beyond this process: the caller gives a temporary directory then)."""

    def __init__(self, directory: str, keep: int = DEFAULT_KEEP) -> None:
        self.directory, self.keep = directory, keep
        self._started = 0  # runs started through this object: the oldest are pruned now and then
        self._running: dict[str, dict] = {}  # entries this object wrote as started, until ended

    def history_dir(self, run_id: str) -> str:
        """Where ``run_id``'s metric history is written."""
        return os.path.join(self.directory, run_id, "history")

    def next_number(self) -> int:
        """One past the largest run number recorded (1 for a notebook without runs)."""
        return 1 + max((int(e.get("number") or 0) for e in self._read_all()), default=0)

    def started(self, run_id: str, number: int, name: str, cell: str, world_size: int,
                total_steps: int | None = None) -> None:
        """Record a run that has just started (status ``running``), then drop the oldest runs
        beyond :attr:`keep`."""
        entry = {"run": run_id, "number": number, "name": name, "cell": cell[:MAX_CELL_CHARS],
                 "started": time.time(), "wall_s": None, "status": "running",
                 "world_size": world_size, "total_steps": total_steps, "metrics": {},
                 "steps": {}, "error": None, "pid": os.getpid()}
        self._write(entry, new=True)
        self._running[run_id] = entry
        if self._started % PRUNE_EVERY == 0:  # listing the folder costs more than a warm run
            self._prune()
        self._started += 1

    def ended(self, run_id: str, status: str, wall_s: float, steps: dict[int, int] | None = None,
              metrics: dict[str, float] | None = None, error: str | None = None,
              world_size: int | None = None) -> None:
        """Record how ``run_id`` ended (nothing if it was never recorded or already pruned)."""
        entry = self._running.pop(run_id, None)  # as written at the start: not read back
        if entry is None or not os.path.isdir(os.path.join(self.directory, run_id)):
            entry = self._read(run_id)  # started elsewhere, or pruned meanwhile (None)
        if entry is None:
            return
        entry.update(status=status, wall_s=wall_s, error=error,
                     steps={str(r): int(s) for r, s in (steps or {}).items()},
                     metrics=dict(metrics or {}))
        if world_size is not None:
            entry["world_size"] = world_size
        try:
            self._write(entry)
        except FileNotFoundError:
            pass  # pruned by another kernel since the look above: it stays gone

    def entries(self) -> list[dict]:
        """Every recorded run, oldest first; one whose kernel ended before it did is said
        ``interrupted`` (the kernel ended during the run)."""
        out = []
        for entry in self._read_all():
            if entry["status"] == "running" and not _pid_alive(entry.get("pid")):
                entry.update(status="interrupted", error=entry.get("error") or LOST)
            out.append(entry)
        return out

    def entry(self, run_id: str) -> dict | None:
        """The recorded entry of ``run_id``, or None."""
        return next((e for e in self.entries() if e["run"] == run_id), None)

    # --- files -------------------------------------------------------------------------------

    def _read(self, run_id: str) -> dict | None:
        try:
            with open(os.path.join(self.directory, run_id, ENTRY)) as f:
                return json.load(f)
        except (OSError, ValueError):  # pruned, or half-written by a kernel that died
            return None

    def _read_all(self) -> list[dict]:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        found = [e for e in (self._read(n) for n in names) if e is not None]
        return sorted(found, key=lambda e: (e.get("started") or 0, e.get("number") or 0))

    def _write(self, entry: dict, new: bool = False) -> None:
        """Write ``entry`` whole; ``new``: the run's first, whose folder is made first (once:
        a second ``makedirs`` fails inside, which cost more than the write)."""
        folder = os.path.join(self.directory, entry["run"])
        if new:
            os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, ENTRY)
        data = json.dumps(entry)  # one write: json.dump writes each small piece on its own
        with open(path + ".tmp", "w") as f:
            f.write(data)
        os.replace(path + ".tmp", path)  # a reader never sees half an entry

    def _prune(self) -> None:
        """Remove the oldest runs beyond :attr:`keep`.  Runs are ordered by their number, which
        ends each folder's name: only the runs to remove are read (reading all 100 entries
        took 2.4 ms, every tenth run)."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        excess = len(names) - max(self.keep, 1)
        if excess <= 0:
            return
        for name in sorted(names, key=_run_order)[:excess]:
            old = self._read(name)
            if old is None:
                continue  # being written, or not a run's folder: left alone
            if old["status"] == "running" and _pid_alive(old.get("pid")):
                continue  # another kernel's run that still goes
            _remove_run_folder(os.path.join(self.directory, name))


def _remove_run_folder(folder: str) -> None:
    """Remove a run's folder; one that holds only its entry (a run that logged no metrics) in
    two calls, where ``shutil.rmtree`` walks it (the log's file work was 9% of a warm re-run's
    profiled kernel time, pruning half of that)."""
    try:
        os.unlink(os.path.join(folder, ENTRY))
        os.rmdir(folder)
    except OSError:  # its history, or a half-written entry: the whole walk
        shutil.rmtree(folder, ignore_errors=True)
