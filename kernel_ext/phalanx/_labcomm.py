"""The kernel end of the JupyterLab panel: a ``phalanx`` comm target fed from the event bus.

The panel opens a comm to target :data:`~phalanx.events.COMM_TARGET` and sends only typed
requests (``request_snapshot``, ``scale``, ``stop``, ``stop_run``, ``request_window``,
``profile_next``, ``request_run``, ``request_log``); it never sends code.  This
module answers them and forwards every bus event to every open panel comm, throttled to about ten messages a
second: ``cluster``/``progress``/``network`` states are coalesced (only the latest matters),
metric rows are batched and thinned to a bounded number of points per line and flush, the way
the panel downsamples them anyway, with the mean over ranks taken from every row (see
:mod:`._outbox` and :mod:`._panel_stream`); the whole history stays in the kernel.
A reloaded panel gets the run's downsampled curves and the list of the kernel's runs; a picked
earlier run gets its record and curves (:class:`~._panel_stream.RunArchive`); a zoomed chart asks
for its step window and gets it at full resolution from the kernel's history.

The panel talks over a kernel subshell where the kernel has them, so its requests are answered
on that subshell's thread while a cell runs: everything here holds ``self._lock``, and the
session verbs it calls either only set a flag for the running run (stop, resize) or take the
session's own lock.  Where the kernel has no subshells, the run's wait loop serves the comm
messages itself (:mod:`._pump`).

Example::

    lab = LabComm(session)      # session: .events, .scale(n), .stop_cluster(), .max_engines,
    lab.register()              #          .run_history_rows(), .run_history_means(), ...
    ...
    lab.close()
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from . import events
from ._outbox import Outbox, wire_safe
from ._panel_answers import LOG_LINES, PanelAnswers
from ._panel_stream import RunArchive, thin_metrics
from ._pump import answer_where_sent
from .events import COMM_TARGET, SchemaError, validate_event, validate_request

if TYPE_CHECKING:
    from comm.base_comm import BaseComm, CommManager

    from ._kernel_status import KernelStatus
    from ._session import Session

log = logging.getLogger("phalanx")

# One comm message per this many seconds on average: the panel renders at about 10 fps, and
# every comm message is broadcast on IOPub to every client of the kernel.
MIN_INTERVAL_S = 0.1
# Page reloads leave comms whose browser side is gone; nothing tells the kernel, and each open
# comm costs one IOPub message per update.  Past this many, the oldest are closed.
MAX_COMMS = 8

Schedule = Callable[[float, Callable[[], None]], Callable[[], None]]


def _thread_timer(delay: float, fn: Callable[[], None]) -> Callable[[], None]:
    timer = threading.Timer(delay, fn)
    timer.daemon = True
    timer.start()
    return timer.cancel


class LabComm(PanelAnswers):
    """Serve the ``phalanx`` comm for one session: forward events, answer panel requests
    (what the answers hold: :class:`~._panel_answers.PanelAnswers`).

    ``comm_manager`` and ``create_comm`` default to the running kernel's (ipykernel installs
    them in the ``comm`` package); ``clock`` and ``schedule`` are injectable so the throttle
    can be tested without sleeping.

    Example::

        lab = LabComm(get_session())
        lab.register()       # panels already open attach now, later ones on opening
    """

    def __init__(self, session: Session, *, comm_manager: CommManager | None = None,
                 create_comm: Callable[..., BaseComm] | None = None,
                 clock: Callable[[], float] = time.monotonic, schedule: Schedule = _thread_timer,
                 min_interval_s: float = MIN_INTERVAL_S) -> None:
        self._session = session
        self._comm_manager = comm_manager
        self._create_comm = create_comm
        self._clock = clock
        self._schedule = schedule
        self._interval = min_interval_s
        self._lock = threading.RLock()
        self._comms: list[BaseComm] = []
        self._outbox = Outbox()
        self._progress: dict[str, dict] = {}  # latest merged progress of the current run
        # the kernel's runs, for the panel's run list, after the notebook's earlier ones
        self._runs = RunArchive(earlier=getattr(session, "runs", None))
        self._next_at = 0.0
        self._cancel_timer: Callable[[], None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._kernel_status: KernelStatus | None = None  # the kernel's status kept busy during a run

    # --- lifecycle ----------------------------------------------------------------------------

    def register(self) -> None:
        """Register the comm target, subscribe to the bus and tell open panels to attach."""
        import comm

        if self._unsubscribe is not None:
            return
        manager = self._comm_manager = self._comm_manager or comm.get_comm_manager()
        self._create_comm = self._create_comm or comm.create_comm
        manager.register_target(COMM_TARGET, self._on_open)
        self._unsubscribe = self._session.events.subscribe(self._on_event)
        self._install_pump()
        self._announce()

    def _install_pump(self) -> None:
        from ._kernel_status import KernelStatus
        from ._pump import has_subshells, shell_pump

        kernel = getattr(getattr(self._session, "shell", None), "kernel", None)
        pump = shell_pump(kernel)
        if pump is not None:  # a kernel without subshells: runs answer the panel at each poll
            self._session.serve_messages_during_runs(pump)
        elif kernel is not None and has_subshells(kernel):  # busy while a cell runs, whatever
            self._kernel_status = KernelStatus.install(kernel)  # the panel asks meanwhile

    def close(self) -> None:
        """Unregister, close every panel comm and stop the timer (``%unload_ext``)."""
        with self._lock:
            if self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None
            if self._cancel_timer is not None:
                self._cancel_timer()
                self._cancel_timer = None
            comms, self._comms = self._comms, []
        if self._kernel_status is not None:
            self._kernel_status.uninstall()
            self._kernel_status = None
        manager = self._comm_manager
        if manager is not None and manager.targets.get(COMM_TARGET) == self._on_open:
            manager.unregister_target(COMM_TARGET, self._on_open)
        for c in comms:
            self._quietly(c.close)

    @property
    def comm_count(self) -> int:
        """How many panel comms are open."""
        with self._lock:
            return len(self._comms)

    def _announce(self) -> None:
        # A panel opened before `%load_ext phalanx` tried to attach and was refused.  A short-
        # lived kernel-opened comm tells it the target exists now; the panel then opens its own
        # comm, because a kernel-opened one would be closed by any client lacking the target.
        create_comm = self._create_comm
        assert create_comm is not None, "register() sets it before announcing"
        try:
            create_comm(target_name=COMM_TARGET, data={}).close()
        except Exception:  # no frontend protocol (plain IPython): nobody to tell
            log.debug("phalanx: could not announce the lab comm target", exc_info=True)

    # --- comms --------------------------------------------------------------------------------

    def _on_open(self, comm: BaseComm, open_msg: Mapping[str, Any]) -> None:
        answer_where_sent(comm)  # the panel's requests stay on its subshell during a run
        comm.on_msg(lambda msg: self._on_msg(comm, msg))
        comm.on_close(lambda msg: self._forget(comm))
        with self._lock:
            self._comms.append(comm)
            stale = self._comms[:-MAX_COMMS]
            del self._comms[:-MAX_COMMS]
        for old in stale:
            log.info("phalanx: closing an old lab panel comm (more than %d open)", MAX_COMMS)
            self._quietly(old.close)
        # The panel opens with a request_snapshot; whatever it sent, it needs the state now.
        data = (open_msg.get("content") or {}).get("data") or {}
        request = self._parse(data) if data else None
        if request is not None and request["type"] != "request_snapshot":
            self._dispatch(comm, request)
        self._send_snapshot(comm)

    def _forget(self, comm: BaseComm) -> None:
        with self._lock:
            if comm in self._comms:
                self._comms.remove(comm)

    def _send(self, comm: BaseComm, message: dict) -> None:
        try:
            comm.send(message)
        except Exception:  # a broken comm must not break the producer or the other panels
            log.warning("phalanx: dropping a lab panel comm that failed to send", exc_info=True)
            self._forget(comm)

    @staticmethod
    def _quietly(fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:
            log.debug("phalanx: ignoring an error while closing a comm", exc_info=True)

    # --- events -> panels ---------------------------------------------------------------------

    def _on_event(self, event: dict) -> None:
        # A run logging thousands of rows a second sends thousands a second through here, and
        # a flush sends a few hundred of them: the rows are checked and made JSON-safe when
        # they are sent (_outgoing), not as they come.  Only the envelope is checked now, so
        # the outbox can merge the event.
        envelope = {**event, "rows": [], "means": None} if event.get("type") == "metrics" else event
        try:
            validate_event(envelope)
        except (SchemaError, KeyError, TypeError) as exc:
            log.warning("phalanx: not forwarding an invalid event to the lab panel: %s", exc)
            return
        with self._lock:
            self._remember(event)
            if not self._comms:
                return  # no panel: one that opens gets the snapshot and the run's history
            self._outbox.add(event)
            self._flush_when_due()

    @staticmethod
    def _outgoing(message: dict) -> dict | None:
        """``message`` as it is sent: metric rows thinned, checked, JSON-safe; None (and a
        warning) if it breaks the schema."""
        try:
            if message["type"] == "metrics":
                message = thin_metrics(message)
            return wire_safe(validate_event(message))
        except (SchemaError, KeyError, TypeError, ValueError) as exc:
            log.warning("phalanx: not forwarding an invalid event to the lab panel: %s", exc)
            return None

    def _remember(self, event: dict) -> None:
        # The run_ended of a run comes right after the session recorded it: its record is
        # the last one.
        ended = event["type"] == "run_ended"
        self._runs.note(event, getattr(self._session, "last_record", None) if ended else None)
        # The bus snapshot has no progress (it is a stream); a reloaded panel still wants bars.
        if event["type"] == "run_started":
            self._progress = {}
        elif event["type"] == "progress":
            pending = Outbox()
            if event["run"] in self._progress:
                pending.add(self._progress[event["run"]])
            pending.add(wire_safe(event))
            self._progress = {event["run"]: pending.drain()[0]}

    def _flush_when_due(self) -> None:
        now = self._clock()
        if now >= self._next_at:
            self._flush(now)
        elif self._cancel_timer is None:
            self._cancel_timer = self._schedule(self._next_at - now, self._on_timer)

    def _on_timer(self) -> None:
        with self._lock:
            self._cancel_timer = None
            if len(self._outbox):
                self._flush(self._clock())

    def _flush(self, now: float, skip: BaseComm | None = None) -> None:
        batch = [m for m in map(self._outgoing, self._outbox.drain()) if m is not None]
        for message in batch:
            for comm in list(self._comms):
                if comm is not skip:
                    self._send(comm, message)
        # Each message sent pushes the next flush back, so the rate stays at ~1/interval
        # messages per second however many kinds of event were pending.
        self._next_at = now + self._interval * max(1, len(batch))

    # --- panel requests -> session ------------------------------------------------------------

    def _on_msg(self, comm: BaseComm, msg: Mapping[str, Any]) -> None:
        request = self._parse((msg.get("content") or {}).get("data"))
        if request is not None:
            self._dispatch(comm, request)

    @staticmethod
    def _parse(data: object) -> dict | None:
        try:
            return validate_request(data)
        except SchemaError as exc:
            log.warning("phalanx: ignoring an invalid request from the lab panel: %s", exc)
            return None

    def _dispatch(self, comm: BaseComm, request: dict) -> None:
        kind = request["type"]
        try:
            if kind == "request_snapshot":
                self._send_snapshot(comm)
            elif kind == "scale":
                self._scale(comm, request["n"])
            elif kind == "stop":
                self._session.stop_cluster()
            elif kind == "stop_run":
                if not self._session.stop_run("Stop in the phalanx panel"):
                    self._send(comm, self._cluster_error("no run is going"))
            elif kind == "request_window":
                self._send(comm, self.window_message(request))
            elif kind == "profile_next":
                self._session.profile_next_run(request.get("steps") or 5)
            elif kind == "request_run":
                for message in self.run_messages(request["run"]):
                    self._send(comm, message)
            elif kind == "request_log":  # to the panel that asked only
                self._send(comm, self.log_message(request.get("lines") or LOG_LINES))
        except Exception as exc:  # the kernel keeps working; the panel shows why
            log.exception("phalanx: lab panel request %r failed", kind)
            self._send(comm, self._cluster_error(f"{kind} failed: {exc}"))

    def _scale(self, comm: BaseComm, n: int) -> None:
        limit = int(self._session.max_engines)
        if n > limit:
            message = f"cannot scale to {n} engines: this cluster allows at most {limit}"
            log.warning("phalanx: %s (request from the lab panel)", message)
            self._send(comm, self._cluster_error(message))
            return
        self._session.scale(n, queue=True)  # during a run: resized at a commit, or after it

    def _cluster_error(self, message: str) -> dict:
        latest = [e for e in self._session.events.snapshot() if e.get("type") == "cluster"]
        if latest:
            return {**latest[-1], "error": message, "busy": False}
        return events.cluster_state([], max_engines=int(self._session.max_engines), error=message)

    def _send_snapshot(self, comm: BaseComm) -> None:
        with self._lock:
            # What is pending is already in the bus state and the run history, so the other
            # panels get it now and this one only through the snapshot: no row arrives twice.
            if len(self._outbox):
                self._flush(self._clock(), skip=comm)
            for message in self.snapshot_messages():
                self._send(comm, message)

