"""What crosses between the kernel and the engines for one ``%%distributed_fit`` run.

The kernel sends every rank a :class:`RunSpec` (through ``run_cell``, see :mod:`phalanx.runtime.run._entry`), and
every rank answers with a :class:`RankResult` whose :class:`Outcome` says how it ended.  A rank
that cannot answer (its engine died, froze, ignored an interrupt, or the controller went) gets a
RankResult made by the kernel instead, so each rank of an attempt has exactly one.

Both travel through ipyparallel, which pickles them, and the engines run the same phalanx as the
kernel (checked before a run starts): they are plain dataclasses of plain values.  The module
imports nothing heavy, so the kernel can load it without torch or numpy.

Example::

    >>> import pickle
    >>> result = RankResult(Outcome.RAISED, steps=3, error="ValueError", message="bad shard")
    >>> again = pickle.loads(pickle.dumps(result))
    >>> again == result, again.failed, again.outcome.value
    (True, True, 'raised')
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from ._options import TrainOptions

# The file name the cell's code is compiled under: tracebacks and warnings name its lines.
CELL_FILENAME = "<distributed_fit>"

__all__ = ["RunSpec", "GroupSpec", "CheckpointSpec", "ResumePlan", "RankResult", "Outcome"]


@dataclass(frozen=True)
class GroupSpec:
    """What a rank needs to join (or recognise) its process group."""

    key: str
    rank: int
    world_size: int
    # ("file", path) on one host; across hosts ("curve", host, port, server_public,
    # client_public, client_secret): the kernel's store server and this cluster's client keys
    store: tuple
    backend: str            # "gloo" | "nccl" | "mpi"
    timeout_s: float
    hosts: tuple = ()       # host of each rank
    pids: tuple = ()        # pid of each rank (lets shared memory notice a dead peer)


@dataclass(frozen=True)
class ResumePlan:
    """Where a resumed attempt starts: the newest commit every rank can load, and from where.

    ``sources[r]`` is ``"memory"`` or ``"disk"`` (rank ``r`` holds the commit itself),
    ``"peer"`` (rank ``src`` sends it to every rank that lacks it) or ``"sharded"`` (a sharded
    commit's folder, which every rank reads its new shards from)."""

    step: int
    sources: tuple[str, ...]
    src: int | None = None


@dataclass(frozen=True)
class CheckpointSpec:
    """How a rank commits its training state (``--checkpoint-every``) and what it resumes from."""

    key: str                           # the lineage: which chain of commits this run extends
    every: int                         # commit every this many iterations of ``steps()``
    directory: str | None = None       # also write commits here (``--checkpoint-dir``)
    resume: ResumePlan | None = None   # restore this commit before the first iteration
    control: str | None = None         # a file whose existence asks the ranks to stop (resize)
    # where sharded commits go without ``directory``: a private folder of the kernel's that its
    # host's engines share (None when an engine is on another host)
    scratch: str | None = None


def shard_key(name: str) -> str:
    """Where an engine's cache holds its part of ``--shard name`` (no notebook name looks like
    it): a re-run whose data did not change sends none of it again."""
    return f"--shard {name}"


@dataclass(frozen=True)
class RunSpec:
    """Everything one rank needs to run the cell (its part of each ``--shard`` name is in the
    engine's cache under :func:`shard_key`, like the shipped names)."""

    run_id: str
    rank: int
    world_size: int
    body: str                          # the cell's source
    names: tuple[str, ...]             # shipped objects the cell uses, already on the engine
    group: GroupSpec                   # the process group to join (or reuse)
    metrics_address: str               # where ``log()`` rows go
    train: TrainOptions = field(default_factory=TrainOptions)  # how every rank trains
    metrics_token: str = ""            # proves the rows come from this cluster's engines
    # across hosts: (server public, client public, client secret) of the receiver's CurveZMQ;
    # empty on one host (plain loopback)
    metrics_keys: tuple[str, ...] = ()
    sync_from_notebook: bool = False   # ``train.sync`` names a shipped notebook class
    kept: tuple[str, ...] = ()         # names this engine keeps from earlier runs (``--keep``)
    checkpoint: CheckpointSpec | None = None
    memory_interval_s: float = 1.0     # memory samples this often (0: off)
    # What an adapter's kernel side sends its engine side for this attempt, by adapter name
    # (XGBoost's: its communicator's tracker and timeout, see adapters/xgboost.py); the seam
    # names no library
    adapter_data: tuple[tuple[str, Any], ...] = ()

    def data_for(self, adapter: str, default: Any = None) -> Any:
        """What the kernel sent the adapter called ``adapter`` (``default`` if nothing)."""
        return dict(self.adapter_data).get(adapter, default)


class Outcome(enum.Enum):
    """How a rank's part of an attempt ended."""

    OK = "ok"                            # the cell ran to its end
    RESIZED = "resized"                  # stopped at a commit so the run can change size
    RAISED = "raised"                    # the cell raised (maybe because a peer failed)
    INTERRUPTED = "interrupted"          # the kernel's interrupt stopped it
    DIED = "died"                        # its engine process ended (kernel-made)
    STOPPED = "stopped"                  # its process was frozen (SIGSTOP) and killed (kernel-made)
    UNRESPONSIVE = "unresponsive"        # it ignored an interrupt; its engine was restarted (kernel-made)
    CONTROLLER_LOST = "controller_lost"  # the cluster's controller exited first (kernel-made)

    @property
    def kernel_made(self) -> bool:
        """The kernel's account of a rank whose process is gone or was never heard from: that
        process sends nothing more (no result, no final metrics batch), so nothing waits for it.
        A new outcome of that kind must be added here."""
        return self in _KERNEL_MADE


_KERNEL_MADE = frozenset({Outcome.DIED, Outcome.STOPPED, Outcome.UNRESPONSIVE,
                          Outcome.CONTROLLER_LOST})


class Fault(enum.Enum):
    """Whose fault a failed rank's error is.  The rank sorts its own exception by its type
    (:func:`phalanx.runtime.run._faults.fault_of`), where the classes are; the kernel sorts the
    ranks it speaks for.  The run's one error names the rank of the first fault that is its own.
    """

    OWN = "own"            # the rank's own error: its code, a library, its process or engine
    PEER = "peer"          # raised because another rank failed (an aborted or broken collective,
    #                        an interrupt the rank ignored while its peers were being released)
    DEADLINE = "deadline"  # a collective's deadline passed waiting for the ranks it names
    QUIT = "quit"          # the person quit the rank's debugger (``q`` at a breakpoint)

    @property
    def secondary(self) -> bool:
        """Caused by another rank: reported only when nothing else explains the run's end."""
        return self in (Fault.PEER, Fault.DEADLINE)


@dataclass(frozen=True)
class RankResult:
    """One rank's answer for an attempt (or the kernel's account of a rank that gave none)."""

    outcome: Outcome
    steps: int = 0                     # optimizer steps this rank took
    ended_at: float = field(default_factory=time.time)  # wall clock: when it stopped
    error: str | None = None           # the exception's type name, or the kernel's name for the fault
    fault: Fault | None = None         # whose fault ``error`` is (None where the rank did not fail)
    message: str = ""
    traceback: str | None = None       # from the cell's first line on
    wall_s: float | None = None
    host: str | None = None
    pid: int | None = None
    ranks: tuple[int, ...] = ()        # the ranks a collective error blames (missing, dead)
    memory: dict | None = None         # the rank's memory figures when it failed
    last_commit: int | None = None     # the last step this rank committed
    steps_loop: bool | None = None     # whether the loop ran through ``steps()``
    returns: bytes | None = None       # rank 0's ``--return`` values, pickled
    kept: dict | None = None           # ``--keep``: bytes of each name now kept on this rank
    held: dict | None = None           # this rank's bytes of parameters, gradients, optimizer
                                       # state at the end, as its fit mode counts them
    profile: dict | None = None        # the ``--profile`` trace of this rank
    trained_not_returned: tuple[str, ...] = ()  # rank 0: notebook names trained, not returned
    debuggable: bool = False           # its engine keeps the failure's frames for %debug
    # Kernel-made details of a rank that could not answer for itself.
    exit_code: int | None = None       # of a dead engine
    grace_s: float | None = None       # how long an unresponsive rank was given
    restart_error: str | None = None   # why restarting an unresponsive rank's engine failed
    controller: dict | None = None     # pid and exit code of a controller that exited
    # The kernel's verdict once every rank is in: this rank kept its peers waiting.
    stalled: bool = False
    stopped: bool = False              # ... and was frozen, so phalanx ended it
    waited_s: float | None = None      # how long its peers waited (``--collective-timeout``)
    stacks_at_stall: str | None = None  # where the ranks still running were then (in words)

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def failed(self) -> bool:
        """Whether this rank ended the attempt badly (a resize is no failure)."""
        return self.outcome not in (Outcome.OK, Outcome.RESIZED)


@dataclass
class FullStateDict:
    """A sharded model's parameters and buffers, gathered whole on the CPU (what ``--return``
    sends back for it)."""

    state: dict
