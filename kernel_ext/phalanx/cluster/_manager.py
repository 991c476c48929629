"""The kernel's handle on one ipyparallel cluster: start, scale, restart, stop, status.

Processes are started by ipyparallel's own ``Cluster`` and launchers.  What phalanx adds:

* with the local launcher every engine is its own engine set (a *slot*), so one rank can be
  restarted or stopped alone, which ipyparallel cannot do by engine id;
* dense ranks over the slots (:class:`RankTable`), pinned GPUs (:mod:`._gpus`);
* fail-fast start: an engine set that exits before registering ends the wait at once with the
  tail of its log, and nothing is left running.

Example::

    manager = ClusterManager()
    manager.start(n=2, gpus="none")
    manager.scale(3); manager.restart(rank=1); manager.stop()
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ._gpus import GpuSpec, assign_devices, default_engine_count, parse_gpu_spec, pinning_env, visible_gpus
from ._loop import LoopThread
from ._probe import identify_engine, pin_engine, warm_up
from ._ranks import RankTable
from ._launchers import LAUNCHERS, ClusterError, resolve_launcher, log_tail

log = logging.getLogger("phalanx")

# Heartbeats fast enough that a dead engine or a lost controller is noticed in seconds, not
# minutes: the controller pings every second; an engine that misses 10 checks (~15 s) exits.
_CONTROLLER_ARGS = ["--HeartMonitor.period=1000", "--HeartMonitor.max_heartmonitor_misses=5"]
_ENGINE_ARGS = ["--IPEngine.max_heartbeat_misses=10"]


@dataclass
class EngineSlot:
    """One engine position managed by phalanx."""

    slot_id: str
    engine_set_id: str
    device: str | None = None
    engine_id: int | None = None
    host: str = ""
    address: str = ""
    pid: int | None = None
    state: str = "starting"
    exit_code: int | None = None
    info: dict = field(default_factory=dict)


class ClusterManager:
    """Start and manage one ipyparallel cluster; all methods are synchronous.

    ``on_change`` is called (from any thread) whenever engines come, go or change state.
    ``device_lister`` returns the GPU ids visible on this host (tests pass a fake list).
    """

    def __init__(self, on_change: Callable[[], None] | None = None,
                 device_lister: Callable[[], list[str]] = visible_gpus,
                 max_engines: int | None = None) -> None:
        self._on_change = on_change or (lambda: None)
        self._device_lister = device_lister
        self.max_engines = max_engines or int(os.environ.get("PHALANX_MAX_ENGINES", "64"))
        self._lock = threading.RLock()
        self._runner: LoopThread | None = None
        self._cluster: Any = None
        self.client: Any = None
        self.launcher = "local"
        self.gpu_spec = GpuSpec("auto")
        self._gpus: list[str] = []
        self._slots: dict[str, EngineSlot] = {}
        self._ranks = RankTable()
        self._ids = itertools.count()
        self.generation = 0  # bumped whenever the rank -> engine mapping changes
        self.timeout = 60.0

    # --- queries ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._cluster is not None

    @property
    def size(self) -> int:
        return len(self._ranks)

    def slots(self) -> list[EngineSlot]:
        """Slots in rank order."""
        with self._lock:
            return [self._slots[s] for s in self._ranks if s in self._slots]

    def engine_ids(self) -> list[int]:
        """ipyparallel engine ids in rank order."""
        return [s.engine_id for s in self.slots() if s.engine_id is not None]

    def view(self, ranks: list[int] | None = None) -> Any:
        """A DirectView on the engines of ``ranks`` (default: all), in rank order."""
        self._require_running()
        ids = self.engine_ids()
        targets = ids if ranks is None else [ids[r] for r in ranks]
        return self.client[targets]

    def topology(self) -> tuple:
        """(generation, engine ids in rank order): changes whenever a process group must re-form."""
        return (self.generation, tuple(self.engine_ids()))

    def rank_of_engine(self, engine_id: int) -> int | None:
        for rank, slot in enumerate(self.slots()):
            if slot.engine_id == engine_id:
                return rank
        return None

    # --- start / stop ------------------------------------------------------------------------

    def start(self, n: int | None = None, gpus: str | None = "auto", launcher: str = "local",
              profile: str | None = None, timeout: float = 60.0) -> list[EngineSlot]:
        """Start a controller and ``n`` engines and wait until every engine answers."""
        if self.running:
            raise ClusterError(f"a cluster is already running with {self.size} engine(s); "
                               "use %cluster scale N to resize it or %cluster stop first")
        spec = parse_gpu_spec(gpus)
        launcher_class = resolve_launcher(launcher)
        local_gpus = self._device_lister() if spec.mode != "none" else []
        count = default_engine_count(spec, local_gpus) if n is None else _check_count(n, "-n")
        self._check_limit(count)
        if launcher in ("local", "mpi"):  # engines on this host: decide devices before starting
            assign_devices(spec, [socket.gethostname()] * count, {socket.gethostname(): local_gpus})
        self.gpu_spec, self._gpus, self.launcher, self.timeout = spec, local_gpus, launcher, timeout
        self._runner = LoopThread()
        try:
            self._runner.run(self._start_controller(launcher_class, profile), timeout + 30)
            self._add_engines(count)
        except BaseException:
            self._teardown()
            raise
        return self.slots()

    async def _start_controller(self, launcher_class: str, profile: str | None) -> None:
        import ipyparallel as ipp

        kwargs: dict[str, Any] = dict(
            engines=launcher_class, delay=0, engine_timeout=int(self.timeout),
            controller_args=list(_CONTROLLER_ARGS), shutdown_atexit=True, log=_quiet_logger(),
            parent=None)
        if self.launcher in ("local", "mpi"):
            kwargs["controller_ip"] = "127.0.0.1"  # a local cluster listens on loopback only
        if profile:
            kwargs["profile"] = profile
        self._cluster = ipp.Cluster(**kwargs)
        await self._cluster.start_controller()
        self.client = await self._cluster.connect_client()

    def stop(self) -> bool:
        """Stop every engine and the controller; returns False when nothing was running."""
        if not self.running:
            return False
        self._teardown()
        return True

    def _teardown(self) -> None:
        with self._lock:
            pids = [s.pid for s in self._slots.values() if s.pid]
            for slot in self._slots.values():
                slot.state = "stopping"
        cluster, client, runner = self._cluster, self.client, self._runner
        self._cluster = self.client = self._runner = None
        try:
            if client is not None:
                client.close(linger=0)
            if cluster is not None and runner is not None:
                runner.run(cluster.stop_cluster(), timeout=30)
        except Exception as exc:  # keep going: what matters is that no process survives
            log.warning("phalanx: stopping the cluster raised %s; killing leftovers", exc)
        finally:
            _kill_leftovers(pids)
            if runner is not None:
                runner.close()
            with self._lock:
                self._slots.clear()
                self._ranks = RankTable()
                self.generation += 1
            self._on_change()

    # --- scaling ------------------------------------------------------------------------------

    def scale(self, n: int) -> list[EngineSlot]:
        """Grow or shrink to ``n`` engines; shrinking stops the highest ranks."""
        self._require_running()
        n = _check_count(n, "scale")
        self._check_limit(n)
        current = self.size
        if n > current:
            if self.launcher in ("local", "mpi"):
                assign_devices(self.gpu_spec, [socket.gethostname()] * n, {socket.gethostname(): self._gpus})
            self._add_engines(n - current)
        elif n < current:
            self._remove_slots(self._ranks.highest(current - n))
        return self.slots()

    def restart(self, rank: int | None = None) -> list[EngineSlot]:
        """Restart one rank (its engine is replaced, the rank is kept) or every engine."""
        self._require_running()
        if rank is None:
            targets = list(self._ranks)
        else:
            if not isinstance(rank, int) or isinstance(rank, bool):
                raise ClusterError(f"restart takes a rank number, got {rank!r}")
            try:
                targets = [self._ranks.slot_at(rank)]
            except IndexError as exc:
                raise ClusterError(str(exc)) from None
        sets = {self._slots[s].engine_set_id for s in targets}
        if self.launcher != "local":
            whole = {s for s in self._slots if self._slots[s].engine_set_id in sets}
            if whole != set(targets):
                raise ClusterError(f"the {self.launcher} launcher starts engines in groups; "
                                   "restart them all with %cluster restart")
        self._stop_sets(sets)
        try:
            self._add_engines(len(targets), replacing=targets)
        except BaseException:
            with self._lock:  # the old engines are gone either way
                for slot_id in targets:
                    self._slots[slot_id].state = "dead"
            self._on_change()
            raise
        return self.slots()

    def _remove_slots(self, slot_ids: list[str]) -> None:
        sets = {self._slots[s].engine_set_id for s in slot_ids}
        whole = {s for s in self._slots if self._slots[s].engine_set_id in sets}
        if whole != set(slot_ids):
            raise ClusterError(f"the {self.launcher} launcher starts engines in groups of "
                               "several; scale down by whole groups or restart the cluster")
        self._stop_sets(sets)
        with self._lock:
            for slot_id in slot_ids:
                self._slots.pop(slot_id, None)
                self._ranks.remove(slot_id)
            self.generation += 1
        self._on_change()

    def _stop_sets(self, sets: set[str]) -> None:
        with self._lock:
            pids = [s.pid for s in self._slots.values() if s.engine_set_id in sets and s.pid]
            for slot in self._slots.values():
                if slot.engine_set_id in sets:
                    slot.state = "stopping"
        self._on_change()
        assert self._runner is not None
        for set_id in sets:
            try:
                self._runner.run(self._cluster.stop_engines(set_id), timeout=30)
            except KeyError:
                pass  # the set already exited on its own
        _kill_leftovers(pids)

    # --- adding engines -----------------------------------------------------------------------

    def _add_engines(self, count: int, replacing: list[str] | None = None) -> None:
        """Start ``count`` engines, wait for them, identify and pin them, rank them."""
        new_slots = self._launch(count)
        try:
            self._await_registration(new_slots)
        except BaseException:
            self._stop_sets({s.engine_set_id for s in new_slots})
            with self._lock:
                for s in new_slots:
                    self._slots.pop(s.slot_id, None)
            raise
        with self._lock:
            for i, slot in enumerate(new_slots):
                if replacing is not None:
                    self._ranks.replace(replacing[i], slot.slot_id)
                    self._slots.pop(replacing[i], None)
                else:
                    self._ranks.append(slot.slot_id)
                slot.state = "idle"
            self.generation += 1
        self._on_change()

    def _launch(self, count: int) -> list[EngineSlot]:
        assert self._runner is not None and self._cluster is not None
        first_rank = self.size
        devices = assign_devices(self.gpu_spec, [socket.gethostname()] * (first_rank + count),
                                 {socket.gethostname(): self._gpus})[first_rank:] \
            if self.launcher == "local" else [None] * count
        slots: list[EngineSlot] = []
        if self.launcher == "local":
            for device in devices:
                slot_id = f"slot-{next(self._ids)}"
                env = {"PHALANX_SLOT": slot_id, **pinning_env(device)}
                self._start_set(slot_id, 1, env)
                slots.append(self._register_slot(EngineSlot(slot_id, slot_id, device)))
        else:
            set_id = f"set-{next(self._ids)}"
            self._start_set(set_id, count, {"PHALANX_SET": set_id})
            for i in range(count):
                slots.append(self._register_slot(EngineSlot(f"{set_id}.{i}", set_id)))
        return slots

    def _register_slot(self, slot: EngineSlot) -> EngineSlot:
        with self._lock:
            self._slots[slot.slot_id] = slot
        return slot

    def _start_set(self, set_id: str, count: int, env: dict[str, str]) -> None:
        kwargs: dict[str, Any] = {"environment": dict(env), "engine_args": list(_ENGINE_ARGS)}
        if self.launcher == "mpi":
            kwargs["mpi_cmd"] = [_find_mpiexec()]
        self._runner.run(self._cluster.start_engines(count, engine_set_id=set_id, **kwargs),
                         timeout=self.timeout)
        self._cluster.engines[set_id].on_stop(lambda data, s=set_id: self._set_stopped(s, data))

    def _set_stopped(self, set_id: str, data: dict | None) -> None:
        code = (data or {}).get("exit_code")
        changed = False
        with self._lock:
            for slot in self._slots.values():
                if slot.engine_set_id == set_id and slot.state not in ("stopping", "dead"):
                    slot.state, slot.exit_code, changed = "dead", code, True
        if changed:
            log.warning("phalanx: engine set %s exited (code %s)", set_id, code)
            self._on_change()

    def _await_registration(self, slots: list[EngineSlot]) -> None:
        """Wait until each new slot's engine has registered and answered the probe."""
        deadline = time.monotonic() + self.timeout
        pending = {s.slot_id: s for s in slots}
        known = {s.engine_id for s in self._slots.values() if s.engine_id is not None}
        probed: set[int] = set()
        while pending:
            dead = [s for s in slots if s.state == "dead"]
            if dead:
                raise ClusterError(self._startup_failure(dead[0], "exited before registering"))
            if time.monotonic() > deadline:
                raise ClusterError(self._startup_failure(next(iter(pending.values())),
                                                         f"did not register within {self.timeout:g} s"))
            for eid in [e for e in self.client.ids if e not in known and e not in probed]:
                info = self.client[eid].apply_sync(identify_engine)
                probed.add(eid)
                slot = self._match(info, pending)
                if slot is not None:
                    slot.engine_id, slot.host, slot.address, slot.pid, slot.info = (
                        eid, info["host"], info["address"], info["pid"], info)
                    pending.pop(slot.slot_id)
            time.sleep(0.05)
        if self.launcher != "local":
            self._pin_group(slots)
        self.client[[s.engine_id for s in slots]].apply_async(warm_up)  # not awaited

    def _match(self, info: dict, pending: dict[str, EngineSlot]) -> EngineSlot | None:
        if info["slot"] in pending:
            return pending[info["slot"]]
        by_mpi_rank = f"{info['set']}.{info['mpi_rank']}"  # keep MPI rank == phalanx rank
        if info["mpi_rank"] is not None and by_mpi_rank in pending:
            return pending[by_mpi_rank]
        for slot in pending.values():  # grouped launchers: any slot of the engine's set
            if slot.engine_set_id == info["set"]:
                return slot
        return None

    def _pin_group(self, slots: list[EngineSlot]) -> None:
        """Engines started together share one environment: pin each one after it registered."""
        everyone = [s for s in self.slots() if s not in slots] + slots
        hosts = [s.host for s in everyone]
        visible = {h: (self._gpus if h == socket.gethostname() else []) for h in set(hosts)}
        devices = assign_devices(self.gpu_spec, hosts, visible)[len(everyone) - len(slots):]
        for slot, device in zip(slots, devices):
            slot.device = device
            self.client[slot.engine_id].apply_sync(pin_engine, slot.slot_id, device)

    def _startup_failure(self, slot: EngineSlot, what: str) -> str:
        output = ""
        engine_set = self._cluster.engines.get(slot.engine_set_id) if self._cluster else None
        if engine_set is not None:
            try:
                output = engine_set.get_output()
            except Exception:
                output = ""
        return (f"engine(s) started by the {self.launcher} launcher {what}.\n"
                f"Last lines of the engine log:\n{log_tail(output)}")

    # --- status -------------------------------------------------------------------------------

    def status(self, steps: dict[int, int] | None = None) -> list[dict]:
        """One row per rank: rank, engine id, host, pid, device, state, memory (MB), step."""
        busy = self._busy_engines()
        rows = []
        for rank, slot in enumerate(self.slots()):
            state = slot.state
            if state == "idle" and slot.engine_id in busy:
                state = "busy"
            rows.append({
                "rank": rank, "engine_id": slot.engine_id if slot.engine_id is not None else -1,
                "host": slot.host, "pid": slot.pid, "device": slot.device or "cpu",
                "state": state, "memory_mb": _memory_mb(slot.pid, slot.host),
                "step": (steps or {}).get(rank),
            })
        return rows

    def _busy_engines(self) -> set[int]:
        if self.client is None:
            return set()
        try:
            queue = self.client.queue_status(block=True)
        except Exception:
            return set()
        return {eid for eid, q in queue.items()
                if isinstance(q, dict) and (q.get("tasks", 0) or q.get("queue", 0))}

    # --- checks -------------------------------------------------------------------------------

    def _require_running(self) -> None:
        if not self.running:
            raise ClusterError("no cluster is running: start one with %cluster start -n 2")

    def _check_limit(self, n: int) -> None:
        if n > self.max_engines:
            raise ClusterError(f"{n} engines is above this cluster's limit of {self.max_engines} "
                               "(set PHALANX_MAX_ENGINES to raise it)")


def _quiet_logger() -> logging.Logger:
    """ipyparallel logs every engine exit with its whole output; phalanx reports what matters."""
    quiet = logging.getLogger("phalanx.ipyparallel")
    quiet.setLevel(logging.ERROR)
    quiet.propagate = False
    if not quiet.handlers:
        quiet.addHandler(logging.NullHandler())
    return quiet


def _check_count(n: Any, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise ClusterError(f"{what} needs a whole number of engines, got {n!r}")
    if n < 1:
        raise ClusterError(f"{what} needs at least 1 engine, got {n}; use %cluster stop to stop all")
    return n


def _find_mpiexec() -> str:
    found = shutil.which("mpiexec") or shutil.which("mpiexec", path=str(Path(sys.executable).parent))
    if not found:
        raise ClusterError("the mpi launcher needs mpiexec, which was not found: "
                           "`pip install mpich mpi4py` provides one")
    return found


def _memory_mb(pid: int | None, host: str) -> float | None:
    if not pid or host != socket.gethostname():
        return None
    try:
        import psutil

        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except Exception:
        return None


def _kill_leftovers(pids: list[int], grace: float = 5.0) -> None:
    """Make sure engine processes are gone: ipyparallel stops them; this catches stragglers."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
