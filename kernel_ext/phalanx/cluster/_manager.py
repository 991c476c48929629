"""The kernel's handle on one ipyparallel cluster: start, scale, restart, stop, status.

Processes are started by ipyparallel's own ``Cluster`` and launchers.  What phalanx adds:

* a launcher object per kind (:mod:`._launchers`) says where the controller listens and how
  engines start; with the local launcher every engine is its own engine set (a *slot*), so one
  rank can be restarted or stopped alone, which ipyparallel cannot do by engine id;
* dense ranks over the slots (:class:`RankTable`), pinned GPUs (:mod:`._gpus`); restarts and
  scale-downs that leave no old engine running on any host (:mod:`._replace`);
* fail-fast start (:mod:`._engines`): an engine set that exits before registering ends the wait
  at once with the tail of its log, and nothing is left running.

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
from typing import Any, Callable

from ._errors import ClusterError
from ._engines import EngineStartMixin
from ._gpus import GpuSpec, assign_devices, default_engine_count, parse_gpu_spec, visible_gpus
from ._heartbeat import CONTROLLER_ARGS
from ._loop import LoopThread
from ._mpi_segments import mpich_segments, remove_segments
from ._launchers import Launcher, LaunchOptions, make_launcher
from ._cluster_files import files_of, remove_files
from ._procs import (check_count, children_of, kill_leftovers, local_pids, terminate_together,
                     quiet_logger, shutdown_engines)
from ._ranks import EngineSlot, RankTable
from ._replace import ReplaceMixin
from ._reporting import AdoptionMixin, StatusMixin
from ._supervise import command as supervised, parent_env
from ._warden import Warden, launched_processes
from ._zygote_handle import ZygoteHandle, fork_server_idle_s

log = logging.getLogger("phalanx")

# The controller and engines on this host run under phalanx's supervisor (cluster/_supervise.py):
# a private umask (connection files are owner-only from the moment they exist) and a watchdog
# that stops them when the kernel is gone.  A watchdog process per cluster (cluster/_warden.py)
# ends what those cannot (a dead controller's schedulers, a stopped engine) and the kernel's files.

# ipyparallel's hub keeps every request and result in memory by default (its DictDB, up to 1 GB),
# shipped data and returned models included: twelve runs shipping 20 MB each left the controller
# 250 MB larger (measured; 29 MB without).  phalanx never reads a task back from the hub.
NO_TASK_DATABASE = ["--nodb"]


class ClusterManager(StatusMixin, AdoptionMixin, ReplaceMixin, EngineStartMixin):
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
        self._warden: Warden | None = None
        self._zygote: ZygoteHandle | None = None  # kept across clusters (see _start_zygote)
        self._forked_controller: Any = None  # the controller, where the zygote forked it
        self._fork_server_idle_s = 0.0
        self._cluster: Any = None
        self.client: Any = None
        self.launcher = "local"
        self._launcher: Launcher = make_launcher("local", LaunchOptions())
        self.controller_ip = "127.0.0.1"
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

    # --- start / stop ------------------------------------------------------------------------

    def start(self, n: int | None = None, gpus: str | None = "auto", launcher: str = "local",
              profile: str | None = None, timeout: float = 60.0,
              controller_ip: str | None = None,
              options: LaunchOptions | None = None) -> list[EngineSlot]:
        """Start a controller and ``n`` engines and wait until every engine answers.

        ``options`` carry what the launcher needs (``--hosts``, ``--slurm-args``, ``--ip``);
        ``controller_ip`` is the same as ``options.ip``: engines started elsewhere and then
        :meth:`adopt`-ed reach a local cluster's controller there.
        """
        if self.running:
            raise ClusterError(f"a cluster is already running with {self.size} engine(s); "
                               "use %cluster scale N to resize it or %cluster stop first")
        spec = parse_gpu_spec(gpus)
        try:
            fork_idle_s = fork_server_idle_s()
        except ValueError as exc:
            raise ClusterError(str(exc)) from None
        options = options or LaunchOptions()
        if controller_ip:
            options = LaunchOptions(**{**vars(options), "ip": controller_ip})
        chosen = make_launcher(launcher, options)
        local_gpus = self._device_lister() if spec.mode != "none" else []
        count = check_count(n, "-n") if n is not None else (
            chosen.default_count() or default_engine_count(spec, local_gpus))
        self.check_limit(count)
        if chosen.engines_here:  # decide devices before starting
            assign_devices(spec, [socket.gethostname()] * count, {socket.gethostname(): local_gpus})
        self.gpu_spec, self._gpus, self.timeout = spec, local_gpus, timeout
        self._fork_server_idle_s = fork_idle_s
        self.launcher, self._launcher = chosen.name, chosen
        self._runner = LoopThread()
        self._warden = Warden.start()
        try:
            self._start_zygote(local_gpus)
            self._runner.run(self._start_controller(profile), timeout + 30)
            self._add_engines(count)
        except BaseException:
            self._teardown()
            raise
        return self.slots()

    def _start_zygote(self, local_gpus: list[str]) -> None:
        """Local CPU engines are forked from a process that imported torch once (it imports
        while the first controller starts, and serves the kernel's later clusters too); GPU
        engines start fresh: CUDA state must not cross a fork.

        The zygote is not the cluster watchdog's to end: it outlives ``%cluster stop`` (for
        ``PHALANX_FORK_SERVER_IDLE_S``, default 600 s, without engines) and ends by itself
        when the kernel does."""
        wanted = self._launcher.forks_engines and not (self.gpu_spec.mode != "none" and local_gpus) \
            and os.environ.get("PHALANX_FORK_SERVER") != "0"
        kept = self._zygote
        if kept is not None and not (wanted and kept.serves({**os.environ, **parent_env()})):
            self.close_fork_server()  # ended, turned off, or imported under other variables
        if wanted and self._zygote is None:
            self._zygote = ZygoteHandle.start(idle_s=self._fork_server_idle_s)

    def close_fork_server(self) -> None:
        """Stop the kept fork server (the session's end; ``%cluster stop`` keeps it)."""
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.close()

    async def _start_controller(self, profile: str | None) -> None:
        import ipyparallel as ipp

        kwargs: dict[str, Any] = dict(
            engines=self._launcher.name, delay=0, engine_timeout=int(self.timeout),
            controller_args=list(CONTROLLER_ARGS) + NO_TASK_DATABASE, shutdown_atexit=True,
            log=quiet_logger(), parent=None)
        if profile and os.sep in profile:  # a profile's folder rather than its name
            kwargs["profile_dir"] = os.path.abspath(os.path.expanduser(profile))
        elif profile:
            kwargs["profile"] = profile
        self._cluster = cluster = ipp.Cluster(**kwargs)
        self._launcher.profile_config = cluster.config
        self._launcher.profile_dir = cluster.profile_dir
        self._launcher.check()  # before any process starts
        self.controller_exit = None
        self.controller_ip = cluster.controller_ip = self._launcher.listen_address(
            cluster.controller_ip or None)
        cluster.controller_args = list(cluster.controller_args) + self._launcher.controller_args(
            self.controller_ip)
        # A zygote kept from the kernel's last cluster forks the controller too (a new one is
        # still importing: the controller does not wait for it).  The controller uses no GPU.
        zygote = self._zygote if self._zygote is not None and self._zygote.ready() else None
        environment = parent_env()
        if zygote is not None:
            environment.update(zygote.environment(), CUDA_VISIBLE_DEVICES="")
        self._forked_controller = None
        await cluster.start_controller(controller_cmd=supervised("ipyparallel.controller"),
                                       environment=environment)
        assert self._warden is not None  # started just before the controller
        stand_in = launched_processes(cluster.controller)
        self._warden.watch(stand_in)
        cluster.controller.on_stop(self._controller_stopped)
        self.client = await cluster.connect_client()
        # the controller's word that an engine is gone marks its rank dead at once (an SSH
        # launcher notices an exited engine only when its next poll over SSH returns)
        self.client._registration_callbacks.append(self._engine_event)
        self._warden.remove_at_exit(files_of(cluster))
        if zygote is not None and stand_in:  # it runs by now: the client has connected to it
            self._forked_controller = zygote.controller(since=stand_in[0].create_time())
            if self._forked_controller is not None:  # the warden then knows its schedulers
                self._warden.watch([self._forked_controller])

    def stop(self) -> bool:
        """Stop every engine and the controller; returns False when nothing was running.

        Returns once every engine process has exited, on every host; raises, after the stop,
        naming those still running where one could not be ended (an unreachable host)."""
        if not self.running:
            return False
        running = self._teardown()
        if running:
            raise ClusterError("the cluster was stopped, but engine processes are still exiting: "
                               + "; ".join(running))
        return True

    def _teardown(self) -> list[str]:
        with self._lock:
            slots = list(self._slots.values())
            pids = local_pids(self._slots.values())
            nannies = children_of(pids) + (self._zygote.nannies() if self._zygote else [])
            segments = mpich_segments(pids)  # read while the engines still map them
            asked = [s.engine_id for s in self._slots.values() if self._ask_to_exit(s)]
            for slot in self._slots.values():
                slot.state = "stopping"
        cluster, client, runner, warden = self._cluster, self.client, self._runner, self._warden
        self._cluster = self.client = self._runner = self._warden = None
        self._forked_controller = None
        sets = list(cluster.engines.values()) if cluster is not None else []
        files = files_of(cluster) if cluster is not None else []
        running: list[str] = []
        try:
            left = True
            if client is not None:
                left, running = self._launcher.end_engines(
                    sets, slots, lambda: shutdown_engines(client, asked))
                client.close(linger=0)
            if self._launcher.ends_engines_by_pid:
                terminate_together(pids)
            if cluster is not None and runner is not None:
                if left and self._launcher.ask_engines_to_exit:  # the engines are gone
                    for set_id in list(cluster.engines):
                        self._launcher.forget(cluster.engines.pop(set_id))
                    runner.run(cluster.stop_controller(), timeout=30)
                else:
                    runner.run(cluster.stop_cluster(), timeout=30)
        except Exception as exc:  # keep going: what matters is that no process survives
            log.warning("phalanx: stopping the cluster raised %s; killing leftovers", exc)
        finally:
            kill_leftovers(pids)
            # Each engine's nanny, once its engine is gone, tells the controller so and lingers
            # 3 s trying when the controller has stopped too (ipyparallel's LINGER): with the
            # whole cluster gone there is no one left to tell.
            terminate_together(nannies, grace=1.0)
            self._await_gone(sets)
            remove_segments(segments)  # the engines that mapped them are gone (killed above)
            if not self._fork_server_idle_s:  # kept only where it may outlive the cluster
                self.close_fork_server()  # after the engines: it would kill any still running
            if warden is not None:  # it ends what the stop left (a dead controller's schedulers)
                warden.close()
            if runner is not None:
                runner.close()
            self._launcher.cleanup()
            remove_files(files)  # what the controller's own exit leaves
            with self._lock:
                self._slots.clear()
                self._ranks = RankTable()
                self.generation += 1
            self._on_change()
        return running

    def _await_gone(self, sets: list) -> None:
        """Return once the launcher no longer lists the stopped sets (a cancelled batch job
        leaves the queue only after its processes ended)."""
        for engine_set in sets:
            try:
                self._launcher.after_stop(engine_set)
            except Exception as exc:
                log.warning("phalanx: checking that %s is gone raised %s",
                            self._launcher.set_name(engine_set), exc)

    def _controller_stopped(self, data: dict | None) -> None:
        """The controller exited: a run in progress can no longer hear from any engine."""
        if self._cluster is None:  # stopped by us
            return
        self.controller_exit = dict(data or {}, pid=getattr(self._cluster.controller, "pid", None))
        log.warning("phalanx: the cluster's controller exited (%s)", data)
        self._on_change()


    # --- scaling ------------------------------------------------------------------------------

    def scale(self, n: int) -> list[EngineSlot]:
        """Grow or shrink to ``n`` engines; shrinking stops the highest ranks."""
        self._require_running()
        n = check_count(n, "scale")
        self.check_limit(n)
        current = self.size
        if n > current:
            if self._launcher.engines_here:
                assign_devices(self.gpu_spec, [socket.gethostname()] * n, {socket.gethostname(): self._gpus})
            self._add_engines(n - current)
        elif n < current:
            self._remove_slots(self._ranks.highest(current - n))
        return self.slots()

    # --- checks -------------------------------------------------------------------------------

    def _require_running(self) -> None:
        if not self.running:
            raise ClusterError("no cluster is running: start one with %cluster start -n 2")

    def check_limit(self, n: int) -> None:
        """Refuse ``n`` engines when it is above the configured maximum (PHALANX_MAX_ENGINES)."""
        if n > self.max_engines:
            raise ClusterError(f"{n} engines is above this cluster's limit of {self.max_engines} "
                               "(set PHALANX_MAX_ENGINES to raise it)")
