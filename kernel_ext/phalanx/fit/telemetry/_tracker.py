"""One run as the kernel sees it: complete history, per-rank steps, throttled view updates.

The receiver thread feeds :meth:`RunTracker.on_batch` (cheap: append and count).  A publisher
thread turns what arrived into at most ~10 ``metrics`` + ``progress`` events per second on the
session bus, so views never slow training and no row is lost (rows are batched, not dropped),
and keeps the run's downsampled curves (:class:`~._digest.CurveDigest`) up to date.  One update
carries at most :data:`PUBLISH_MAX_ROWS` rows: a backlog is worked off over several updates
instead of being turned into millions of row dicts at once.
"""

from __future__ import annotations

import threading
import time

from ..analysis._cell_warning import warn_at_cell
from ... import events
from ._digest import CurveDigest
from ._history import MetricHistory
from ._memory import RunMemory
from ._parts_series import PartsSeries
from ._timing import CollectiveTimes
from ._progress import RateMeter, eta_seconds, stragglers

PUBLISH_INTERVAL_S = 0.1
# While no batch arrives (a long step that logs nothing), progress is sent this often instead
# of every PUBLISH_INTERVAL_S: enough to keep the views' clocks and rates moving, and the
# kernel does next to nothing while the engines train.
IDLE_PROGRESS_S = 1.0
PUBLISH_MAX_ROWS = 50_000
_now = time.monotonic  # the publisher's clock (a test replaces it, not the time module's)


class MetricWarning(UserWarning):
    """A logged metric that could not be recorded."""


class RunTracker:
    """Kernel-side state of one run."""

    def __init__(self, run_id: str, world_size: int, total_steps: int | None, emit,
                 history_dir: str | None = None) -> None:
        self.run_id = run_id
        self.world_size = world_size
        self.total_steps = total_steps
        self.history = MetricHistory(history_dir)
        self.digest = CurveDigest(world_size)
        self.memory = RunMemory()
        self.timing = CollectiveTimes(world_size)
        self.parts_series = PartsSeries()  # the step parts through the run, at bounded size
        self.steps = {r: 0 for r in range(world_size)}
        self.final: set[int] = set()
        # Ranks whose first batch arrived: their metric sender is up, so they have their group
        # and run the cell (the views say which ones a run still waits for).
        self.heard: set[int] = set()
        self.paused: dict[int, dict] = {}  # rank -> where it stopped at a breakpoint (line, source)
        self._batches = 0  # batches arrived: wait_final's "still coming" signal
        self.warnings: list[str] = []
        self.started = time.time()
        self._meters = {r: RateMeter() for r in range(world_size)}
        # When the first step was counted (the publisher's clock): straggler marks wait for
        # evidence, seconds of steps, not seconds of shipping and setting up.
        self._first_step_at: float | None = None
        # A rank went past ``total_steps``: the total (--steps is only a hint) is wrong, so the
        # views show counts without "/total" and no ETA from then on.
        self.total_exceeded = False
        self._emit = emit
        self._published = 0
        self._progress_sent = (-1, float("-inf"))  # (batches then, when) of the last progress
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # wakes wait_final on every batch
        self._publish_lock = threading.Lock()
        self._stop = threading.Event()
        self._publisher: threading.Thread | None = None  # made by start()

    def start(self) -> None:
        """Start publishing (once; never after :meth:`stop`).  A run calls it from its wait loop
        PUBLISH_INTERVAL_S after it began: a run over sooner starts no thread, and its views get
        everything from :meth:`stop`."""
        with self._publish_lock:  # stop() then sees no thread, or one it joins
            if self._stop.is_set() or self._publisher is not None:
                return
            self._publisher = threading.Thread(
                target=self._publish_loop, daemon=True, name=f"phalanx-publish-{self.run_id}")
            self._publisher.start()  # its first publish waits for this lock

    def on_batch(self, message: dict) -> None:
        """Called by the receiver thread for each batch of this run."""
        rank = int(message["rank"])
        self.history.extend(rank, message.get("rows", []))
        if "memory" in message or "memory_peak" in message:
            self.memory.add(rank, message.get("memory") or [], message.get("memory_peak"))
        if message.get("timing"):
            self.timing.add(rank, message["timing"])
            if message["timing"].get("parts"):
                self.parts_series.add(rank, int(message.get("step", 0)), time.time(),
                                      message["timing"]["parts"])
        with self._lock:
            self.heard.add(rank)
            self.steps[rank] = max(self.steps.get(rank, 0), int(message.get("step", 0)))
            if self._first_step_at is None and self.steps[rank] > 0:
                self._first_step_at = _now()
            self._meters.setdefault(rank, RateMeter()).add(time.time(), self.steps[rank])
            self.warnings.extend(message.get("warnings", []))
            total = message.get("total")
            if self.total_steps is None and isinstance(total, int) and total > 0:
                self.total_steps = total  # a framework's own count: the cell gave no --steps
            if message.get("final"):
                self.final.add(rank)
            self._batches += 1
            self._arrived.notify_all()

    def rewind(self, step: int, world_size: int) -> None:
        """A new attempt resumes at ``step`` (after a restart or a resize), maybe on another
        number of ranks: progress restarts there; the history keeps every row that arrived."""
        self.timing.rewind(world_size)
        with self._lock:
            self.world_size = self.digest.world_size = world_size
            self.steps = {r: step for r in range(world_size)}
            self._meters = {r: RateMeter() for r in range(world_size)}
            self.final.clear()
            self.heard.clear()

    def wait_final(self, ranks: list[int], timeout: float) -> bool:
        """Wait until the final batch of each of ``ranks`` has arrived.

        ``timeout`` counts from the last batch that arrived, not from the call: a kernel still
        working through a backlog of rows (a loop logging tens of thousands of rows a second)
        keeps waiting as long as rows keep coming, so none is dropped.
        """
        wanted = set(ranks)
        with self._arrived:  # woken by each batch: a run's end costs no polling delay
            seen, quiet_since = self._batches, time.monotonic()
            while not wanted <= self.final:
                if self._batches != seen:
                    seen, quiet_since = self._batches, time.monotonic()
                left = timeout - (time.monotonic() - quiet_since)
                if left <= 0:
                    return False
                self._arrived.wait(left)
        return True

    def set_paused(self, rank: int, pause: dict | None) -> None:
        """``rank`` stopped at a breakpoint (``pause``: its line and source) or went on (None);
        the views hear it at once, before the debugger writes to the cell (a text progress
        line stops redrawing between the debugger's lines)."""
        with self._lock:
            if pause is None:
                self.paused.pop(rank, None)
            else:
                self.paused[rank] = {"line": pause.get("line"), "source": pause.get("source")}
        with self._publish_lock:
            self._progress_sent = (-1, float("-inf"))
        self.publish()

    def progress_rows(self) -> list[dict]:
        with self._lock:
            steps = dict(self.steps)
            paused = dict(self.paused)
            rates = {r: m.rate() for r, m in self._meters.items()}
            first = self._first_step_at
            heard = set(self.heard)
            if self.total_steps is not None and max(steps.values(), default=0) > self.total_steps:
                self.total_exceeded = True
            total = None if self.total_exceeded else self.total_steps
        lagging = stragglers(steps, None if first is None else _now() - first)
        return [{"rank": r, "step": s, "total": total, "steps_per_s": rates.get(r),
                 "eta_s": eta_seconds(s, total, rates.get(r)),
                 "metrics": self.history.latest(r), "straggler": r in lagging,
                 "started": r in heard, "paused": paused.get(r)}
                for r, s in sorted(steps.items())]

    def publish(self) -> int:
        """Emit what arrived since the last call (rows batched, progress coalesced); returns
        how many rows are still waiting."""
        with self._publish_lock:
            start = self._published
            stop = min(len(self.history), start + PUBLISH_MAX_ROWS)
            if stop > start:
                rows = self.history.rows(start, stop)
                # The means over ranks are taken once, here, from every row: a panel that
                # thins the rows it draws still gets the exact mean line.
                means = self.digest.add(self.history.columns(start, stop=stop))
                self._published = stop
                wire = [{"rank": r.pop("rank"), "step": r.pop("step"), "t": r.pop("t"), "metrics": r}
                        for r in rows]
                self._emit(events.metrics(self.run_id, wire, means=means))
            with self._lock:
                batches = self._batches
            now = _now()
            if batches != self._progress_sent[0] or now - self._progress_sent[1] >= IDLE_PROGRESS_S:
                self._progress_sent = (batches, now)
                self._emit(events.progress(self.run_id, self.progress_rows()))
            memory = self.memory.take_fresh()
            if memory:
                self._emit(events.memory(self.run_id, memory))
            times = self.timing.take_changed()
            if times:
                self._emit(events.time_parts(self.run_id, times))
            return len(self.history) - self._published

    def drain(self) -> None:
        """Publish every row that arrived (the run is over): the digest is then complete."""
        while self.publish():
            pass
        rest = self.digest.finish()
        if rest:  # steps some rank never reached: their means over the ranks that logged them
            self._emit(events.metrics(self.run_id, [], means=rest))

    def _publish_loop(self) -> None:
        while True:  # what came before the start first: it starts PUBLISH_INTERVAL_S in
            self.publish()
            if self._stop.wait(PUBLISH_INTERVAL_S):
                return

    def stop(self) -> None:
        """Stop publishing, send the last update, raise collected metric warnings."""
        with self._publish_lock:
            self._stop.set()
            publisher = self._publisher
        if publisher is not None and publisher.is_alive():
            publisher.join(timeout=2)
        self.drain()
        self.history.persist()  # a finished run's rows live on disk, not in the kernel's memory
        for message in dict.fromkeys(self.warnings):
            warn_at_cell(message, MetricWarning)
