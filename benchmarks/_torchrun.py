"""One place that launches ``torchrun`` for the benchmarks' baselines and judges a launch.

A launch is judged by the figure its rank 0 printed, not by torchrun's exit code.  On a fresh
2-core machine about 1 launch in 5 aborts as its workers exit, after the figure is printed
(SIGABRT, "terminate called without an active exception" in gloo's teardown): the measurement
is whole, only the process's end is not, and a section used to be lost over it.  Such a launch
counts as measured, is said on the output and counted (:meth:`Torchrun.record`, kept in the
section's JSON); a launch that ends without its figure still raises, with torchrun's output.

The workers print their figure with ``flush=True``: a process that aborts never flushes what
its buffered stdout still holds.

Example::

    torchrun = Torchrun()
    launch = torchrun.run(["_torchrun_step.py", "100", "32"], parse=float)
    launch.figure, launch.wall_s, launch.crashed_at_teardown
    data["torchrun"] = torchrun.record()   # {"launches": 1, "crashed_at_teardown": 0, ...}
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from _common import HERE


@dataclass
class Launch:
    """One torchrun launch: rank 0's figure (parsed), its wall time from the start of torchrun
    to its exit, and how it ended."""

    figure: Any
    wall_s: float
    returncode: int
    crashed_at_teardown: bool
    how: str = ""          # the crash, in a line, where there was one


def figure_line(stdout: str, parse: Callable[[str], Any]) -> Any:
    """The last line of ``stdout`` that ``parse`` accepts; None where no line does.

    >>> figure_line("warming up\\n123.5\\n", float)
    123.5
    >>> figure_line("Traceback ...\\n", float) is None
    True
    """
    for line in reversed(stdout.strip().splitlines()):
        try:
            return parse(line.strip())
        except (ValueError, TypeError, KeyError):
            continue
    return None


def crash_line(stderr: str, returncode: int) -> str:
    """What ended a launch that printed its figure, in one line.

    >>> crash_line("...\\nterminate called without an active exception\\n...", 1)
    'exit 1: terminate called without an active exception'
    >>> crash_line("Signal 6 (SIGABRT) received by PID 7", 1)
    'exit 1: SIGABRT'
    """
    for mark in ("terminate called without an active exception", "SIGABRT", "SIGSEGV"):
        if mark in stderr:
            return f"exit {returncode}: {mark}"
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return f"exit {returncode}: {lines[-1][:200] if lines else 'no output on stderr'}"


class Torchrun:
    """Launches ``torchrun --standalone --nproc-per-node N SCRIPT ARGS`` and counts the launches
    that crashed at teardown after their figure."""

    def __init__(self, nproc: int = 2, env: Mapping[str, str] | None = None,
                 cwd: Path = HERE) -> None:
        self.nproc, self.cwd = nproc, cwd
        self.env = dict(env or {})   # over this process's environment at each launch
        self.launches = 0
        self.crashes: list[str] = []

    def run(self, script_args: Sequence[object], parse: Callable[[str], Any] = float,
            timeout: float = 600) -> Launch:
        """Launch and wait; rank 0's figure is the last stdout line ``parse`` accepts."""
        with tempfile.TemporaryDirectory(prefix="bench-torchrun-") as logs:
            # a log folder of ours: torchrun's default is a new /tmp/torchelastic_* per launch
            args = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={self.nproc}", f"--log-dir={logs}", *map(str, script_args)]
            started = time.perf_counter()
            done = subprocess.run(args, capture_output=True, text=True, cwd=self.cwd,
                                  env={**os.environ, **self.env},
                                  timeout=timeout)
            wall = time.perf_counter() - started
        self.launches += 1
        figure = figure_line(done.stdout, parse)
        if figure is None:
            raise RuntimeError(f"torchrun exited {done.returncode} without its figure:\n"
                               f"{done.stdout[-1500:]}\n{done.stderr[-3000:]}")
        launch = Launch(figure, wall, done.returncode, done.returncode != 0)
        if launch.crashed_at_teardown:
            launch.how = crash_line(done.stderr, done.returncode)
            self.crashes.append(launch.how)
            print(f"torchrun launch {self.launches} crashed at teardown after its figure "
                  f"({launch.how}); its figure counts", flush=True)
        return launch

    def record(self) -> dict[str, Any]:
        """For the section's JSON: launches, how many crashed at teardown after their figure,
        and how each did."""
        return {"launches": self.launches, "crashed_at_teardown": len(self.crashes),
                "crashes": list(self.crashes)}



# What a served launch's workers run: wait for each order (a script's path, in the file
# ``order-K`` of the launch's folder), run that script, and from rank 0 put the script's
# ``figure`` in ``figure-K.json`` (written whole, then renamed).  "exit" ends them.  Waiting is a
# 5 ms sleep loop: the workers take no measurable CPU while the other side runs.
SERVE = """\
import json, os, runpy, sys, time
folder, rank, order = sys.argv[1], int(os.environ["RANK"]), 0
while True:
    path = os.path.join(folder, f"order-{order}")
    while not os.path.exists(path):
        time.sleep(0.005)
    script = open(path).read()
    if script == "exit":
        break
    figure = runpy.run_path(script, run_name="__main__")["figure"]
    if rank == 0:
        done = os.path.join(folder, f"figure-{order}.json")
        with open(done + ".tmp", "w") as out:
            json.dump(figure, out)
        os.replace(done + ".tmp", done)
    order += 1
"""


class ServedTorchrun:
    """One ``torchrun`` launch whose workers stay up and run a script each time they are asked,
    as warm engines run a cell: imports, the process group and the allocator are warm on both
    sides, so the two can alternate run by run (seconds apart) instead of launch by cell, and a
    drift of the machine hits both alike.

    Example::

        served = ServedTorchrun(folder)
        served.run(Path("train_x.py"))    # rank 0's ``figure`` of that run
        served.close()
    """

    def __init__(self, folder: Path, nproc: int = 2, env: Mapping[str, str] | None = None,
                 timeout: float = 600) -> None:
        self.folder, self.timeout, self.orders = folder, timeout, 0
        (folder / "serve.py").write_text(SERVE)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={nproc}", f"--log-dir={folder / 'logs'}", str(folder / "serve.py"),
             str(folder)],
            stdout=subprocess.DEVNULL, stderr=(folder / "torchrun.log").open("w"),
            env={**os.environ, **dict(env or {})}, cwd=HERE)

    def run(self, script: Path) -> Any:
        figure_file = self.folder / f"figure-{self.orders}.json"
        self._order(str(script))
        deadline = time.monotonic() + self.timeout
        while not figure_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError("the served torchrun ended or stalled without its figure:\n"
                                   + (self.folder / "torchrun.log").read_text()[-3000:])
            time.sleep(0.005)
        return json.loads(figure_file.read_text())

    def _order(self, text: str) -> None:
        """The next order, whole: the workers poll for the file, so it appears by a rename."""
        order = self.folder / f"order-{self.orders}"
        order.with_suffix(".tmp").write_text(text)
        os.replace(order.with_suffix(".tmp"), order)
        self.orders += 1

    def close(self) -> None:
        """Ask the workers to exit, and make sure they did (once: a second call does nothing)."""
        if self.process.poll() is not None:
            return
        self._order("exit")
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
