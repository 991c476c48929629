"""What the cluster manager's parts share: the engines' slots and ranks, and the running cluster.

:class:`~._manager.ClusterManager` is built from parts with one job each (:mod:`._engines` starts
engines, :mod:`._stopping` stops them, :mod:`._replace` restarts them, :mod:`._exit_watch` hears of
those that exit on their own, :mod:`._reporting` and :mod:`._adoption` report and take in).  Each
part is handed one :class:`ClusterState`: the only place that state lives, so a part reads and
changes it there, under :attr:`ClusterState.lock`, rather than in another part.

Example::

    >>> state = ClusterState(on_change=lambda: None, max_engines=4)
    >>> state.running, state.size, state.launcher.name
    (False, 0, 'local')
    >>> state.register(EngineSlot("slot-0", "slot-0")).state  # known, not ranked yet
    'starting'
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ._errors import ClusterError
from ._gpus import GpuSpec
from ._launchers import Launcher, LaunchOptions, make_launcher
from ._procs import is_adopted
from ._ranks import EngineSlot, RankTable

if TYPE_CHECKING:
    from ._engine_log import EngineLog
    from ._loop import LoopThread
    from ._warden import Warden


class ClusterState:
    """The slots, ranks and handles of one manager's cluster (handles are ``None`` while none
    runs).  ``on_change`` is called, from any thread, whenever engines come, go or change state.
    """

    def __init__(self, on_change: Callable[[], None], max_engines: int) -> None:
        self.lock = threading.RLock()
        self.on_change = on_change
        self.max_engines = max_engines
        self.slots: dict[str, EngineSlot] = {}   # by slot id, ranked or not (yet)
        self.ranks = RankTable()                 # slot ids in rank order
        self.ids = itertools.count()             # numbers for new slot and engine-set ids
        self.generation = 0                      # bumped whenever the rank -> engine mapping changes
        # what the last start chose
        self.launcher: Launcher = make_launcher("local", LaunchOptions())
        self.controller_ip = "127.0.0.1"
        self.gpu_spec = GpuSpec("auto")
        self.gpus: list[str] = []                # this host's devices, as listed at start
        self.timeout = 60.0                      # how long engines may take to register
        # the running cluster
        self.cluster: Any = None                 # ipyparallel's Cluster
        self.client: Any = None                  # ... and its Client
        self.runner: LoopThread | None = None    # the event loop ipyparallel's coroutines run on
        self.warden: Warden | None = None        # the cluster's watchdog process
        self.forked_controller: Any = None       # the controller (psutil), where the zygote forked it
        self.controller_exit: dict | None = None  # set when the controller stops on its own
        self.engine_log: EngineLog | None = None  # its processes' own output (kept after a stop)

    @property
    def running(self) -> bool:
        return self.cluster is not None

    @property
    def size(self) -> int:
        return len(self.ranks)

    def in_rank_order(self) -> list[EngineSlot]:
        """The ranked slots, rank 0 first."""
        with self.lock:
            return [self.slots[s] for s in self.ranks if s in self.slots]

    def require_running(self) -> None:
        if not self.running:
            raise ClusterError("no cluster is running: start one with %cluster start -n 2")

    def check_limit(self, n: int) -> None:
        """Refuse ``n`` engines when it is above the configured maximum (PHALANX_MAX_ENGINES)."""
        if n > self.max_engines:
            raise ClusterError(f"{n} engines is above this cluster's limit of {self.max_engines} "
                               "(set PHALANX_MAX_ENGINES to raise it)")

    def register(self, slot: EngineSlot) -> EngineSlot:
        """Know ``slot`` (not ranked yet: it gets a rank once its engine answered)."""
        with self.lock:
            self.slots[slot.slot_id] = slot
        return slot

    def forget(self, slot_ids: Iterable[str]) -> None:
        """Drop unranked slots (a start that failed)."""
        with self.lock:
            for slot_id in slot_ids:
                self.slots.pop(slot_id, None)

    def group_of(self, slot_ids: list[str]) -> list[str]:
        """Every slot started in the same engine sets as ``slot_ids``."""
        sets = {self.slots[s].engine_set_id for s in slot_ids}
        return [s for s in self.slots if self.slots[s].engine_set_id in sets]

    def asks_to_exit(self, slot: EngineSlot) -> bool:
        """Engines asked to exit over ipyparallel before their launcher stops them: those
        phalanx did not start, and those whose launcher is slow to stop them (SSH)."""
        return is_adopted(slot) or self.launcher.ask_engines_to_exit
