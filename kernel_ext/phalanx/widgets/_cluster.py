"""The cluster widget: engines, +/- and a number box to scale, start, restart, stop.

What ``%cluster`` with no arguments and ``phalanx.cluster_widget()`` show in Jupyter
(:func:`cluster_view`; the engine table where no widget can be drawn).  Every
button calls the same :class:`~phalanx._session.Session` verb as the magic (``scale``,
``restart``, ``stop_cluster``, ``start_cluster``), so the widget can do nothing the magic cannot
and says no for the same reasons: a refused change (an invalid count, above the limit, during a
run) is shown in the widget and nothing changes.

A change runs in a background thread with the controls disabled, so the kernel stays responsive
while engines start; the table follows the session's ``cluster`` events live.

Example::

    panel = ClusterWidget(session)
    display(panel)
    panel.plus.click()      # one engine more, as %cluster scale N+1
    panel.wait()            # (scripts and tests) until the change is done
"""

from __future__ import annotations

import html
import logging
import threading
import time
from typing import Any, Callable, Mapping

from ._cluster_table import ClusterStatus, local_memory_mb, merge_rows, table_html
from ._throttle import Throttle

log = logging.getLogger("phalanx")

TABLE_INTERVAL_S = 0.5  # progress events come at ~10/s; steps in a table need not


def cluster_view(session: Any, widget: bool | None = None) -> Any:
    """What ``%cluster`` with no arguments shows: the cluster widget in Jupyter, else the table.

    ``widget=None`` decides by the frontend (a terminal cannot draw widgets).

    Example::

        panel = cluster_view(session, widget=True)
        panel.plus.click()          # scales through session.scale, like %cluster scale
    """
    from ._frontend import widgets_available

    if widget is None:
        widget = widgets_available(session.shell)
    return ClusterWidget(session) if widget else ClusterStatus.of(session.status())


class ClusterWidget:
    """Live engine table and controls bound to one session."""

    def __init__(self, session: Any) -> None:
        import ipywidgets as w

        self.session = session
        small = w.Layout(width="2.6em")
        self.minus = w.Button(description="−", tooltip="one engine less (%cluster scale N-1)",
                              layout=small)
        self.count = w.IntText(value=max(session.size, 1), layout=w.Layout(width="5em"),
                               tooltip="engines: type a count and press Enter to scale to it")
        self.plus = w.Button(description="+", tooltip="one engine more (%cluster scale N+1)", layout=small)
        self.start_button = w.Button(description="start", icon="play", tooltip="%cluster start -n N")
        self.restart_button = w.Button(description="restart", icon="refresh", tooltip="%cluster restart")
        self.stop_button = w.Button(description="stop", icon="stop", button_style="danger",
                                    tooltip="%cluster stop")
        self.title, self.message, self.table = w.HTML(), w.HTML(), w.HTML()
        controls = w.HBox([self.minus, self.count, self.plus, self.start_button,
                           self.restart_button, self.stop_button])
        self.widget = w.VBox([self.title, controls, self.message, self.table])
        self.busy: str | None = None     # what is being changed, while it is
        self.error: str | None = None    # why the last change was refused or failed
        self._done: str | None = None    # what the last change did, and how long it took
        self._notice: str | None = None  # what a change asked for during a run waits for
        self._changing = False           # a change made elsewhere (%cluster, the lab panel) goes
        self._engines: list[dict] = list(session.status().rows) if session.running else []
        self._max = session.max_engines
        # Shown during a run (a --background one): its ranks are the rows with a step; they
        # train, and stay "busy" until the run's end says otherwise.
        self._steps: dict[int, int] = {int(r["rank"]): int(r["step"]) for r in self._engines
                                       if r.get("step") is not None}
        self._running = max(self._steps, default=-1) + 1
        self._memory: dict[int, dict] = {}   # the run's latest memory sample per rank
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._syncing = False
        self._throttle = Throttle(TABLE_INTERVAL_S)
        self._connect()
        self._unsubscribe: Callable[[], None] | None = session.events.subscribe(self.handle)
        self._render()

    # --- actions (the same session verbs as %cluster) ------------------------------------------

    def scale(self, n: int) -> None:
        """Scale to ``n`` engines in the background (``%cluster scale N``)."""
        # During a run: resized at its next commit, or queued until it ends (shown, not lost).
        self._act(f"scaling to {n} engine(s)", lambda: self.session.scale(n, queue=True))

    def start(self, n: int) -> None:
        """Start a cluster of ``n`` engines in the background (``%cluster start -n N``)."""
        self._act(f"starting {n} engine(s)", lambda: self.session.start_cluster(n=n))

    def restart(self) -> None:
        """Restart every engine in the background (``%cluster restart``)."""
        self._act("restarting every engine", self.session.restart)

    def stop(self) -> None:
        """Stop the cluster in the background (``%cluster stop``)."""
        self._act("stopping the cluster", self.session.stop_cluster)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the change in progress; False if it is still going after ``timeout`` s."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def close(self) -> None:
        """Stop following the session and close the widgets."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.widget.close()

    # --- events ---------------------------------------------------------------------------------

    def handle(self, event: Mapping[str, Any]) -> None:
        """Bus subscriber: engines from ``cluster`` events, steps from the current run."""
        kind = event.get("type")
        with self._lock:
            if kind == "cluster":
                self._engines, self._max = list(event["engines"]), int(event["max_engines"])
                self._changing = bool(event.get("busy"))
                self._notice = event.get("notice")
                self._memory = {}  # fresh figures came with the engines
            elif kind == "run_started":
                self._steps, self._running = {}, int(event["world_size"])
            elif kind == "memory":
                self._memory.update({int(s["rank"]): dict(s) for s in event["ranks"]})
                if not self._throttle.ready():
                    return
            elif kind == "progress":
                self._steps = {int(p["rank"]): int(p["step"]) for p in event["ranks"]}
                if not self._throttle.ready():
                    return
            elif kind == "run_ended":
                self._running = 0  # its last memory figures stay until the engines change
            else:
                return
            self._render()

    # --- internals ------------------------------------------------------------------------------

    def _connect(self) -> None:
        self.plus.on_click(lambda _: self.scale(self._size() + 1))
        self.minus.on_click(lambda _: self.scale(self._size() - 1))
        self.start_button.on_click(lambda _: self.start(int(self.count.value)))
        self.restart_button.on_click(lambda _: self.restart())
        self.stop_button.on_click(lambda _: self.stop())
        self.count.observe(self._count_changed, names="value")
        from .._pump import answer_where_sent

        for control in (self.plus, self.minus, self.start_button, self.restart_button,
                        self.stop_button, self.count):
            answer_where_sent(getattr(control, "comm", None))  # answered during a run

    def _size(self) -> int:
        return len(self._engines)

    def _count_changed(self, change: Mapping[str, Any]) -> None:
        if self._syncing or not self.session.running:
            return  # set by the widget itself, or a count for the start button
        self.scale(int(change["new"]))

    def _act(self, label: str, action: Callable[[], Any]) -> None:
        with self._lock:
            if self.busy is not None:
                self.error = f"wait: still {self.busy}"
                self._render()
                return
            self.busy, self.error, self._done = label, None, None
            self._render()
            self._thread = threading.Thread(target=self._work, args=(label, action), daemon=True,
                                            name="phalanx-cluster-widget")
            self._thread.start()

    def _work(self, label: str, action: Callable[[], Any]) -> None:
        started, error = time.monotonic(), None
        try:
            action()
        except Exception as exc:  # refused or failed: the reason goes to the widget, not a log
            error = str(exc) or type(exc).__name__
        # Asked outside the widget's lock: a cluster event may be waiting for it while holding
        # nothing the status query needs, but the reverse order could deadlock.
        engines = self._current_engines(label)
        with self._lock:
            self.busy, self.error = None, error
            if engines is not None:
                self._engines = engines
            if error is None and self._notice is None:
                self._done = f"{label}: done in {time.monotonic() - started:.1f} s"
            self._render()

    def _current_engines(self, label: str) -> list[dict] | None:
        if not self.session.running:
            return []
        try:
            return list(self.session.status().rows)
        except Exception:
            log.debug("phalanx: cluster status after %s failed", label, exc_info=True)
            return None

    def _render(self) -> None:
        with self._lock:
            running = bool(self._engines)
            rows = merge_rows(self._engines, self._steps, self._running, local_memory_mb, self._memory)
            busy = self.busy is not None or self._changing
            self.title.value = (f"<b>cluster</b>: {len(rows)} engine(s) (limit {self._max})"
                                if running else "<b>cluster</b>: not running")
            self.table.value = table_html(rows)
            self.message.value = self._message_html()
            for button in (self.minus, self.plus, self.restart_button, self.stop_button):
                button.disabled = busy or not running
            self.start_button.disabled = busy or running
            self.count.disabled = busy
            if running and not busy:
                self._syncing = True  # the box follows the cluster without scaling it again
                try:
                    self.count.value = len(rows)
                finally:
                    self._syncing = False

    def _message_html(self) -> str:
        if self.busy is not None or self._changing:
            what = self.busy or "the cluster is changing"
            return f"<span style='color:#8d6e00'>⏳ {html.escape(what)}…</span>"
        if self.error is not None:
            return f"<span style='color:#c62828'>✖ {html.escape(self.error)}</span>"
        if self._notice is not None:  # asked during a run: it waits for the run (or its commit)
            return f"<span style='color:#8d6e00'>⏳ {html.escape(self._notice)}</span>"
        return f"<span style='color:#2e7d32'>✔ {html.escape(self._done)}</span>" if self._done else ""

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        bundle = self.widget._repr_mimebundle_(**kwargs) or {}
        # Where no widget can be drawn (a saved notebook, a terminal): the table as text, from
        # what the widget holds (asking the cluster here could race a change in progress).
        with self._lock:
            rows = merge_rows(self._engines, self._steps, self._running, local_memory_mb, self._memory)
        bundle["text/plain"] = repr(ClusterStatus(rows, self.session.launcher))
        return bundle
