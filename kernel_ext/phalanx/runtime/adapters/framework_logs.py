"""What a training framework logs reaches the run's live views, without a ``log()`` call.

Hugging Face's ``Trainer.log``, Lightning's logger connector (what ``self.log`` ends in, at the
``log_every_n_steps`` the user set) and ``Accelerator.log`` each get, for the length of a run, a
thin wrapper that records the numbers they were given into this rank's metric rows (as
``log(**numbers)`` would) and then calls the framework as before.  The framework's own loggers,
callbacks and trackers see exactly what they saw without phalanx.  Where the framework knows how
many optimizer steps the run will take, the views get it too (progress bars and ETA without
``--steps``).

A framework imported by the cell itself is wrapped as soon as its module has loaded (a one-shot
import watch per module); one already loaded is wrapped at the run's start.  The wrappers go at
the run's end, whatever happened in it.

Recording happens on every rank: Hugging Face and Lightning call their logging on every rank
(the values are already reduced across ranks where the framework reduces them), and accelerate's
``log`` is the user's call with the rank's own values.

Example (the engine runtime, around the cell)::

    undo = watch_framework_logs(run)
    try:
        exec(code, namespace)      # Trainer(...).train() -> rows "loss", "learning_rate", ...
    finally:
        undo()
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

from ._import_watch import when_loaded
from ..telemetry._metrics import to_number
from . import Adapter

# Hugging Face's end-of-training summary (``speed_metrics``, ``total_flos``): one value each, which
# would only add empty curves; the run view shows the run's own timing.
_SUMMARY_SUFFIXES = ("_runtime", "_per_second")
_SUMMARY_NAMES = frozenset({"total_flos", "step"})


def _numbers(values: Any) -> dict[str, float]:
    """The single numbers among ``values``; anything else a framework logs (strings, lists,
    images) is not a curve and is left out without a word (it is the framework's, not the
    user's, to fix)."""
    out: dict[str, float] = {}
    if not isinstance(values, dict):
        return out
    for name, value in values.items():
        if not isinstance(name, str) or name in _SUMMARY_NAMES or name.endswith(_SUMMARY_SUFFIXES):
            continue
        number = to_number(value)
        if number is not None and math.isfinite(number):
            out[name] = number
    return out


def _total_of_trainer(trainer: Any) -> int | None:
    """Hugging Face: the optimizer steps the training will take (known once it started)."""
    state = getattr(trainer, "state", None)
    steps = getattr(state, "max_steps", None)
    return steps if isinstance(steps, int) and steps > 0 else None


def _total_of_lightning(connector: Any) -> int | None:
    """Lightning: the optimizer steps ``fit`` will take (infinite for an iterable without
    length: then none)."""
    try:
        steps = connector.trainer.estimated_stepping_batches
    except Exception:  # not fitting (validate/test), or a loader without a length
        return None
    return int(steps) if isinstance(steps, (int, float)) and math.isfinite(steps) and steps > 0 \
        else None


_Total = Callable[[Any], "int | None"]

# (module, class, method wrapped, its argument with the values, how to read the run's total
# optimizer steps from the method's object)
_TARGETS: tuple[tuple[str, str, str, str, _Total | None], ...] = (
    ("transformers.trainer", "Trainer", "log", "logs", _total_of_trainer),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector",
     "_LoggerConnector", "log_metrics", "metrics", _total_of_lightning),
    ("pytorch_lightning.trainer.connectors.logger_connector.logger_connector",
     "_LoggerConnector", "log_metrics", "metrics", _total_of_lightning),
    ("accelerate.accelerator", "Accelerator", "log", "values", None),
)


class _FrameworkLogs:
    """One run's wrappers: which classes were wrapped, and how to take each wrapper back."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.active = True
        self.undo: list[Callable[[], None]] = []

    def start(self) -> None:
        for module_name, class_name, method, argument, total in _TARGETS:
            self.undo.append(when_loaded(module_name, functools.partial(
                self.wrap, class_name, method, argument, total)))

    def wrap(self, class_name: str, method: str, argument: str, total: _Total | None,
             module: Any) -> None:
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type) or not self.active:
            return
        original = cls.__dict__.get(method)
        if original is None or getattr(original, "_phalanx_records", False):
            return
        record = self.record

        @functools.wraps(original)
        def logged(obj: Any, *args: Any, **kwargs: Any) -> Any:
            record(args[0] if args else kwargs.get(argument), obj, total)
            return original(obj, *args, **kwargs)

        logged._phalanx_records = True  # type: ignore[attr-defined]
        setattr(cls, method, logged)
        self.undo.append(functools.partial(_restore, cls, method, logged, original))

    def record(self, values: Any, obj: Any, total: _Total | None) -> None:
        """Put the framework's numbers in this rank's rows, at the run's current step (the
        framework logs after its optimizer step, which phalanx has counted)."""
        metrics = getattr(self.run, "metrics", None)
        if not self.active or metrics is None:
            return
        if total is not None and getattr(metrics, "total", None) is None:
            steps = total(obj)
            if steps is not None:
                metrics.set_total(steps)
        numbers = _numbers(values)
        if numbers:
            run = self.run
            run.log_calls += 1
            metrics.record(run.steps if run.steps else run.log_calls, numbers)

    def stop(self) -> None:
        self.active = False
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()


def _restore(cls: type, method: str, installed: Any, original: Any) -> None:
    if cls.__dict__.get(method) is installed:  # not replaced since by someone else
        setattr(cls, method, original)


def watch_framework_logs(run: Any) -> Callable[[], None]:
    """Record what the frameworks log during ``run``; returns the function that stops it."""
    logs = _FrameworkLogs(run)
    logs.start()
    return logs.stop


ADAPTER = Adapter("framework logs", "the frameworks' logging methods",
                  lambda run, namespace, shard: watch_framework_logs(run))
