"""Engine runtime: what a ``%%distributed_fit`` cell can use on the engines.

Imports neither IPython nor ipywidgets: it runs in plain engine processes.

How the engines exchange arrays (shared memory, torch.distributed, MPI) is in
:mod:`.transport`; the modules here are what a cell's run uses: hooks, collectives, checkpoints.

Your own sync strategy
----------------------
Subclass :class:`SyncStrategy` and override its hooks (``start``, ``before_step`` after
backward, ``after_step`` after ``opt.step()``, ``finish``).  ``self.comm`` is the run's
:class:`Communicator` (``allreduce``, ``broadcast``, ``barrier`` on lists of tensors/arrays, in
place); ``param_values(params)`` and ``param_grads(params)`` are the arrays to reduce;
``latest_metrics()`` is what this rank last logged with ``log()``.  Every rank must make the same
collective calls in the same order, so decide *when* from the step, from ``self.every`` /
``self.alpha`` (``--every``, ``--alpha``), or from values first agreed through ``self.comm``.
Define the class in a notebook cell and pass its name: ``%%distributed_fit --sync EveryThird``.

Example (two ranks as threads, with the in-process communicator used for testing strategies)::

    >>> import threading, numpy as np
    >>> from phalanx import SyncStrategy, param_values
    >>> from phalanx.runtime.transport._comm import make_thread_communicators
    >>> class EveryThird(SyncStrategy):
    ...     def after_step(self, params, step):
    ...         if step % 3 == 2:
    ...             self.comm.allreduce(param_values(params), op="mean")
    >>> comms = make_thread_communicators(2)
    >>> ws = [np.array([float(c.rank)]) for c in comms]
    >>> def train(comm, w):
    ...     strategy = EveryThird(comm)
    ...     for step in range(3):
    ...         w += 1.0                      # a local optimizer step
    ...         strategy.after_step([w], step)
    >>> threads = [threading.Thread(target=train, args=cw) for cw in zip(comms, ws)]
    >>> for t in threads: t.start()
    >>> for t in threads: t.join()
    >>> [w.item() for w in ws]
    [3.5, 3.5]

The kernel's side
-----------------
A run crosses to the engines as one :class:`RunSpec` per rank and comes back as one
:class:`RankResult` per rank (see :mod:`phalanx.wire._seam`); ``run_cell`` (which first stores the shipped
objects the engine lacks), ``cached_hashes`` and ``held_commits`` are what the kernel calls on an
engine.  They are not for cells, and the engine calls load on first use.
"""

from importlib import import_module
from time import perf_counter as _perf_counter
from typing import TYPE_CHECKING

from ..wire._seam import CheckpointSpec as CheckpointSpec
from ..wire._seam import GroupSpec as GroupSpec
from ..wire._seam import Outcome as Outcome
from ..wire._seam import RankResult as RankResult
from ..wire._seam import ResumePlan as ResumePlan
from ..wire._seam import RunSpec as RunSpec
from .run._engine_state import NotInRunError, current_run

if TYPE_CHECKING:  # loaded on first use (below); named here for type checkers
    from .sync._collectives import allreduce as allreduce
    from .sync._collectives import barrier as barrier
    from .sync._collectives import broadcast as broadcast
    from .sync._zero_change import no_sync as no_sync
    from .sync._zero_change import wrap as wrap
    from .commits._resume import steps as steps
    from .commits._resume import held_commits as held_commits
    from .run._entry import cached_hashes as cached_hashes
    from .run._entry import run_cell as run_cell
    from .run._kept_objects import forget_kept as forget_kept
    from .run._unreturned import notice as notice
    from .run._device_rule import pinning_env as pinning_env
    from .debug._post_mortem import open_post_mortem as open_post_mortem
    from .debug._post_mortem import post_mortem_command as post_mortem_command
    from .debug._stacks import stack_when_idle as stack_when_idle
    from .debug._breakpoints import breakpoint_on as breakpoint_on
    from .telemetry._memory import memory_sample as memory_sample
    from .sync._strategies import SyncStrategy as SyncStrategy
    from .sync._strategies import param_grads as param_grads
    from .sync._strategies import param_values as param_values
    from .transport._comm import Communicator as Communicator

__all__ = ["log", "allreduce", "broadcast", "barrier", "wrap", "no_sync", "bytes_sent", "steps",
           "latest_metrics", "SyncStrategy", "param_values", "param_grads", "Communicator",
           "NotInRunError"]

# What a cell calls, loaded on its first use (``from phalanx import allreduce`` in the cell):
# their modules import numpy, and importing phalanx must stay cheap (the kernel's
# ``%load_ext`` and every engine's start import it).
_CELL_API = {"allreduce": ".sync._collectives", "barrier": ".sync._collectives",
             "broadcast": ".sync._collectives", "wrap": ".sync._zero_change", "no_sync": ".sync._zero_change",
             "steps": ".commits._resume"}
# What a strategy needs, loaded on first use like the cell's calls.
_STRATEGY_API = {"SyncStrategy": ".sync._strategies", "param_values": ".sync._strategies",
                 "param_grads": ".sync._strategies",
                 "Communicator": ".transport._comm"}
# What the kernel calls on an engine, loaded on first use like the strategy API.
_ENGINE_CALLS = {"run_cell": ".run._entry", "cached_hashes": ".run._entry",
                 "held_commits": ".commits._resume", "forget_kept": ".run._kept_objects",
                 "notice": ".run._unreturned", "open_post_mortem": ".debug._post_mortem",
                 "post_mortem_command": ".debug._post_mortem", "stack_when_idle": ".debug._stacks",
                 "memory_sample": ".telemetry._memory", "pinning_env": ".run._device_rule",
                 "breakpoint_on": ".debug._breakpoints"}


def __getattr__(name: str) -> object:
    module = _CELL_API.get(name) or _STRATEGY_API.get(name) or _ENGINE_CALLS.get(name)
    if module is not None:
        return getattr(import_module(module, __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def log(**metrics: object) -> None:
    """Record a row of metrics for this rank at the current optimizer step.

    Values must be single numbers (Python numbers, 0-d or one-element tensors/arrays); others are
    left out of the row with a warning naming the metric.  Never blocks on the notebook.

    Example (inside ``%%distributed_fit``)::

        log(loss=loss.item(), lr=opt.param_groups[0]["lr"])
    """
    began = _perf_counter()
    run = current_run()
    run.log_calls += 1
    # With no optimizer step yet (or none at all) the row is placed by its log call number.
    step = run.steps if run.strategies or run.steps else run.log_calls
    assert run.metrics is not None   # set as the run starts
    run.metrics.record(step, metrics)
    clock = getattr(run.metrics, "clock", None)
    if clock is not None:
        clock.logged(began, _perf_counter())


def latest_metrics() -> dict[str, float]:
    """The last value of each metric this rank logged with ``log()`` in the current run.

    For sync strategies that decide from the loop's metrics.  The values are this rank's own:
    agree on them through the communicator before they choose a collective, or the ranks would
    call different ones.  A loop that logs after ``opt.step()`` is seen by the next step's hooks.

    Example (a strategy that averages parameters only while the loss is not improving)::

        class SyncOnPlateau(SyncStrategy):
            best = float("inf")
            def after_step(self, params, step):
                loss = np.array([latest_metrics().get("loss", np.inf)])
                self.comm.allreduce(loss, op="mean")          # one number: every rank agrees
                if loss.item() > 0.99 * self.best:
                    self.comm.allreduce(param_values(params), op="mean")
                self.best = min(self.best, loss.item())
    """
    run = current_run()
    return dict(getattr(run.metrics, "latest", None) or {})


def bytes_sent() -> int:
    """Payload bytes this rank has sent through phalanx collectives in the current run.

    Counted as a bandwidth-optimal algorithm would send them (an allreduce of N bytes on n ranks
    counts N * 2(n-1)/n), so strategies compare fairly whatever the transport.

    Example (inside ``%%distributed_fit``)::

        log(loss=loss.item(), mbytes=bytes_sent() / 1e6)
    """
    run = current_run()
    assert run.collectives is not None   # set as the run starts
    return run.collectives.bytes_sent - run.bytes_at_start
