"""The kernel's complete metric history of a run: every row of every rank, never thinned.

Rows are stored by column (see :mod:`._columns`): appended in batches into an open chunk, sealed
chunks kept in memory up to ``memory_rows`` rows, older ones written to ``part-*.npz`` files in
the history's directory.  Memory stays bounded however long the run, nothing is lost, and every
read (:meth:`MetricHistory.rows`, :meth:`MetricHistory.to_pandas`) goes through memory and disk
alike.  A finished run's history is moved to disk whole (:meth:`MetricHistory.persist`).

Example::

    >>> h = MetricHistory()
    >>> h.extend(0, [[1, 0.0, {"loss": 0.5}], [2, 0.1, {"loss": 0.4}]])
    2
    >>> h.rows()[0]["loss"], len(h.to_pandas(rank=0, steps=(2, None)))
    (0.5, 1)
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import itertools
import threading
import weakref
from operator import itemgetter
from typing import Any, Iterator

import numpy as np

from ._columns import BASE, METRIC, PRESENT, Chunk, ChunkBuffer, part_paths, select

STAGE_ROWS = 4096             # wire rows staged before they become columns
CHUNK_ROWS = 1 << 16          # rows per chunk (~2.5 MB for two metrics)
MEMORY_ROWS = 1 << 19         # sealed rows kept in memory before the oldest go to disk
_STEP, _TIME, _METRICS = itemgetter(0), itemgetter(1), itemgetter(2)   # of a wire row


class MetricHistory:
    """Rows ``{"rank", "step", "t", <metric>: value}`` in arrival order; thread-safe.

    ``directory``: where chunks are written (created on first use); None: a private temporary
    directory, removed with this object.
    """

    def __init__(self, directory: str | None = None, memory_rows: int = MEMORY_ROWS,
                 chunk_rows: int = CHUNK_ROWS, stage_rows: int = STAGE_ROWS) -> None:
        self.directory = directory
        self.memory_rows, self.chunk_rows, self.stage_rows = memory_rows, chunk_rows, stage_rows
        self._chunks: list[Chunk] = []      # sealed, in order; the oldest are on disk
        self._buffer = ChunkBuffer(chunk_rows)
        self._rows = 0                      # rows in chunks and the open chunk (not staged)
        self._staged: list[tuple[int, list]] = []
        self._staged_rows = 0
        self._held = 0                      # rows of sealed chunks still in memory
        self._names: dict[str, None] = {}
        self._latest: dict[int, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._spill_lock = threading.Lock()
        self._cleanup: Any = None

    # --- writing ------------------------------------------------------------------------------

    def extend(self, rank: int, rows: list) -> int:
        """Add wire rows ``[step, t, {metrics}]`` of ``rank``; returns how many.

        Batches are staged as they came and turned into columns together (up to
        :data:`STAGE_ROWS` rows, or at the next read): converting a few dozen rows at a time
        would cost more in numpy calls than in rows.
        """
        if not rows:
            return 0
        with self._lock:
            self._staged.append((int(rank), rows))
            self._staged_rows += len(rows)
            if self._staged_rows < self.stage_rows:
                return len(rows)
            self._flush()
        if self._held > self.memory_rows:
            self._spill_old()
        return len(rows)

    def _flush(self) -> None:
        """Turn the staged batches into columns (called with the lock held)."""
        if not self._staged:
            return
        staged, self._staged, self._staged_rows = self._staged, [], 0
        ranks = np.repeat(np.array([r for r, _ in staged], np.int32), [len(b) for _, b in staged])
        # One flat list of the rows, then one C-level pass per column (map/itemgetter): no
        # Python code runs per row, and no transposed copy of the rows is built (zip(*rows)).
        flat = list(itertools.chain.from_iterable(b for _, b in staged))
        steps = np.fromiter(map(_STEP, flat), np.int64, len(flat))
        times = np.fromiter(map(_TIME, flat), np.float64, len(flat))
        metrics = _metric_columns(list(map(_METRICS, flat)))
        self._append(ranks, steps, times, metrics)
        # Kept up to date here because the run tracker asks for it at ~10/s per rank.
        for rank in np.unique(ranks).tolist():
            rows = np.flatnonzero(ranks == rank)
            latest = self._latest.setdefault(rank, {})
            for name, (values, present) in metrics.items():
                self._names.setdefault(name)
                logged = rows if present is None else rows[present[rows]]
                if len(logged):
                    latest[name] = float(values[logged[-1]])

    def _append(self, ranks: np.ndarray, steps: np.ndarray, times: np.ndarray, metrics: dict) -> None:
        start = 0
        while start < len(steps):
            take = min(self._buffer.room, len(steps) - start)
            end = start + take
            part = {k: (v[start:end], None if p is None else p[start:end]) for k, (v, p) in metrics.items()}
            self._buffer.append(ranks[start:end], steps[start:end], times[start:end], part)
            start = end
            self._rows += take
            if not self._buffer.room:
                self._chunks.append(self._buffer.seal())
                self._buffer = ChunkBuffer(self.chunk_rows)
                self._held += self._chunks[-1].rows

    def _spill_old(self) -> None:
        """Write the oldest in-memory chunks to disk while more than ``memory_rows`` are held."""
        with self._spill_lock:
            while True:
                with self._lock:
                    held = [c for c in self._chunks if c.in_memory]
                    if sum(c.rows for c in held) <= self.memory_rows:
                        return
                    chunk, index = held[0], self._chunks.index(held[0])
                self._swap(index, chunk.spill(self._part_path(index)))
                with self._lock:
                    self._held -= chunk.rows

    def _swap(self, index: int, chunk: Chunk) -> None:
        with self._lock:
            self._chunks[index] = chunk

    def persist(self) -> str | None:
        """Move every row to disk (the run is over); returns the directory (None for a history
        without rows: no folder is made for it).  Memory then holds only the index of the
        chunks, the metric names and each rank's latest values."""
        with self._spill_lock:
            with self._lock:
                self._flush()
                if self._buffer.used:
                    self._chunks.append(self._buffer.seal())
                    self._buffer = ChunkBuffer(self.chunk_rows)
                todo = [(i, c) for i, c in enumerate(self._chunks) if c.in_memory]
                if not self._chunks:
                    return None
            for index, chunk in todo:
                self._swap(index, chunk.spill(self._part_path(index)))
            with self._lock:
                self._held = sum(c.rows for c in self._chunks if c.in_memory)
        return self._ensure_directory()

    def _part_path(self, index: int) -> str:
        return os.path.join(self._ensure_directory(), f"part-{index:06d}.npz")

    def _ensure_directory(self) -> str:
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="phalanx-history-")
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.directory, True)
        os.makedirs(self.directory, exist_ok=True)
        return self.directory

    @classmethod
    def read(cls, directory: str) -> "MetricHistory":
        """A history written earlier (``--keep-history DIR``), read back from its files.

        Example: ``MetricHistory.read("runs/run-3").to_pandas(rank=0)``
        """
        paths = part_paths(directory)
        if not paths:
            raise FileNotFoundError(f"{directory} holds no metric history (no part-*.npz files)")
        history = cls(directory)
        history._chunks = [Chunk.read(p) for p in paths]
        history._rows = sum(c.rows for c in history._chunks)
        for chunk in history._chunks:
            history._names.update(dict.fromkeys(chunk.metric_names()))
        return history

    # --- reading ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._rows + self._staged_rows

    @property
    def path(self) -> str | None:
        """The directory of the history's files (None while every row is in memory)."""
        return self.directory if any(not c.in_memory for c in self._chunks) else None

    def memory_bytes(self) -> int:
        """Bytes of row data held in memory (the open chunk counts whole)."""
        with self._lock:
            held = sum(c.nbytes for c in self._chunks)
            return held + sum(c.nbytes for c in self._buffer._cols.values())

    def _parts(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, Any]]:
        """``(first row index, chunk or columns)`` covering rows ``start`` to ``stop``."""
        with self._lock:
            self._flush()
            chunks = list(self._chunks)
            offset = self._rows - self._buffer.used
            tail = self._buffer.view(max(0, start - offset)) if (self._rows if stop is None else stop) > offset else None
        at = 0
        for chunk in chunks:
            if at + chunk.rows > start and (stop is None or at < stop):
                yield at, chunk
            at += chunk.rows
        if tail is not None and len(tail["rank"]):
            yield max(start, offset), tail

    def columns(self, start: int = 0, rank: int | None = None, steps: tuple | None = None,
                times: tuple | None = None, stop: int | None = None) -> dict[str, np.ndarray]:
        """Rows ``start`` to ``stop`` (row indices), by column (``rank``, ``step``, ``t``, then one float
        array per metric, NaN where a row did not log it), optionally of one rank and inside
        a step or time window (inclusive; ``None`` leaves a side open)."""
        names = self.metric_names()
        parts = []
        for offset, part in self._parts(start, stop):
            if isinstance(part, Chunk):
                spans = part.spans if rank is None else {rank: part.spans.get(rank)}
                if not any(s is not None and s.overlaps(steps, times) for s in spans.values()):
                    continue
                part = part.load()
            hi = None if stop is None else max(0, stop - offset)
            part = {k: v[max(0, start - offset):hi] for k, v in part.items()}
            parts.append(_normalise(select(part, rank, steps, times), names))
        if not parts:
            return _normalise({k: np.zeros(0, d) for k, d in
                               (("rank", np.int32), ("step", np.int64), ("t", np.float64))}, names)
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        """Every row, one chunk at a time, by column (as :meth:`columns`): a pass over a long
        history in bounded memory."""
        names = self.metric_names()
        for _, part in self._parts():
            yield _normalise(part.load() if isinstance(part, Chunk) else part, names)

    def rows(self, start: int = 0, stop: int | None = None, *, rank: int | None = None,
             steps: tuple | None = None, times: tuple | None = None) -> list[dict]:
        """Rows ``start`` to ``stop`` (row indices, arrival order) as dicts (a metric a row did
        not log is left out); ``rank``, ``steps``, ``times`` as in :meth:`columns`."""
        out: list[dict] = []
        for offset, part in self._parts(start, stop):
            if isinstance(part, Chunk):
                part = part.load()
            lo = max(0, start - offset)
            hi = None if stop is None else max(0, stop - offset)
            part = select({k: v[lo:hi] for k, v in part.items()}, rank, steps, times)
            out.extend(_dict_rows(part))
        return out

    def metric_names(self) -> list[str]:
        with self._lock:
            self._flush()
            return list(self._names)

    def latest(self, rank: int) -> dict[str, float]:
        """The last logged value of each metric of ``rank``."""
        with self._lock:
            self._flush()
            return dict(self._latest.get(rank, {}))

    def ranks(self) -> list[int]:
        """The ranks that logged at least one row."""
        ranks: set[int] = set()
        for _, part in self._parts():
            ranks.update(part.spans if isinstance(part, Chunk) else np.unique(part["rank"]).tolist())
        return sorted(ranks)

    def to_pandas(self, rank: int | None = None, steps: tuple | None = None,
                  times: tuple | None = None) -> Any:
        """The history as a DataFrame (columns rank, step, t and one per metric), all of it or
        ``rank``'s rows inside a step or time window.

        Example: ``last_run().history.to_pandas(rank=0, steps=(1000, 2000))``
        """
        import pandas as pd

        return pd.DataFrame(self.columns(0, rank, steps, times), copy=False)

    def __repr__(self) -> str:
        where = f", on disk in {self.path}" if self.path else ""
        return f"<MetricHistory: {len(self)} rows, metrics {self.metric_names()}{where}>"


def _metric_columns(metrics: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """``{name: (float values, presence mask or None when every row logged it)}``."""
    n, keys = len(metrics), tuple(metrics[0])
    if sum(map(len, metrics)) == n * len(keys):  # the usual case: the same metrics every call
        try:  # (map/itemgetter run in C: this path must take well under 1 us a row)
            return {k: (np.fromiter(map(itemgetter(k), metrics), np.float64, n), None) for k in keys}
        except (KeyError, TypeError, ValueError):
            pass
    names = dict.fromkeys(k for m in metrics for k in m)
    return {k: (np.array([_number(m.get(k)) for m in metrics], np.float64),
                np.array([k in m for m in metrics], bool)) for k in names}


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _normalise(part: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """``rank``, ``step``, ``t`` and every metric (NaN where not logged) under its plain name."""
    out = {k: part[k] for k in BASE}
    n = len(out["rank"])
    for name in names:
        values = part.get(METRIC + name)
        if values is None:
            values = np.full(n, np.nan)
        elif PRESENT + name in part:
            values = np.where(part[PRESENT + name], values, np.nan)
        out[name] = values
    return out


def _dict_rows(part: dict[str, np.ndarray]) -> list[dict]:
    base = [part[k].tolist() for k in BASE]
    metrics = [(k[len(METRIC):], part[k].tolist(), part.get(PRESENT + k[len(METRIC):]))
               for k in part if k.startswith(METRIC)]
    rows = [{"rank": r, "step": s, "t": t} for r, s, t in zip(*base)]
    for name, values, present in metrics:
        if present is None:
            for row, v in zip(rows, values):
                row[name] = v
        else:
            for row, v, p in zip(rows, values, present.tolist()):
                if p:
                    row[name] = v
    return rows
