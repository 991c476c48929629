"""Engine runtime: what a ``%%distributed_fit`` cell can use on the engines.

Imports neither IPython nor ipywidgets: it runs in plain engine processes.
"""

from ._collectives import allreduce, barrier, broadcast
from ._hooks import no_sync, wrap
from ._resume import steps
from ._state import NotInRunError, current_run

__all__ = ["log", "allreduce", "broadcast", "barrier", "wrap", "no_sync", "bytes_sent", "steps",
           "NotInRunError"]


def log(**metrics: object) -> None:
    """Record a row of metrics for this rank at the current optimizer step.

    Values must be single numbers (Python numbers, 0-d or one-element tensors/arrays); others are
    left out of the row with a warning naming the metric.  Never blocks on the notebook.

    Example (inside ``%%distributed_fit``)::

        log(loss=loss.item(), lr=opt.param_groups[0]["lr"])
    """
    run = current_run()
    run.log_calls += 1
    # With no optimizer step yet (or none at all) the row is placed by its log call number.
    step = run.steps if run.strategies or run.steps else run.log_calls
    run.metrics.record(step, metrics)


def bytes_sent() -> int:
    """Payload bytes this rank has sent through phalanx collectives in the current run.

    Counted as a bandwidth-optimal algorithm would send them (an allreduce of N bytes on n ranks
    counts N * 2(n-1)/n), so strategies compare fairly whatever the transport.

    Example (inside ``%%distributed_fit``)::

        log(loss=loss.item(), mbytes=bytes_sent() / 1e6)
    """
    run = current_run()
    return run.collectives.bytes_sent - run.bytes_at_start
