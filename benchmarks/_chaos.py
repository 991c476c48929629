"""Chaos runs: one fault per run, drawn at random in kind, rank and time, on a real cluster.

Shared by ``benchmarks/chaos.py`` (``make chaos``, 50 faults) and the short run of the test suite
(``tests/test_reliability_chaos.py``).  Each run trains a small seeded model with
``%%distributed_fit`` on 2 engines while one fault strikes; then it checks what a person would
notice: one DistributedFitError naming the right rank within its deadline (or, with
``max_restarts``, completion with the parameters of the uninterrupted run), no hang, engines that
run the next cell (after ``%cluster restart`` of what died), and nothing leaked: no process,
/dev/shm segment, temp file, listening socket or thread beyond what was there before.

Kinds are drawn in shuffled rounds (every kind once per round, in random order) so a short run
still meets every kind; the rank and the step come from the same seeded generator.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from _chaos_leaks import SETTLE_S, Leftovers

KINDS = ("sigkill", "sigstop", "exception", "sleep_stall", "exit_in_collective", "interrupt")
KERNEL_SIDE = {"sigkill": signal.SIGKILL, "sigstop": signal.SIGSTOP, "interrupt": signal.SIGINT}
COLLECTIVE_TIMEOUT_S = 3
STEPS = 30
HANG_S = 90.0          # a cell still running this long is a hang: the watchdog interrupts it

SETUP = f"""
import os, signal, time, threading
import numpy as np, torch
from phalanx import allreduce, log
from phalanx.runtime import steps
torch.manual_seed(0)
X = torch.randn(64, 5)
y = X @ torch.arange(1.0, 6.0) + 0.3
STEPS, PAUSE = {STEPS}, 0.04
def fault(rank, step):
    pass
"""

LOOP = """
model = torch.nn.Linear(5, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in steps(STEPS):
    i = (step * 4) % (len(X) - 3)
    opt.zero_grad()
    loss = ((model(X[i:i + 4]).squeeze(1) - y[i:i + 4]) ** 2).mean()
    loss.backward(); opt.step()
    log(loss=loss.item())
    fault(rank, step)
    time.sleep(PAUSE)
"""

# In-loop faults strike once (a marker file), so a restarted attempt runs clean.  os._exit fires
# from a timer while every rank is inside one large extra allreduce.
ACTIONS = {
    "exception": 'raise ValueError("chaos: rank {rank} failed")',
    "sleep_stall": "time.sleep(600)",
    "exit_in_collective": "threading.Timer(0.02, os._exit, (7,)).start()",
}
FAULT = """
def fault(rank, step):
    if step != {at}:
        return
    if rank == {rank} and not os.path.exists({mark!r}):
        with open({mark!r}, "w") as f:  # when: a log row may die with its process
            f.write(repr(time.time()))
        {action}
    if {collective}:
        allreduce(np.ones(1_000_000))
"""

CHECK = """%%distributed_fit --return total
model = torch.nn.Linear(5, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
opt.zero_grad(); model(X[:4]).sum().backward(); opt.step()
total = allreduce(1.0, op='sum')
"""


@dataclass
class Fault:
    kind: str
    rank: int
    at: int  # the step (in-loop faults) or the number of rows the rank logged (kernel-side ones)


@dataclass
class Outcome:
    fault: Fault
    verdict: str = "ok"          # ok | wrong | internal | hang | missed
    detail: str = ""
    time_to_error_s: float | None = None   # fault -> the error under the cell
    detected_s: float | None = None        # fault -> the kernel knew (before any display)
    next_cell_ok: bool = False
    restarted: list = field(default_factory=list)
    leaks: list = field(default_factory=list)


def draw_faults(n: int, seed: int) -> list[Fault]:
    rng = random.Random(seed)
    kinds: list[str] = []
    while len(kinds) < n:
        kinds += rng.sample(KINDS, len(KINDS))
    return [Fault(kind, rng.randrange(2), rng.randint(3, STEPS - 12)) for kind in kinds[:n]]


def flags(max_restarts: int) -> str:
    base = f"--seed 1 --collective-timeout {COLLECTIVE_TIMEOUT_S}"
    return base + (f" --checkpoint-every 5 --max-restarts {max_restarts}" if max_restarts else "")


class Chaos:
    """Runs faults on a 2-engine cluster of ``shell``'s session (started and stopped here, with
    a private temp dir so leaks are ours alone)."""

    def __init__(self, shell: Any, max_restarts: int = 0) -> None:
        from phalanx._session import session_for_shell

        self.shell, self.max_restarts = shell, max_restarts
        self.session = session_for_shell(shell)
        self.tmp = tempfile.mkdtemp(prefix="phalanx-chaos-")
        self.marks = os.path.join(self.tmp, "marks")
        os.mkdir(self.marks)
        self.engine_tmp = os.path.join(self.tmp, "engines")
        os.mkdir(self.engine_tmp)
        self.reference: list | None = None
        self._saved_tmpdir: str | None = os.environ.get("TMPDIR")
        self.leftovers = Leftovers(self.session, self.engine_tmp)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        # The interrupt fault signals this process as a kernel interrupt would: make sure SIGINT
        # is not ignored (a runner started in the background inherits it ignored).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.session.cluster.running:
            self.session.stop_cluster()
        self._saved_tmpdir = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = self.engine_tmp  # engines inherit it: their temp files are ours
        self.session.start_cluster(n=2, gpus="none", timeout=60)
        self.cell(SETUP)
        self.cell(CHECK)
        # The uninterrupted run: the reference parameters, and the run summary's first plot
        # (a one-time import of the plotting stack) is not counted in the first fault's time.
        self.cell(f"%%distributed_fit {flags(0)} --return model\n" + LOOP)
        self.reference = _params(self.shell.user_ns["model"])
        self.leftovers.take_baseline()

    def stop(self) -> list[str]:
        """Stop the cluster; returns what it left behind (processes, temp files)."""
        pids = [p for ps in self.session.cluster.process_ids().values() for p in ps] \
            if self.session.cluster.running else []
        self.session.stop_cluster()
        self.session.cluster.close_fork_server()  # kept for a next cluster; chaos ends here
        if self._saved_tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = self._saved_tmpdir
        from phalanx.cluster._procs import wait_gone

        leaks = [f"process {p.pid}" for p in wait_gone(pids, SETTLE_S)]
        leaks += [f"temp {p}" for p in self.leftovers.temp_files()]
        shutil.rmtree(self.tmp, ignore_errors=True)
        return leaks

    def cell(self, source: str) -> Any:
        result = self.shell.run_cell(source, store_history=False)
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            raise error
        return result.result

    # --- one fault --------------------------------------------------------------------------

    def run(self, fault: Fault) -> Outcome:
        from phalanx.fit import DistributedFitError

        outcome = Outcome(fault)
        victim = self.session.cluster.slots()[fault.rank]
        mark = os.path.join(self.marks, f"{time.time_ns()}")
        in_loop = fault.kind in ACTIONS
        self.cell(FAULT.format(at=fault.at, rank=fault.rank, mark=mark,
                               action=ACTIONS.get(fault.kind, "pass").format(rank=fault.rank),
                               collective=fault.kind == "exit_in_collective")
                  if in_loop else "def fault(rank, step):\n    pass\n")
        struck: dict = {}
        done = threading.Event()
        if not in_loop:
            _strike_when_logged(self.session, fault, victim.pid, struck, done)
        watchdog = _Watchdog(HANG_S)
        error: BaseException | None = None
        try:
            self.cell(f"%%distributed_fit {flags(self.max_restarts)} --return model\n" + LOOP)
        except BaseException as exc:  # judged below: anything but our one error is a finding
            error = exc
        raised_at = time.time()
        watchdog.cancel()
        done.set()
        fault_at = struck.get("t") or _marked_time(mark)
        if watchdog.fired:
            outcome.verdict, outcome.detail = "hang", f"cell still running after {HANG_S:g} s"
        elif isinstance(error, DistributedFitError):
            if fault_at:
                outcome.time_to_error_s = round(raised_at - fault_at, 3)
                outcome.detected_s = round(error.detected_at - fault_at, 3)
            self._judge(outcome, error, victim)
        elif error is not None:
            outcome.verdict, outcome.detail = "internal", f"{type(error).__name__}: {error}"[:500]
        else:
            self._judge_completion(outcome, fault_at)
        self._recover(outcome, victim)
        outcome.leaks = self.leftovers.after_settling()
        return outcome

    def _judge(self, outcome: Outcome, error: Any, victim: Any) -> None:
        fault, text = outcome.fault, str(error)
        expected = {"sigkill": "died", "exit_in_collective": "died", "exception": "ValueError",
                    "sleep_stall": "stalled", "sigstop": "SIGSTOP", "interrupt": "interrupted"}
        if fault.kind == "interrupt":
            right = error.status == "interrupted"
        else:
            right = (error.rank == fault.rank and expected[fault.kind] in text
                     and f"host {victim.host}" in text)
        if fault.kind != "interrupt" and self.max_restarts:
            right = False  # with restarts the run should have completed
        deadline = 10 + (COLLECTIVE_TIMEOUT_S if fault.kind in ("sleep_stall", "sigstop") else 0)
        late = outcome.time_to_error_s is None or outcome.time_to_error_s > deadline
        if not right or late:
            outcome.verdict = "wrong"
            outcome.detail = (f"rank {error.rank}, status {error.status}, "
                              f"{outcome.time_to_error_s} s: {text[:400]}")

    def _judge_completion(self, outcome: Outcome, fault_at: float | None) -> None:
        if fault_at is None:
            outcome.verdict, outcome.detail = "missed", "the run ended before the fault struck"
        elif not self.max_restarts or outcome.fault.kind == "interrupt":
            outcome.verdict, outcome.detail = "missed", "the run completed despite the fault"
        elif not _equal(_params(self.shell.user_ns["model"]), self.reference):
            outcome.verdict, outcome.detail = "wrong", "completed with other parameters"

    # --- after the fault ----------------------------------------------------------------------

    def _recover(self, outcome: Outcome, victim: Any) -> None:
        try:
            os.kill(victim.pid, signal.SIGCONT)  # never leave a stopped process behind
        except (ProcessLookupError, TypeError):
            pass
        cluster = self.session.cluster
        if outcome.fault.kind in ("sigkill", "sigstop", "exit_in_collective") and not self.max_restarts:
            _wait(lambda: victim.state == "dead" or victim not in cluster.slots(), SETTLE_S)
        try:
            for rank, slot in enumerate(cluster.slots()):
                if slot.state == "dead":
                    self.cell(f"%cluster restart {rank}")
                    outcome.restarted.append(rank)
            self.cell(CHECK)
            outcome.next_cell_ok = self.shell.user_ns.get("total") == 2.0
        except BaseException as exc:  # noqa: BLE001 - the finding is recorded, the chaos goes on
            outcome.detail += f" | next cell: {type(exc).__name__}: {exc}"[:300]


# --- helpers ------------------------------------------------------------------------------------

class _Watchdog:
    """Interrupts the main thread (twice: the wait loop's second interrupt ends it) when a cell
    runs past ``limit`` seconds."""

    def __init__(self, limit: float) -> None:
        self.fired = False
        self._done = threading.Event()
        threading.Thread(target=self._watch, args=(limit,), daemon=True,
                         name="phalanx-chaos-watchdog").start()

    def _watch(self, limit: float) -> None:
        if self._done.wait(limit):
            return
        self.fired = True
        while not self._done.wait(2.0):
            os.kill(os.getpid(), signal.SIGINT)

    def cancel(self) -> None:
        self._done.set()


def _strike_when_logged(session: Any, fault: Fault, pid: int, struck: dict,
                        done: threading.Event) -> None:
    def watch() -> None:
        while not done.is_set():
            tracker = session.fits.active
            if tracker is not None and sum(r["rank"] == fault.rank for r in tracker.history.rows()) >= fault.at:
                struck["t"] = time.time()
                os.kill(os.getpid() if fault.kind == "interrupt" else pid, KERNEL_SIDE[fault.kind])
                return
            done.wait(0.01)

    threading.Thread(target=watch, daemon=True, name="phalanx-chaos-strike").start()


def _marked_time(mark: str) -> float | None:
    try:
        with open(mark) as f:
            return float(f.read())
    except (FileNotFoundError, ValueError):
        return None


def _wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _params(model: Any) -> list:
    return [p.detach().clone() for p in model.parameters()]


def _equal(got: list, want: list | None) -> bool:
    import torch

    return want is not None and all(torch.equal(a, b) for a, b in zip(got, want))
