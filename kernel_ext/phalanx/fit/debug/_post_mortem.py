"""``%debug`` after a failed run: a debugger on the failing rank's frames, typed in the notebook.

A rank that raised keeps its frames on its engine until the next run (see
``runtime/debug/_post_mortem.py``).  The run's error carries a :class:`DebugTarget` (which run, its
engines, the ranks whose frames are kept) and says that ``%debug`` is available.  ``%debug``
then reads each line with ``input()`` (the notebook's input box, through the kernel's stdin
channel) and sends it to that rank's engine, which is idle: one call per line, its printed
output shown as the answer.

Example::

    error.debug_target = attach_post_mortem(error, run_id, slots, results)
    post_mortem(cluster, error.debug_target, rank=None)   # the failing rank, until `q`
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ...cluster._engine_views import engine_view
from ...wire._seam import RankResult
from ..run._engine_calls import registered

# A debugger command normally answers in milliseconds; one that evaluates something slow is
# the person's to interrupt, so the wait is long.
COMMAND_TIMEOUT_S = 3600.0


class DebugUnavailable(RuntimeError):
    """``%debug`` cannot open on the rank asked for; the message says why and what to do."""


@dataclass(frozen=True)
class DebugTarget:
    """What ``%debug`` needs of a failed run: its id, its engines, the ranks it can open."""

    run_id: str
    slots: tuple[Any, ...]
    ranks: tuple[int, ...]          # ranks whose engines keep the failure's frames
    rank: int                       # the rank at fault (the default)


def attach_post_mortem(error: Exception, run_id: str, slots: list,
                       results: Mapping[int, RankResult]) -> DebugTarget | None:
    """Give the run's error its :class:`DebugTarget` and a line saying ``%debug`` is there."""
    ranks = tuple(sorted(r for r, res in results.items() if res.debuggable))
    if not ranks:
        return None
    rank = getattr(error, "rank", None)
    target = DebugTarget(run_id, tuple(slots), ranks, rank if rank in ranks else ranks[0])
    others = [r for r in ranks if r != target.rank]
    hint = (f"\n%debug opens a debugger in rank {target.rank}'s frames (kept on its engine "
            "until the next run)")
    if others:
        hint += f"; %debug --rank {others[0]} opens rank {others[0]}'s"
    error.args = (error.args[0] + hint, *error.args[1:])
    error.debug_target = target  # type: ignore[attr-defined]
    return target


def post_mortem(cluster: Any, target: DebugTarget, rank: int | None,
                read: Callable[[str], str] | None = None,
                write: Callable[[str], None] = print) -> None:
    """Run the debugger on ``rank`` (default: the rank at fault) until ``q``; ``read`` is the
    notebook's ``input``."""
    from ...runtime import open_post_mortem, post_mortem_command

    rank = target.rank if rank is None else rank
    slot = _slot_of(cluster, target, rank)
    read = read or _notebook_input
    write(_call(cluster, slot, rank, open_post_mortem, target.run_id).rstrip("\n"))
    done = False
    while not done:
        try:
            line = read("(Pdb) ")
        except (EOFError, KeyboardInterrupt):  # the input box closed, or the kernel interrupted
            line = "q"
        text, done = _call(cluster, slot, rank, post_mortem_command, target.run_id, line)
        if text:
            write(text.rstrip("\n"))


def _slot_of(cluster: Any, target: DebugTarget, rank: int) -> Any:
    if rank not in range(len(target.slots)):
        raise DebugUnavailable(f"%debug --rank {rank}: the failed run had ranks 0.."
                               f"{len(target.slots) - 1}")
    if rank not in target.ranks:
        kept = ", ".join(map(str, target.ranks))
        raise DebugUnavailable(f"rank {rank} did not raise in the failed run, so it has no "
                               f"frames to debug; ranks with frames: {kept} (%debug --rank R)")
    slot = target.slots[rank]
    held = {s.slot_id for s in cluster.slots()} if cluster.running else set()
    if slot.slot_id not in held or not registered(cluster, slot.engine_id):
        raise DebugUnavailable(f"rank {rank}'s engine is gone (restarted, scaled away or "
                               "stopped), and its frames with it")
    return slot


def _call(cluster: Any, slot: Any, rank: int, fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` on the rank's (idle) engine; its refusal becomes :class:`DebugUnavailable`."""
    try:
        return engine_view(cluster.client, slot.engine_id).apply_async(fn, *args).get(
            timeout=COMMAND_TIMEOUT_S)
    except Exception as exc:
        if getattr(exc, "ename", None) == "NoFramesError":
            raise DebugUnavailable(f"rank {rank}: {getattr(exc, 'evalue', exc)}") from None
        raise DebugUnavailable(f"rank {rank}'s engine did not answer the debugger: "
                               f"{type(exc).__name__}: {exc}") from None


def _notebook_input(prompt: str) -> str:
    # looked up at each call: ipykernel puts its own input (the notebook's input box) in builtins
    import builtins

    return builtins.input(prompt)
