"""One session per kernel: it owns the cluster, the runs and the event bus.

Magics, widgets and the lab comm only call the session; the session calls the cluster layer and
the fit runner.  It holds no views: its verbs return plain data (:class:`EngineStatus`, run
records, rows) and the views in :mod:`phalanx.widgets` and the magics render them.  The session
lives on the IPython shell object (no module-level singleton), so two kernels never share one
and a fresh kernel starts clean.

Example::

    session = session_for_shell()
    session.start_cluster(n=2, gpus="none")
    session.scale(3)
    session.stop_cluster()
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

from . import _px_magics as px_magics
from . import events
from ._bus import EventBus
from ._dask_client import UserDask
from ._run_history import RunHistoryQueries
from ._run_records import RunRecords
from ._session_networks import NetworkVerbs
from .cluster import ClusterError, ClusterManager, LaunchOptions, memory_mb, visible_gpus
from .cluster._memory import add_engine_figures
from .fit import FitOptions, FitRunner, FitUsageError, RunRecord

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from .fit.telemetry._tracker import RunTracker

log = logging.getLogger("phalanx")

_ATTRIBUTE = "_phalanx_session"


def _serialised(verb: Callable) -> Callable:
    """The panel calls verbs from a subshell thread while cells call them from the main one:
    one verb at a time, and a run counts as started once it is the active run."""
    @functools.wraps(verb)
    def wrapper(self: "Session", *args: Any, **kwargs: Any) -> Any:
        with self._verbs:
            return verb(self, *args, **kwargs)
    return wrapper


@dataclasses.dataclass(frozen=True)
class EngineStatus:
    """The engines now: one row per rank (rank, engine id, host, pid, device, state, memory,
    step of the current run) and the launcher that started them; no rows when no cluster runs.

    Plain data: ``%cluster status`` and the cluster widget render it
    (:class:`phalanx.widgets.ClusterStatus`).
    """

    rows: list[dict]
    launcher: str

    def __len__(self) -> int:
        return len(self.rows)


class Session(RunHistoryQueries, RunRecords, NetworkVerbs):
    """The kernel's phalanx state: cluster, runs, networks and the event bus."""

    def __init__(self, shell: InteractiveShell | None = None,
                 device_lister: Callable[[], list[str]] = visible_gpus) -> None:
        self._verbs = threading.RLock()
        self.shell = shell
        self.events = EventBus()
        self.cluster = ClusterManager(on_change=self._cluster_changed, device_lister=device_lister)
        self.fits = FitRunner(self.cluster, self.events.emit)
        self.user_dask = UserDask()  # phalanx.dask_client(): follows scale and restart
        self._profile_next: int | None = None  # the panel's Profile button, for the next run

    # --- what the views ask -------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a cluster is running."""
        return self.cluster.running

    @property
    def size(self) -> int:
        """How many engines the cluster has (0 when none runs)."""
        return self.cluster.size if self.cluster.running else 0

    @property
    def launcher(self) -> str:
        """The launcher that started the cluster (or the last one used): ``local``, ``ssh``..."""
        return self.cluster.launcher

    @property
    def max_engines(self) -> int:
        """The most engines this cluster may have."""
        return self.cluster.max_engines

    def engines_starting(self) -> tuple[int, int]:
        """How far a start or scale under way is: (engines answered, engines launched)."""
        return self.cluster.engines_starting()

    @property
    def last_record(self) -> RunRecord | None:
        """The record of the last ``%%distributed_fit`` run, None before the first one
        (:meth:`last_run` raises instead)."""
        return self.fits.last

    @property
    def stop_reason(self) -> str | None:
        """Why the last run was stopped on request (the Stop button, :meth:`stop_run`); None
        when it was not."""
        return self.fits.control.stopped_by

    def serve_messages_during_runs(self, pump: Callable[[], None]) -> None:
        """Call ``pump`` at every poll of a run's wait loop: a kernel without subshells answers
        the panel's and the widgets' messages there while a cell runs (:mod:`phalanx._pump`)."""
        self.fits.control.message_pump = pump

    def call_in_wait_loop(self, task: Callable[[], object], delay_s: float = 0.0) -> None:
        """Run ``task`` on the running cell's own thread, at the first poll of its run's wait
        loop ``delay_s`` seconds from now or later (any thread may ask): widgets made there are
        addressed to the cell.  A run over sooner never runs it."""
        self.fits.control.call_soon(task, delay_s)

    # --- cluster verbs (the magic and the widgets call these) ---------------------------------

    @_serialised
    def start_cluster(self, n: int | None = None, gpus: str = "auto", launcher: str = "local",
                      profile: str | None = None, timeout: float = 60.0,
                      options: LaunchOptions | None = None) -> EngineStatus:
        """Start a cluster (``%cluster start``) and return its status."""
        with self._changing():
            self.cluster.start(n=n, gpus=gpus, launcher=launcher, profile=profile, timeout=timeout,
                               options=options)
        px_magics.after_start(self.shell, self.cluster.client)  # %px: on these engines
        return self.status()

    @_serialised
    def scale(self, n: int, queue: bool = False) -> EngineStatus:
        """Grow or shrink to ``n`` engines (``%cluster scale N``).

        While a run with ``--checkpoint-every`` goes, the run itself changes size at its next
        commit (elastic scaling) and continues; other runs refuse, or with ``queue`` (the
        panel's +/-) the cluster is scaled when the run is over.
        """
        if self.fits.active is not None:
            try:
                try:
                    self.fits.request_resize(n)
                except FitUsageError:
                    if not queue:
                        raise
                    self.fits.queue_resize(n)
            except FitUsageError as exc:
                raise ClusterError(f"cannot scale the cluster while run {self.fits.active_name!r} "
                                   f"is going: {exc}") from None
            self._cluster_changed()  # the views show what waits
            return self.status()
        self._stop_dask(resume=True)
        with self._changing():
            self.cluster.scale(n)
        self.user_dask.resume(self.cluster)
        return self.status()

    @_serialised
    def restart(self, rank: int | None = None) -> EngineStatus:
        """Restart one rank or every engine (``%cluster restart [RANK]``)."""
        self._refuse_during_run("restart engines")
        self._stop_dask(resume=True)
        with self._changing():
            self.cluster.restart(rank)
        self.user_dask.resume(self.cluster)
        return self.status()

    @_serialised
    def stop_cluster(self) -> bool:
        """Stop the cluster; False when none was running."""
        self._refuse_during_run("stop the cluster")
        self._stop_dask()
        if not self.cluster.running:
            return False
        client = self.cluster.client
        with self._changing():
            stopped = self.cluster.stop()
        self.fits.release_listeners()
        px_magics.after_stop(self.shell, client)  # %px: "no cluster is running"
        return stopped

    def forget(self, names: list[str] | None = None) -> tuple[str, ...]:
        """Release objects ``--keep`` left live on the engines (``%cluster forget NAMES``; all
        with None); returns the names released."""
        self._refuse_during_run("release kept objects")
        return self.fits.forget(names)

    def status(self) -> EngineStatus:
        """The engines now (``%cluster status``); during a run, with its steps and the engines'
        own memory figures."""
        from .cluster._memory import fill_engine_memory, merge_samples
        from .fit.run._kept_on_engines import human_size

        active = self.fits.active
        rows = self.cluster.status(active.steps if active is not None else None) if self.cluster.running else []
        if active is not None:  # the engines' own samples, about a second old
            merge_samples(rows, active.memory.latest())
        elif rows:  # GPU and remote engines: only they know their figures
            fill_engine_memory(self.cluster.client, rows)
        for rank, held in self.fits.shares().items():  # a sharded run's: about 1/N each
            if rank < len(rows):
                rows[rank]["share"] = " / ".join(
                    human_size(held.get(part, 0))
                    for part in ("parameters", "gradients", "optimizer_state"))
        return EngineStatus(rows, self.cluster.launcher)

    def engine_log(self, lines: int = 200) -> tuple[str | None, list[str]]:
        """The cluster's log file and its last ``lines`` lines: what the engines and the
        controller said that is not the user's, the running ones' so far included (the panel's
        Log).  ``(None, [])`` before any cluster started."""
        return self.cluster.log_file, self.cluster.log_tail(lines)

    def stacks(self) -> str:
        """Every rank's Python stack at this moment (``%cluster stacks``), with the collective
        it waits in and for how long; answered within 2 s, during a run too, stopping nothing."""
        from .fit.debug._stacks import ask_stacks, describe_stacks

        if not self.cluster.running:
            raise ClusterError("no cluster is running: start one with %cluster start -n 2")
        slots = self.cluster.slots()
        return describe_stacks(slots, ask_stacks(self.cluster, slots, self.fits.active is not None))

    def stop_run(self, reason: str = "stop requested") -> bool:
        """Stop the running run at its next poll (any thread); False when none runs."""
        if self.fits.active is None:
            return False
        self.fits.control.request_stop(reason)
        return True

    def profile_next_run(self, steps: int = 5) -> None:
        """The next ``%%distributed_fit`` records ``steps`` steps as ``--profile steps`` would
        (the panel's Profile button; any thread).  A cell with its own ``--profile`` keeps it."""
        self._profile_next = int(steps)

    def _refuse_during_run(self, what: str) -> None:
        if self.fits.active is not None:
            raise ClusterError(f"cannot {what} while run {self.fits.active_name!r} is going; "
                               "wait for it or interrupt it")

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """Views show "changing" while engines start or stop, and the outcome after, even when
        the change fails."""
        self._cluster_changed(busy=True)
        try:
            yield
        finally:
            self._cluster_changed()

    def _cluster_changed(self, busy: bool = False, samples: dict[int, dict] | None = None) -> None:
        """Tell the views what the engines are now (``busy``: a change is under way;
        ``samples``: the engines' last memory figures, which hold their GPU memory)."""
        rows = []
        if self.cluster.running:
            for rank, slot in enumerate(self.cluster.slots()):
                rows.append({"rank": rank, "engine_id": slot.engine_id if slot.engine_id is not None else -1,
                             "host": slot.host, "pid": slot.pid, "device": slot.device or "cpu",
                             "state": slot.state, "memory_mb": memory_mb(slot.pid, slot.host),
                             "step": None})
        if samples:
            add_engine_figures(rows, samples)
        self.events.emit(events.cluster_state(rows, self.max_engines, busy=busy,
                                              launcher=self.cluster.launcher,
                                              notice=self.fits.pending_notice()))

    # --- runs ---------------------------------------------------------------------------------

    def distributed_fit(self, body: str, opts: FitOptions, user_ns: dict,
                        on_start: Callable[[RunTracker, str], None] | None = None) -> RunRecord:
        """Run a training cell on every engine (``%%distributed_fit``)."""
        from .fit.analysis._precheck import check_cell
        from .fit.analysis._reproduce import cell_hash, warn_if_world_differs

        # a typo is said before "no cluster" and long runs; kept names are live on the engines
        check_cell(body, opts, user_ns, self.fits.kept.names_for(self.fits.kept.engines))
        self.run_log(user_ns)  # the notebook's: runs are numbered and recorded there
        self._verbs.acquire()  # held until the run is the active one (or failed to start)
        held = [True]
        run_id: list[str] = []

        def started(tracker: RunTracker, name: str) -> None:
            if held[0]:
                held[0] = False
                self._verbs.release()
            run_id.append(tracker.run_id)
            self._record_started(tracker, name, body)
            if on_start is not None:
                on_start(tracker, name)

        pending, self._profile_next = self._profile_next, None
        if pending and opts.train.profile is None:
            opts = dataclasses.replace(opts, train=dataclasses.replace(opts.train, profile=pending))
        try:
            if self.cluster.running:
                warn_if_world_differs(body, user_ns, opts.n or self.cluster.size)
            record = self.fits.run(body, opts, user_ns, on_start=started)
        except BaseException as exc:
            if run_id:
                self._record_ended(run_id[0], exc)
            raise
        else:
            self._record_ended(record.run_id, None)
        finally:
            if held[0]:
                self._verbs.release()
            # The views' engine table had live figures during the run: give them the engines'
            # state after it, not the figures read before it began.
            self._cluster_changed(samples=self.fits.last_memory)
        record.manifest["cell"] = cell_hash(body)
        return record

    def last_run(self) -> RunRecord:
        """The record of the last ``%%distributed_fit`` run (``phalanx.last_run()``)."""
        if self.fits.last is None:
            raise FitUsageError("no %%distributed_fit run yet in this kernel")
        return self.fits.last

    # --- views --------------------------------------------------------------------------------

    def attach_lab(self) -> None:
        """Let the JupyterLab panel connect (idempotent)."""
        if getattr(self, "lab_comm", None) is None:
            from ._labcomm import LabComm

            self.lab_comm = LabComm(self)
        self.lab_comm.register()

    def close(self) -> None:
        """Stop everything this session started."""
        client = self.cluster.client
        try:
            self._stop_dask()
            self.cluster.stop()
            px_magics.after_stop(self.shell, client)
        finally:
            self.cluster.close_fork_server()
            self.fits.close()
            lab = getattr(self, "lab_comm", None)
            if lab is not None:
                lab.close()


def session_for_shell(shell: InteractiveShell | None = None) -> Session:
    """The session of ``shell`` (default: the running IPython), created on first use."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            raise RuntimeError("phalanx needs an IPython kernel: run `%load_ext phalanx` in Jupyter")
    session = getattr(shell, _ATTRIBUTE, None)
    if session is None:
        session = Session(shell)
        setattr(shell, _ATTRIBUTE, session)
        if getattr(shell, "kernel", None) is not None:  # a Jupyter kernel: the panel may attach
            session.attach_lab()
    return session


def close_session(shell: InteractiveShell) -> None:
    session = getattr(shell, _ATTRIBUTE, None)
    if session is not None:
        session.close()
        setattr(shell, _ATTRIBUTE, None)
