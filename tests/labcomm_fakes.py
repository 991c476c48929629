"""Fakes for the kernel end of the lab panel's comm: comms that record what is sent, a comm
manager that routes a panel's open to the target, a session, and a clock that only moves when told;
and :func:`finish_run`, a run as the session reports it (its record is the real one)."""

from __future__ import annotations

from phalanx import events
from phalanx._bus import EventBus
from phalanx.events import COMM_TARGET


class FakeComm:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[dict] = []
        self.closed = False
        self.fail = fail
        self.msg_cb = self.close_cb = None

    def on_msg(self, cb):
        self.msg_cb = cb

    def on_close(self, cb):
        self.close_cb = cb

    def send(self, data):
        if self.fail:
            raise OSError("socket gone")
        self.sent.append(data)

    def close(self):
        self.closed = True

    # what the frontend does
    def request(self, data):
        self.msg_cb({"content": {"data": data}})

    def types(self):
        return [m["type"] for m in self.sent]


class FakeManager:
    def __init__(self) -> None:
        self.targets: dict = {}

    def register_target(self, name, f):
        self.targets[name] = f

    def unregister_target(self, name, f):
        return self.targets.pop(name)

    def open(self, data=None) -> FakeComm:
        """A panel opening a comm to the target, as the kernel's comm manager would route it."""
        comm = FakeComm()
        self.targets[COMM_TARGET](comm, {"content": {"data": data or {}}})
        return comm


class FakeSession:
    def __init__(self, max_engines: int = 4) -> None:
        self.events = EventBus()
        self.max_engines = max_engines
        self.scaled: list[int] = []
        self.stopped = 0
        self.rows: list[dict] = []
        self.means: dict[str, list] = {}
        self.stop_reasons: list[str] = []
        self.running = True
        self.last_record = None  # the session's record of its last run (set before run_ended)
        self.log_lines: list[str] = []  # the cluster log's lines (Session.engine_log)

    def scale(self, n, queue=False):
        if n == 3 and self.max_engines == 99:
            raise RuntimeError("engine 2 did not start")
        self.scaled.append(n)
        self.events.emit(events.cluster_state([_engine(r) for r in range(n)], self.max_engines))

    def stop_cluster(self):
        self.stopped += 1

    def stop_run(self, reason):
        self.stop_reasons.append(reason)
        return self.running

    def engine_log(self, lines=200):
        return "/profile/log/phalanx-abc.log", self.log_lines[-lines:]

    def run_history_rows(self):
        return self.rows

    def run_history_means(self):
        return self.means


class FakeTime:
    """A clock that only moves when told, and a scheduler that runs timers when time passes."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[list] = []

    def clock(self) -> float:
        return self.now

    def schedule(self, delay, fn):
        timer = [self.now + delay, fn, False]
        self.timers.append(timer)
        return lambda: timer.__setitem__(2, True)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for timer in [t for t in self.timers if t[0] <= self.now and not t[2]]:
            self.timers.remove(timer)
            timer[1]()


def _engine(rank: int) -> dict:
    return {"rank": rank, "engine_id": rank, "host": "h", "pid": 10 + rank, "device": "cpu",
            "state": "idle", "memory_mb": 100.0, "step": None}


def _row(rank: int, step: int, loss: float = 1.0) -> dict:
    return {"rank": rank, "step": step, "t": float(step), "metrics": {"loss": loss}}


def finish_run(session: FakeSession, run: str, name: str, steps: int = 10, status: str = "done",
               error: str | None = None, wall_s: float = 1.5) -> None:
    """A 2-rank run of ``steps`` steps logging ``loss`` as the session reports it: run_started,
    then the record of the run (a real RunRecord with its history), then run_ended."""
    from phalanx.fit import RunRecord
    from phalanx.fit.telemetry._history import MetricHistory

    session.events.emit(events.run_started(run, 2, steps, "allreduce", name=name))
    history = MetricHistory()
    for rank in (0, 1):
        history.extend(rank, [[s, float(s), {"loss": 1.0 / (s + rank + 1)}] for s in range(steps)])
    parts = {"data": 0.6, "backward": 0.2, "wait": 0.1, "move": 0.0, "optimizer": 0.05,
             "log": 0.0, "other": 0.05}
    timing = {r: {"collective_s": 0.1, "collective_wait_s": 0.1, "collective_move_s": 0.0,
                  "collectives": steps, "log_s": 0.0, "steps": steps, "step_s": 1.0,
                  "parts": parts, "dominant": "data", "dominant_share": 0.6} for r in (0, 1)}
    session.last_record = RunRecord(run, name, status, 2, wall_s, {0: steps, 1: steps}, history,
                                    timing=timing, total_steps=steps)
    session.events.emit(events.run_ended(run, status, wall_s, error))
