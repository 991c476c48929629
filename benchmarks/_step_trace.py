"""The Python work of a training step, counted: a measure no busy machine can move.

A run's own cost per step is Python (phalanx's hooks, and the branches torch takes because
hooks are registered); torch's C++ work is the same in every place.  Counting the bytecodes and
function calls the training thread executes per step, under ``sys.settrace``, gives that cost
as a number that is the same on every run of the same code, where a CPU-time figure of the
same step moves by more than the 3% in question.  The tracer's own slowness does not matter:
only counts are kept.

Imported on the engines, like ``_step_cost_loop``.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

# where a frame's code lives, from its file name: phalanx's, torch's, or anything else
_PLACES = (("phalanx", ("/phalanx/",)), ("torch", ("/torch/",)))


def place_of(filename: str) -> str:
    """Which code a frame runs.

    >>> place_of("/x/kernel_ext/phalanx/runtime/sync/_zero_change.py"), place_of("/s/torch/nn/modules/module.py")
    ('phalanx', 'torch')
    >>> place_of("<distributed_fit>")
    'other'
    """
    for place, marks in _PLACES:
        if any(mark in filename for mark in marks):
            return place
    return "other"


def traced_work(step: Callable[[], Any], steps: int) -> dict[str, Any]:
    """Bytecodes and Python calls per step of ``step()``, run ``steps`` times on this thread,
    split by whose code ran (:func:`place_of`)."""
    opcodes: dict[str, int] = {}
    calls: dict[str, int] = {}
    places: dict[Any, str] = {}  # code object -> place, looked up once per code object

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            place = places[frame.f_code]
            opcodes[place] = opcodes.get(place, 0) + 1
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        place = places.get(code)
        if place is None:
            place = places[code] = place_of(code.co_filename)
        calls[place] = calls.get(place, 0) + 1
        frame.f_trace_opcodes = True
        return local

    sys.settrace(tracer)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.settrace(None)
    return {"opcodes": {p: n / steps for p, n in opcodes.items()},
            "calls": {p: n / steps for p, n in calls.items()}}


def tiny_step_work(net: Any, steps: int) -> dict[str, Any]:
    """:func:`traced_work` of the fixed-cost benchmark's step (``_step_cost_loop.tiny_step_us``:
    the MLP with layers two wide), after 20 untraced steps that let the run's one-off work
    (broadcasts, discovering the model) happen first."""
    from _step_cost_loop import tiny_step_parts

    opt, loss_fn, xb, yb = tiny_step_parts(net)

    def step() -> None:
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()

    for _ in range(20):
        step()
    return traced_work(step, steps)


def added(in_run: dict[str, Any], in_engine: dict[str, Any]) -> dict[str, Any]:
    """What the run adds per step: its counts less the engine's, per kind and place.

    >>> added({"opcodes": {"phalanx": 90.0, "torch": 410.0}, "calls": {"torch": 12.0}},
    ...       {"opcodes": {"torch": 400.0}, "calls": {"torch": 12.0}})
    {'opcodes': {'phalanx': 90.0, 'torch': 10.0, 'total': 100.0}, 'calls': {'torch': 0.0, 'total': 0.0}}
    """
    out: dict[str, Any] = {}
    for kind in ("opcodes", "calls"):
        run, engine = in_run[kind], in_engine[kind]
        diff = {p: run.get(p, 0.0) - engine.get(p, 0.0) for p in sorted(set(run) | set(engine))}
        diff["total"] = sum(diff.values())
        out[kind] = diff
    return out
