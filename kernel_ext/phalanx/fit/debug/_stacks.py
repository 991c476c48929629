"""``%cluster stacks``: every rank's Python stack at this moment, in words.

During a run each engine's shell is busy with it, so the request goes on ipyparallel's control
channel, which a thread of the engine serves (see ``runtime/debug/_stacks.py``); an idle engine is
asked with an ordinary call.  Every engine is asked at once and given :data:`ANSWER_S`; one
that does not answer in time (stuck in native code that holds the GIL, or gone) is said so.
Nothing is stopped or interrupted.

Example::

    print(describe_stacks(cluster.slots(), ask_stacks(cluster, cluster.slots(), busy=True)))
"""

from __future__ import annotations

import time
from typing import Any

from ...cluster._engine_views import engine_view
from ...wire._seam import CELL_FILENAME
from ..run._engine_control import ask_engines

ANSWER_S = 1.5  # every engine together: the whole answer stays within 2 s


def ask_stacks(cluster: Any, slots: list, busy: bool, timeout: float = ANSWER_S) -> list[dict | None]:
    """Each slot's stack (``runtime._stacks.rank_stack``'s data), None where no answer came."""
    from ...runtime import stack_when_idle
    from ...wire._control_requests import STACKS_REQUEST

    if busy:
        return ask_engines(cluster, [s.engine_id for s in slots], STACKS_REQUEST, {}, timeout)
    calls = []
    for slot in slots:
        try:
            calls.append(engine_view(cluster.client, slot.engine_id).apply_async(stack_when_idle))
        except Exception:  # an engine gone between the listing and the call
            calls.append(None)
    deadline = time.monotonic() + timeout
    return [_result(call, deadline) for call in calls]


def _result(call: Any, deadline: float) -> dict | None:
    try:
        return call.get(timeout=max(0.0, deadline - time.monotonic())) if call else None
    except Exception:
        return None


def describe_stacks(slots: list, stacks: list[dict | None], ranks: list[int] | None = None) -> str:
    """One block per rank: where it is, the collective it waits in, its frames (``ranks``: the
    slots' ranks where they are not 0, 1, ...)."""
    blocks = []
    for rank, slot, stack in zip(ranks or range(len(slots)), slots, stacks):
        where = f"rank {rank} (engine {slot.engine_id} on host {slot.host}, pid {slot.pid})"
        if stack is None:
            blocks.append(f"{where}: no answer within {ANSWER_S:g} s (gone, or stuck in native "
                          "code that holds the interpreter)")
            continue
        blocks.append(f"{where}: {_state(stack)}\n" + _frames(stack["frames"]))
    return "\n".join(blocks)


def _state(stack: dict) -> str:
    if not stack["in_run"]:
        return "idle (no run)"
    waiting = stack.get("waiting")
    step = f"step {stack['step']}"
    if waiting:
        return (f"{step}, waiting {waiting['waited_s']:.1f} s in {waiting['what']} (its "
                f"--collective-timeout ends in {max(0.0, waiting['deadline_in_s']):.0f} s)")
    return f"{step}, running (not in a collective)"


def _frames(frames: list) -> str:
    """The frames as Python prints them; below the cell, only the call into a library (its
    internals say nothing a person can act on)."""
    lines = []
    for i, (filename, lineno, name, line, library) in enumerate(frames):
        lines.append(f'    File "{filename}", line {lineno}, in {name}')
        if line:
            lines.append(f"      {line}")
        below_cell = library and any(f[0] == CELL_FILENAME for f in frames[:i])
        if below_cell and i < len(frames) - 1:
            lines.append(f"      ... {len(frames) - i - 1} frame(s) inside it")
            break
    return "\n".join(lines)
