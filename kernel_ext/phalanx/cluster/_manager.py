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
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ._gpus import GpuSpec, assign_devices, default_engine_count, parse_gpu_spec, pinning_env, visible_gpus
from ._loop import LoopThread
from ._probe import identify_engine, pin_engine, warm_up
from ._supervise import command as supervised, parent_env
from ._ranks import RankTable
from ._launchers import LAUNCHERS, ClusterError, resolve_launcher, log_tail
from ._procs import (ADOPTED, check_count, find_mpiexec, kill_leftovers, local_pids,
                     is_adopted, memory_mb, quiet_logger, shutdown_engines)

log = logging.getLogger("phalanx")

# Heartbeats fast enough that a dead engine or a lost controller is noticed in seconds, not
# minutes: the controller pings every second; an engine that misses 10 checks (~15 s) exits.
_CONTROLLER_ARGS = ["--HeartMonitor.period=1000", "--HeartMonitor.max_heartmonitor_misses=5"]
_ENGINE_ARGS = ["--IPEngine.max_heartbeat_misses=10"]
# Controller and local engines run under phalanx's supervisor (cluster/_supervise.py): a private
# umask (connection files are owner-only from the moment they exist) and a watchdog that stops
# them when the kernel is gone.


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
        self.controller_exit: dict | None = None  # set when the controller stops on its own
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

    def process_ids(self) -> dict[str, list[int]]:
        """Local processes of the cluster: the controller's and the engines', with children
        (the controller's schedulers, each engine's nanny).  For audits and leak checks."""
        import psutil

        roots: dict[str, list[int]] = {"controller": [],
                                       "engines": [s.pid for s in self.slots() if s.pid]}
        controller = getattr(self._cluster, "controller", None) if self._cluster else None
        if controller is not None and getattr(controller, "pid", None):
            roots["controller"] = [controller.pid]
        found: dict[str, list[int]] = {}
        for role, pids in roots.items():
            found[role] = []
            for pid in pids:
                try:
                    proc = psutil.Process(pid)
                    found[role] += [pid] + [c.pid for c in proc.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
        return found

    def rank_of_engine(self, engine_id: int) -> int | None:
        for rank, slot in enumerate(self.slots()):
            if slot.engine_id == engine_id:
                return rank
        return None

    # --- start / stop ------------------------------------------------------------------------

    def start(self, n: int | None = None, gpus: str | None = "auto", launcher: str = "local",
              profile: str | None = None, timeout: float = 60.0,
              controller_ip: str | None = None) -> list[EngineSlot]:
        """Start a controller and ``n`` engines and wait until every engine answers.

        A local cluster's controller listens on loopback; ``controller_ip`` puts it on another
        address, for engines started elsewhere and then :meth:`adopt`-ed.
        """
        if self.running:
            raise ClusterError(f"a cluster is already running with {self.size} engine(s); "
                               "use %cluster scale N to resize it or %cluster stop first")
        spec = parse_gpu_spec(gpus)
        launcher_class = resolve_launcher(launcher)
        local_gpus = self._device_lister() if spec.mode != "none" else []
        count = default_engine_count(spec, local_gpus) if n is None else check_count(n, "-n")
        self.check_limit(count)
        if launcher in ("local", "mpi"):  # engines on this host: decide devices before starting
            assign_devices(spec, [socket.gethostname()] * count, {socket.gethostname(): local_gpus})
        self.gpu_spec, self._gpus, self.launcher, self.timeout = spec, local_gpus, launcher, timeout
        self._runner = LoopThread()
        try:
            self._runner.run(self._start_controller(launcher_class, profile, controller_ip),
                             timeout + 30)
            self._add_engines(count)
        except BaseException:
            self._teardown()
            raise
        return self.slots()

    async def _start_controller(self, launcher_class: str, profile: str | None,
                                controller_ip: str | None) -> None:
        import ipyparallel as ipp

        kwargs: dict[str, Any] = dict(
            engines=launcher_class, delay=0, engine_timeout=int(self.timeout),
            controller_args=list(_CONTROLLER_ARGS), shutdown_atexit=True, log=quiet_logger(),
            parent=None)
        if controller_ip or self.launcher in ("local", "mpi"):
            kwargs["controller_ip"] = controller_ip or "127.0.0.1"  # local: loopback only
        if profile:
            kwargs["profile"] = profile
        self._cluster = ipp.Cluster(**kwargs)
        self.controller_exit = None
        await self._cluster.start_controller(controller_cmd=supervised("ipyparallel.controller"),
                                             environment=parent_env())
        self._cluster.controller.on_stop(self._controller_stopped)
        self.client = await self._cluster.connect_client()

    def stop(self) -> bool:
        """Stop every engine and the controller; returns False when nothing was running."""
        if not self.running:
            return False
        self._teardown()
        return True

    def _teardown(self) -> None:
        with self._lock:
            pids = local_pids(self._slots.values())
            adopted = [s.engine_id for s in self._slots.values() if is_adopted(s)]
            for slot in self._slots.values():
                slot.state = "stopping"
        cluster, client, runner = self._cluster, self.client, self._runner
        self._cluster = self.client = self._runner = None
        try:
            if client is not None:
                shutdown_engines(client, adopted)
                client.close(linger=0)
            if cluster is not None and runner is not None:
                runner.run(cluster.stop_cluster(), timeout=30)
        except Exception as exc:  # keep going: what matters is that no process survives
            log.warning("phalanx: stopping the cluster raised %s; killing leftovers", exc)
        finally:
            kill_leftovers(pids)
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
        n = check_count(n, "scale")
        self.check_limit(n)
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
        adopted = [self._ranks.rank_of(s) for s in targets if is_adopted(self._slots[s])]
        if adopted:
            raise ClusterError(f"rank(s) {', '.join(map(str, adopted))} run on engines started "
                               "outside phalanx: restart them where they run and adopt them again")
        sets = {self._slots[s].engine_set_id for s in targets}
        if self.launcher != "local":
            whole = {s for s in self._slots if self._slots[s].engine_set_id in sets}
            if whole != set(targets):
                raise ClusterError(f"the {self.launcher} launcher starts engines in groups; "
                                   "restart them all with %cluster restart")
        try:
            self._stop_sets(sets)
            self._add_engines(len(targets), replacing=targets)
        except BaseException:
            with self._lock:  # the old engines are gone either way: never leave a stale slot
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
            doomed = [s for s in self._slots.values() if s.engine_set_id in sets]
            pids = local_pids(doomed)
            for slot in doomed:
                slot.state = "stopping"
        self._on_change()
        assert self._runner is not None
        shutdown_engines(self.client, [s.engine_id for s in doomed if is_adopted(s)])
        for set_id in sets - {s.engine_set_id for s in doomed if is_adopted(s)}:
            try:
                self._runner.run(self._cluster.stop_engines(set_id), timeout=30)
            except KeyError:
                pass  # the set already exited on its own
        kill_leftovers(pids)

    # --- engines started elsewhere -------------------------------------------------------------

    def engine_connection_file(self) -> str:
        """What an engine started by hand needs (``ipengine --file=PATH``): the controller's
        address and keys.  Owner-only; copy it only to hosts you trust."""
        self._require_running()
        cluster = self._cluster
        return os.path.join(cluster.profile_dir, "security",
                            f"ipcontroller-{cluster.cluster_id}-engine.json")

    def adopt(self, slot_ids: list[str], timeout: float | None = None) -> list[EngineSlot]:
        """Give the next ranks to engines phalanx did not start (in a container, a network
        namespace, on a host no launcher reaches).  Each must run with ``PHALANX_SLOT=<id>``
        (and, when the hostname does not tell it apart, ``PHALANX_HOST``/``PHALANX_ADDRESS``).

        Example::

            path = manager.engine_connection_file()
            # there: PHALANX_SLOT=far-0 python -m ipyparallel.engine --file=PATH
            manager.adopt(["far-0"])
        """
        self._require_running()
        taken = [s for s in slot_ids if s in self._slots]
        if taken or len(set(slot_ids)) != len(slot_ids):
            raise ClusterError(f"slot ids must be new and distinct, got {slot_ids!r}")
        self.check_limit(self.size + len(slot_ids))
        new = [self._register_slot(EngineSlot(s, ADOPTED + s)) for s in slot_ids]
        saved, self.timeout = self.timeout, timeout or self.timeout
        try:
            self._await_registration(new)
        except BaseException:
            with self._lock:
                for slot in new:
                    self._slots.pop(slot.slot_id, None)
            raise
        finally:
            self.timeout = saved
        self._rank_new(new)
        return self.slots()

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
        self._rank_new(new_slots, replacing)

    def _rank_new(self, new_slots: list[EngineSlot], replacing: list[str] | None = None) -> None:
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
        if self.launcher in ("local", "mpi"):  # on this host: they can watch the kernel
            kwargs["engine_cmd"] = supervised("ipyparallel.engine")
            kwargs["environment"].update(parent_env())
        if self.launcher == "mpi":
            kwargs["mpi_cmd"] = [find_mpiexec()]
        self._runner.run(self._cluster.start_engines(count, engine_set_id=set_id, **kwargs),
                         timeout=self.timeout)
        self._cluster.engines[set_id].on_stop(lambda data, s=set_id: self._set_stopped(s, data))

    def _controller_stopped(self, data: dict | None) -> None:
        """The controller exited: a run in progress can no longer hear from any engine."""
        if self._cluster is None:  # stopped by us
            return
        self.controller_exit = dict(data or {}, pid=getattr(self._cluster.controller, "pid", None))
        log.warning("phalanx: the cluster's controller exited (%s)", data)
        self._on_change()

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
                "state": state, "memory_mb": memory_mb(slot.pid, slot.host),
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

    def check_limit(self, n: int) -> None:
        """Refuse ``n`` engines when it is above the configured maximum (PHALANX_MAX_ENGINES)."""
        if n > self.max_engines:
            raise ClusterError(f"{n} engines is above this cluster's limit of {self.max_engines} "
                               "(set PHALANX_MAX_ENGINES to raise it)")
