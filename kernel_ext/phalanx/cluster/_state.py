"""The state the cluster manager's parts share, declared once.

:class:`~._manager.ClusterManager` is assembled from mixins (:mod:`._engines` adds engines,
:mod:`._reporting` reports on them and adopts engines started elsewhere) that work on the
manager's attributes and call its methods.  :class:`ManagerState` says what those are, so that
a reader of a mixin, and the type checker, know what ``self`` holds.  It only declares: the
manager sets every attribute in its ``__init__``, and the methods below exist for the type
checker only.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ._gpus import GpuSpec
from ._ranks import EngineSlot, RankTable

if TYPE_CHECKING:
    from ._launchers import Launcher
    from ._loop import LoopThread
    from ._warden import Warden
    from ._zygote_handle import ZygoteHandle


class ManagerState:
    """What :class:`~._manager.ClusterManager` holds and offers its mixins."""

    _lock: threading.RLock
    _slots: dict[str, EngineSlot]      # by slot id, ranked or not
    _ranks: RankTable                  # slot ids in rank order
    _ids: Iterator[int]                # numbers for new slot and engine-set ids
    _cluster: Any                      # the ipyparallel Cluster while one runs, else None
    _runner: LoopThread | None         # the event loop ipyparallel's coroutines run on
    _launcher: Launcher
    _warden: Warden | None
    _zygote: ZygoteHandle | None         # the local CPU engines' fork server, where one runs
    _forked_controller: Any            # the controller (psutil process) where the zygote forked it
    _gpus: list[str]                   # this host's devices, as listed at start
    _on_change: Callable[[], None]
    client: Any                        # the ipyparallel Client while a cluster runs
    launcher: str
    controller_ip: str
    gpu_spec: GpuSpec
    timeout: float
    generation: int
    max_engines: int

    if TYPE_CHECKING:  # defined by the manager and its mixins
        @property
        def size(self) -> int: ...

        def slots(self) -> list[EngineSlot]: ...

        def check_limit(self, n: int) -> None: ...

        def _require_running(self) -> None: ...

        def _stop_sets(self, sets: set[str]) -> None: ...

        def _stop_slots(self, slot_ids: list[str]) -> list[str]: ...

        def _add_engines(self, count: int, replacing: list[str] | None = None,
                         hosts: dict[str, int] | None = None) -> None: ...

        def _await_gone(self, sets: list) -> None: ...

        def _register_slot(self, slot: EngineSlot) -> EngineSlot: ...

        def _rank_new(self, new_slots: list[EngineSlot],
                      replacing: list[str] | None = None) -> None: ...

        def _await_registration(self, slots: list[EngineSlot]) -> None: ...
