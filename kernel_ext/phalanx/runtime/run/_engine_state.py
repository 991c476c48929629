"""Per-engine-process state of the runtime (one engine process is one rank at a time).

An engine is a long-lived process that runs many cells; what must survive between cells (the
warm process group, the shipped-object cache) lives in the one :class:`EngineState` of the
process, reached through :func:`engine_state`.  What belongs to one cell lives in a
:class:`RunContext` that is set while the cell runs and cleared after.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..commits._commits import CommitStore
from ..telemetry._memory import RunGarbage
from ...wire._options import TrainOptions
from ._patch_ledger import PatchLedger

if TYPE_CHECKING:
    import torch

    from ..commits._resume import Checkpointer
    from ..debug._breakpoints import PausedDebugger
    from ..debug._post_mortem import FailureFrames
    from ..sync._collectives import Collectives
    from ..sync._grad_sync import GradientSync
    from ..sync._join import JoinControl
    from ..sync._strategies import SyncStrategy
    from ..sync._training_watch import TrainingWatch
    from ..telemetry._metrics import MetricsSender
    from ...wire._seam import RunSpec
    from ._group import GroupHandle
    from ._interrupts import InterruptGate


class NotInRunError(RuntimeError):
    """A runtime helper was called outside a ``%%distributed_fit`` cell."""


@dataclass
class RunContext:
    """What the runtime knows about the cell being run on this engine."""

    run_id: str
    rank: int
    world_size: int
    device: torch.device
    strategy_spec: str | type[SyncStrategy] = "allreduce"    # a built-in name, "pkg.mod.Class", or a shipped class
    # How every rank trains, as the kernel sent it (the spec's own TrainOptions, not a copy)
    train: TrainOptions = field(default_factory=TrainOptions)
    spec: RunSpec | None = None         # the RunSpec this run was started from
    steps: int = 0                      # optimizer steps (or partial_fit calls) so far
    passes: int = 0                     # backward passes whose gradients were averaged
    log_calls: int = 0
    metrics: MetricsSender | None = None  # MetricsSender
    collectives: Collectives | None = None  # Collectives (dispatching communicator)
    ddp_param_ids: set[int] = field(default_factory=set)
    # id(optimizer or estimator) -> strategy
    strategies: dict[int, SyncStrategy] = field(default_factory=dict)
    # (strategy, params_fn) for finish()
    tracked: list[tuple[SyncStrategy, Callable[[], list]]] = field(default_factory=list)
    # what the run changed in other libraries, undone at its end (see _patch_ledger)
    patches: PatchLedger = field(default_factory=PatchLedger)
    bytes_at_start: int = 0             # the communicators' counter when the run began
    abort: threading.Event = field(default_factory=threading.Event)
    namespace: dict = field(default_factory=dict)    # the cell's globals (what commits save)
    checkpoints: Checkpointer | None = None  # Checkpointer with --checkpoint-every / --resume
    join: JoinControl | None = None     # JoinControl: uneven inputs (see _join)
    grad_sync: GradientSync | None = None  # GradientSync: averaging at the end of backward
    watch: TrainingWatch | None = None  # TrainingWatch: finds what trains (see _training_watch)
    agreement: str = "at_end"           # the strategy's promise (SyncStrategy.agreement)
    interrupts: InterruptGate | None = None  # InterruptGate: defers an interrupt during an update
    debugger: PausedDebugger | None = None  # PausedDebugger once the cell called breakpoint()


    @property
    def progress(self) -> int:
        """How far this rank got: its optimizer steps, or where it took none (a hand-written
        update), its averaged backward passes."""
        return self.steps or self.passes


class EngineState:
    """What survives between cells in one engine process."""

    def __init__(self) -> None:
        self.group: GroupHandle | None = None  # the warm process group
        self.cache: dict[str, tuple[str, bytes]] = {}   # shipped name -> (content hash, pickle)
        self.run: RunContext | None = None
        self.commits = CommitStore()    # in-memory checkpoints (survive between cells)
        self.kept: dict[str, object] = {}  # --keep: live objects the next cells find (see _kept)
        self.post_mortem: FailureFrames | None = None  # the last failure's frames, for %debug (_post_mortem)
        self.garbage = RunGarbage()  # what a finished run left in memory, collected


_STATE: EngineState | None = None
_STATE_LOCK = threading.Lock()


def engine_state() -> EngineState:
    """The process's engine state (created on first use, never at import)."""
    global _STATE
    with _STATE_LOCK:
        if _STATE is None:
            _STATE = EngineState()
        return _STATE


def current_run() -> RunContext:
    """The cell being run, or a clear error when called outside ``%%distributed_fit``."""
    run = engine_state().run
    if run is None:
        raise NotInRunError("this phalanx helper only works inside a %%distributed_fit cell "
                            "(it runs on the cluster's engines)")
    return run
