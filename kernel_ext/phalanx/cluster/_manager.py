"""The kernel's handle on one ipyparallel cluster: start, scale, restart, stop, status.

Processes are started by ipyparallel's own ``Cluster`` and launchers.  What phalanx adds:

* a launcher object per kind (:mod:`._launchers`) says where the controller listens and how
  engines start; with the local launcher every engine is its own engine set (a *slot*), so one
  rank can be restarted or stopped alone, which ipyparallel cannot do by engine id;
* dense ranks over the slots (:class:`~._ranks.RankTable`), pinned GPUs (:mod:`._gpus`);
  restarts and scale-downs that leave no old engine running on any host (:mod:`._replace`,
  :mod:`._stopping`);
* fail-fast start (:mod:`._engines`): an engine set that exits before registering ends the wait
  at once with the tail of its log, and nothing is left running.

The manager decides what happens (is a cluster running, how many engines, which launcher and
devices) and hands the doing to its parts, each given the shared :class:`~phalanx.cluster._cluster_state.ClusterState`
and the other parts it needs: :class:`~._controller.ControllerStarter`,
:class:`~._engines.EngineStarter`, :class:`~._stopping.EngineStopper`,
:class:`~._replace.Restarter`, :class:`~._teardown.ClusterTeardown`,
:class:`~._exit_watch.ExitWatch`, :class:`~._reporting.StatusReport`,
:class:`~._adoption.Adoption` and the kept :class:`~._fork_server.ForkServer`.

Example::

    manager = ClusterManager()
    manager.start(n=2, gpus="none")
    manager.scale(3); manager.restart(rank=1); manager.stop()
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable

from ._adoption import Adoption
from ._controller import ControllerStarter
from ._engine_log import TAIL_LINES, tail
from ._engines import EngineStarter
from ._errors import ClusterError
from ._exit_stop import stop_at_exit
from ._exit_watch import ExitWatch
from ._fork_server import ForkServer
from ._gpus import GpuSpec, assign_devices, default_engine_count, parse_gpu_spec, visible_gpus
from ._launchers import Launcher, LaunchOptions, make_launcher
from ._loop import LoopThread
from ._procs import check_count
from ._ranks import EngineSlot
from ._replace import Restarter
from ._reporting import StatusReport
from ._cluster_state import ClusterState
from ._stopping import EngineStopper
from ._teardown import ClusterTeardown
from ._warden import Warden
from ._zygote_handle import fork_server_idle_s

# The controller and engines on this host run under phalanx's supervisor (cluster/_supervise.py):
# a private umask (connection files are owner-only from the moment they exist) and a watchdog
# that stops them when the kernel is gone.  A watchdog process per cluster (cluster/_warden.py)
# ends what those cannot (a dead controller's schedulers, a stopped engine) and the kernel's files.


class ClusterManager:
    """Start and manage one ipyparallel cluster; all methods are synchronous.

    ``on_change`` is called (from any thread) whenever engines come, go or change state.
    ``device_lister`` returns the GPU ids visible on this host (tests pass a fake list).
    """

    def __init__(self, on_change: Callable[[], None] | None = None,
                 device_lister: Callable[[], list[str]] = visible_gpus,
                 max_engines: int | None = None) -> None:
        self._device_lister = device_lister
        self.state = state = ClusterState(
            on_change or (lambda: None),
            max_engines or int(os.environ.get("PHALANX_MAX_ENGINES", "64")))
        # each part gets the state and the parts it calls; none knows the manager
        self.fork_server = ForkServer()  # kept across clusters (see ForkServer.prepare)
        self.exits = ExitWatch(state)
        self.controller_starter = ControllerStarter(state, self.fork_server, self.exits)
        self.engine_stopper = EngineStopper(state)
        self.engine_starter = EngineStarter(state, self.engine_stopper, self.exits,
                                            self.fork_server)
        self.restarter = Restarter(state, self.engine_starter, self.engine_stopper)
        self.teardown = ClusterTeardown(state, self.engine_stopper, self.fork_server)
        self.report = StatusReport(state, self.fork_server)
        self.adoption = Adoption(state, self.engine_starter)
        # what the last stop could not check or end, by host (an unreachable one), in words
        self.still_exiting: list[str] = []

    # --- what the last start chose, and the running cluster ---------------------------------

    @property
    def running(self) -> bool:
        return self.state.running

    @property
    def size(self) -> int:
        return self.state.size

    @property
    def client(self) -> Any:
        """The ipyparallel Client while a cluster runs, else ``None``."""
        return self.state.client

    @property
    def launcher(self) -> str:
        """The name of the last start's launcher (``local`` before any)."""
        return self.state.launcher.name

    @property
    def controller_ip(self) -> str:
        return self.state.controller_ip

    @property
    def gpu_spec(self) -> GpuSpec:
        return self.state.gpu_spec

    @property
    def timeout(self) -> float:
        """How long engines may take to register (the last start's ``timeout``)."""
        return self.state.timeout

    @property
    def log_file(self) -> str | None:
        """The last started cluster's log: what its engines and controller said that is not
        the user's (their logging, tracebacks outside a cell), appended as each process stops."""
        return self.state.engine_log.path if self.state.engine_log is not None else None

    def log_tail(self, lines: int = TAIL_LINES) -> list[str]:
        """The last ``lines`` lines of the cluster's log, what its running processes said so
        far included (the panel's Log)."""
        return tail(self.log_file, self.state.cluster if self.running else None, lines)

    @property
    def generation(self) -> int:
        """Bumped whenever the rank -> engine mapping changes."""
        return self.state.generation

    @property
    def controller_exit(self) -> dict | None:
        """How the controller exited, where it stopped on its own (else ``None``)."""
        return self.state.controller_exit

    @property
    def max_engines(self) -> int:
        return self.state.max_engines

    @max_engines.setter
    def max_engines(self, n: int) -> None:
        self.state.max_engines = n

    # --- queries ---------------------------------------------------------------------------

    def slots(self) -> list[EngineSlot]:
        """Slots in rank order."""
        return self.state.in_rank_order()

    def engine_ids(self) -> list[int]:
        """ipyparallel engine ids in rank order."""
        return [s.engine_id for s in self.slots() if s.engine_id is not None]

    def view(self, ranks: list[int] | None = None) -> Any:
        """A DirectView on the engines of ``ranks`` (default: all), in rank order."""
        self.state.require_running()
        ids = self.engine_ids()
        targets = ids if ranks is None else [ids[r] for r in ranks]
        return self.client[targets]

    def topology(self) -> tuple:
        """(generation, engine ids in rank order): changes whenever a process group must re-form."""
        return (self.generation, tuple(self.engine_ids()))

    def status(self, steps: dict[int, int] | None = None) -> list[dict]:
        """One row per rank: rank, engine id, host, pid, device, state, memory (MB), step."""
        return self.report.status(steps)

    def process_ids(self) -> dict[str, list[int]]:
        """Local processes of the cluster by role (controller, engines, warden, zygote), with
        their children.  For audits and leak checks."""
        return self.report.process_ids()

    def check_limit(self, n: int) -> None:
        """Refuse ``n`` engines when it is above the configured maximum (PHALANX_MAX_ENGINES)."""
        self.state.check_limit(n)

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
        state = self.state
        if self.running:
            raise ClusterError(f"a cluster is already running with {self.size} engine(s); "
                               "use %cluster scale N to resize it or %cluster stop first")
        spec = parse_gpu_spec(gpus)
        try:
            fork_idle_s = fork_server_idle_s()
        except ValueError as exc:
            raise ClusterError(str(exc)) from None
        chosen = make_launcher(launcher, _with_ip(options or LaunchOptions(), controller_ip))
        local_gpus = self._device_lister() if spec.mode != "none" else []
        count = self._engine_count(n, chosen, spec, local_gpus)
        state.gpu_spec, state.gpus, state.timeout, state.launcher = spec, local_gpus, timeout, chosen
        state.runner = LoopThread()
        state.warden = Warden.start()
        stop_at_exit(self)
        try:
            self.fork_server.prepare(chosen, spec, local_gpus, fork_idle_s)
            state.runner.run(self.controller_starter.start(profile), timeout + 30)
            self.engine_starter.add(count)
        except BaseException:
            self.teardown.run()
            raise
        return self.slots()

    def _engine_count(self, n: int | None, chosen: Launcher, spec: GpuSpec,
                      local_gpus: list[str]) -> int:
        """How many engines a start means, checked against the limit and, for engines on this
        host, against the devices (decided before anything starts)."""
        count = check_count(n, "-n") if n is not None else (
            chosen.default_count() or default_engine_count(spec, local_gpus))
        self.check_limit(count)
        if chosen.engines_here:
            here = socket.gethostname()
            assign_devices(spec, [here] * count, {here: local_gpus})
        return count

    def close_fork_server(self) -> None:
        """Stop the kept fork server (the session's end; ``%cluster stop`` keeps it)."""
        self.fork_server.close()

    def stop(self) -> bool:
        """Stop every engine and the controller; returns False when nothing was running.

        Returns once every engine process has exited, on every host.  Where one could not be
        checked or ended (a host that cannot be reached) the stop still completes - nothing of
        the cluster is left in the kernel - and :attr:`still_exiting` names each such process
        (``%cluster stop`` says them): it exits by itself once it misses the controller's
        heartbeats."""
        if not self.running:
            return False
        self.still_exiting = self.teardown.run()
        return True

    # --- scaling, restarts, engines started elsewhere -----------------------------------------

    def engines_starting(self) -> tuple[int, int]:
        """Of the engines a start or scale under way launched: (answered, launched); (0, 0)
        before any is launched (the controller is starting).  Read from any thread."""
        with self.state.lock:
            new = [s for s in self.state.slots.values() if s.state == "starting"]
        return sum(s.engine_id is not None for s in new), len(new)

    def scale(self, n: int) -> list[EngineSlot]:
        """Grow or shrink to ``n`` engines; shrinking stops the highest ranks."""
        state = self.state
        state.require_running()
        n = check_count(n, "scale")
        self.check_limit(n)
        current = self.size
        if n > current:
            if state.launcher.engines_here:
                here = socket.gethostname()
                assign_devices(state.gpu_spec, [here] * n, {here: state.gpus})
            self.engine_starter.add(n - current)
        elif n < current:
            self.engine_stopper.remove(state.ranks.highest(current - n))
        return self.slots()

    def restart(self, rank: int | None = None) -> list[EngineSlot]:
        """Restart one rank (its engine is replaced on its host, the rank is kept; the old
        engine's process has exited when this returns) or every engine."""
        self.restarter.restart(rank)
        return self.slots()

    def engine_connection_file(self) -> str:
        """What an engine started by hand needs (``ipengine --file=PATH``): the controller's
        address and keys.  Owner-only; copy it only to hosts you trust."""
        return self.adoption.connection_file()

    def adopt(self, slot_ids: list[str], timeout: float | None = None) -> list[EngineSlot]:
        """Give the next ranks to engines phalanx did not start (in a container, a network
        namespace, on a host no launcher reaches).  Each must run with ``PHALANX_SLOT=<id>``
        (and, when the hostname does not tell it apart, ``PHALANX_HOST``/``PHALANX_ADDRESS``).

        Example::

            path = manager.engine_connection_file()
            # there: PHALANX_SLOT=far-0 python -m ipyparallel.engine --file=PATH
            manager.adopt(["far-0"])
        """
        self.adoption.adopt(slot_ids, timeout)
        return self.slots()


def _with_ip(options: LaunchOptions, controller_ip: str | None) -> LaunchOptions:
    """``options`` with the controller's address set, where ``controller_ip`` gives one."""
    return LaunchOptions(**{**vars(options), "ip": controller_ip}) if controller_ip else options
