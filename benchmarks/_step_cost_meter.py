"""The run's own per-step CPU cost split by component, measured on an engine: each method of
phalanx's that runs in a training step is wrapped with a CPU-time meter for one run.

Times are exclusive (a hook's time less that of the metered calls inside it), so the
components add up to the metered total.  The meter costs two clock reads a call, which the
benchmark reports as its own line; the run's total cost is measured without the meter.

``install(clock="wall")`` meters elapsed time instead: on a GPU a call that waits for the device
(a synchronisation) costs the step its wait, which the thread's CPU clock may not count.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable

# component -> (module, attribute path) of each callable that runs inside a training step
COMPONENTS: dict[str, list[tuple[str, str]]] = {
    "optimizer step hooks": [("phalanx.runtime.sync._zero_change", "StepHooks._before_step"),
                             ("phalanx.runtime.sync._zero_change", "StepHooks._after_step"),
                             ("phalanx.runtime.sync._zero_change", "StepHooks._framework_owned")],
    "gradient hooks": [("phalanx.runtime.sync._grad_sync", "GradientSync._on_grad"),
                       ("phalanx.runtime.sync._grad_sync", "GradientSync._on_forward"),
                       ("phalanx.runtime.sync._grad_sync", "GradientSync.check_closed"),
                       ("phalanx.runtime.sync._grad_sync", "GradientSync.refresh"),
                       ("phalanx.runtime.sync._grad_sync", "GradientSync.step_ended")],
    "training watch": [("phalanx.runtime.sync._training_watch", "TrainingWatch.before_backward"),
                       ("phalanx.runtime.sync._training_watch", "TrainingWatch._on_forward"),
                       ("phalanx.runtime.sync._forward_watch", "ForwardWatch._discover"),
                       ("phalanx.runtime.sync._forward_watch", "ForwardWatch._own")],
    "guard": [("phalanx.runtime.sync._zero_change", "check_every_steps")],
    "metrics and step clock": [("phalanx.runtime.telemetry._metrics", "MetricsSender.set_step"),
                               ("phalanx.runtime.telemetry._timing", "StepClock.mark"),
                               ("phalanx.runtime.telemetry._timing", "StepClock.step_end")],
}

_spent: dict[str, int] = {}
_calls: dict[str, int] = {}
_stack: list[list[int]] = []  # [started, children's time] of each metered call in progress
_undo: list[Callable[[], None]] = []
_CLOCKS = {"thread": time.thread_time_ns, "wall": time.perf_counter_ns}
_clock: list[Callable[[], int]] = [time.thread_time_ns]


def _metered(component: str, fn: Callable) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        clock = _clock[0]
        frame = [clock(), 0]
        _stack.append(frame)
        try:
            return fn(*args, **kwargs)
        finally:
            _stack.pop()
            spent = clock() - frame[0]
            _spent[component] = _spent.get(component, 0) + spent - frame[1]
            _calls[component] = _calls.get(component, 0) + 1
            if _stack:
                _stack[-1][1] += spent

    return call


def install(clock: str = "thread") -> None:
    """Wrap every component's callables (on this engine, before a run starts), timed by
    ``clock``: the thread's CPU time, or ``"wall"``."""
    remove()
    _clock[0] = _CLOCKS[clock]
    _spent.clear()
    _calls.clear()
    for component, places in COMPONENTS.items():
        for module_name, path in places:
            owner: Any = importlib.import_module(module_name)
            *outer, name = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            original = owner.__dict__[name]
            setattr(owner, name, _metered(component, original))
            _undo.append(lambda owner=owner, name=name, original=original:
                         setattr(owner, name, original))


def remove() -> None:
    while _undo:
        _undo.pop()()


def read(steps: int) -> dict[str, dict[str, float]]:
    """Per step: each component's CPU microseconds and calls; then remove the meter."""
    remove()
    return {c: {"us": _spent.get(c, 0) / steps / 1e3, "calls": _calls.get(c, 0) / steps}
            for c in COMPONENTS}


def meter_cost(calls: int = 20000) -> float:
    """Microseconds the meter adds to one metered call (its two clock reads and bookkeeping),
    by the thread's CPU clock."""
    def nothing() -> None:
        return None

    metered = _metered("meter", nothing)
    started = time.thread_time_ns()
    for _ in range(calls):
        metered()
    spent = time.thread_time_ns() - started
    started = time.thread_time_ns()
    for _ in range(calls):
        nothing()
    return (spent - (time.thread_time_ns() - started)) / calls / 1e3
