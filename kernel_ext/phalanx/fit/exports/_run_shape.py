"""What a run looks like in TensorBoard and MLflow, whichever writes it (pure but the import).

A *sink* (:mod:`phalanx.fit.exports._tensorboard`, :mod:`phalanx.fit.exports._mlflow`) writes one run with its library's
own writer: the run's options as hyperparameters when it begins, each metric's points as
``<metric>/rank<r>`` lines and a ``<metric>/mean`` line (the mean over ranks per step, settled
as the live views settle theirs), then the summary (status, wall time, steps) and the manifest.
:class:`Lines` turns history rows into those lines; :mod:`phalanx.fit.exports._live` feeds the sinks.

Example::

    >>> import numpy as np
    >>> lines = Lines(world_size=2)
    >>> new = lines.add({"rank": np.array([0, 1]), "step": np.array([1, 1]),
    ...                  "t": np.array([5.0, 5.5]), "loss": np.array([1.0, 3.0])})
    >>> [(s.tag, s.steps.tolist(), s.values.tolist()) for s in new]
    [('loss/rank0', [1], [1.0]), ('loss/rank1', [1], [3.0]), ('loss/mean', [1], [2.0])]
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import numpy as np

from ..telemetry._digest import RankMeans
from ..run._fit_options import FitUsageError

_BASE = ("rank", "step", "t")
_KEPT_STEP_TIMES = 8192      # steps whose latest row time is remembered for the mean lines


class MissingExtra(FitUsageError, ImportError):
    """An export was asked for without its optional package installed."""


class ExportWarning(UserWarning):
    """Writing a run to TensorBoard or MLflow failed; the run itself went on."""


def require(module: str, extra: str, asked_by: str) -> Any:
    """Import ``module`` or say in one line which extra installs it.

    Example: ``require("tensorboardX", "tensorboard", "--tensorboard")``
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"{asked_by} needs the {module} package: pip install "
                           f"'phalanx[{extra}]'") from None


@dataclass
class Series:
    """New points of one line (``loss/rank0``, ``loss/mean``): steps, values, wall times (s)."""

    tag: str
    steps: np.ndarray
    values: np.ndarray
    times: np.ndarray


@dataclass
class RunInfo:
    """What a sink is told when the run begins."""

    run_id: str
    name: str
    world_size: int
    params: dict[str, Any]     # the run's options, flat (see option_params)
    started: float             # wall time (s)


class Sink(Protocol):
    """Where a run is written (one TensorBoard directory, one MLflow run)."""

    what: str  # "TensorBoard", "MLflow": named in a failure's warning

    def begin(self, run: RunInfo) -> None: ...
    def write(self, lines: list[Series]) -> None: ...
    def end(self, summary: dict[str, Any], manifest: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...


def option_params(opts: Any) -> dict[str, Any]:
    """A run's options as flat hyperparameters (``sync``, ``sync_params.every``, ``seed``...):
    numbers, strings and booleans; options left unset are left out.

    Example: ``option_params(FitOptions.build(seed=3))["seed"] == 3``
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(opts):
        value = getattr(opts, f.name)
        if dataclasses.is_dataclass(value):  # the TrainOptions every rank acts on
            for g in dataclasses.fields(value):
                _put(out, g.name, getattr(value, g.name))
        elif f.name not in ("tensorboard", "mlflow", "extra"):  # where it goes is not a parameter
            _put(out, f.name, value)
    return out


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _put(out, f"{key}.{k}", v)
    elif value is None or value == ():
        return
    elif isinstance(value, (tuple, list)):
        out[key] = ",".join(map(str, value))
    elif isinstance(value, (bool, int, float, str)):
        out[key] = value
    else:
        out[key] = str(value)


def run_summary(record: Any) -> dict[str, Any]:
    """What a sink writes at the end: status, wall time, steps per rank, rows."""
    return {"status": record.status, "wall_s": float(record.wall_s),
            "steps": {int(r): int(s) for r, s in sorted(record.steps.items())},
            "rows": len(record.history)}


class Lines:
    """Turns history rows (by column) into the lines a sink writes: one per metric and rank,
    and the mean over ranks per step once every rank logged the step or moved past it."""

    def __init__(self, world_size: int) -> None:
        self.means = RankMeans(world_size)
        self._step_times: dict[int, float] = {}   # step -> its latest row's time

    def add(self, columns: Mapping[str, np.ndarray]) -> list[Series]:
        ranks, steps, times = columns["rank"], columns["step"], columns["t"]
        if not len(ranks):
            return []
        metrics = {k: v for k, v in columns.items() if k not in _BASE}
        out = []
        for name, values in metrics.items():
            logged = ~np.isnan(values)
            for rank in np.unique(ranks[logged]).tolist():
                rows = logged & (ranks == rank)
                out.append(Series(f"{name}/rank{rank}", steps[rows], values[rows], times[rows]))
        self._note_times(steps, times)
        return out + self._mean_lines(self.means.add(ranks, steps, metrics), times[-1])

    def finish(self) -> list[Series]:
        """The run is over: the means of the steps still open."""
        return self._mean_lines(self.means.finish(), time.time())

    def _note_times(self, steps: np.ndarray, times: np.ndarray) -> None:
        order = np.argsort(steps, kind="stable")
        unique, first = np.unique(steps[order], return_index=True)
        latest = np.maximum.reduceat(times[order], first)
        known = self._step_times
        for step, t in zip(unique.tolist(), latest.tolist()):
            if t > known.get(step, -np.inf):
                known[step] = t
        if len(known) > _KEPT_STEP_TIMES:  # long settled: the oldest half goes
            for step in list(known)[:len(known) // 2]:
                del known[step]

    def _mean_lines(self, settled: Mapping[str, np.ndarray], fallback: float) -> list[Series]:
        out = []
        for name, rows in settled.items():   # rows of (mean, step), in step order
            steps = rows[:, 1].astype(np.int64)
            times = np.array([self._step_times.get(s, fallback) for s in steps.tolist()])
            out.append(Series(f"{name}/mean", steps, rows[:, 0], times))
        return out
