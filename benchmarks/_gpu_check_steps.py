"""The steps of gpu_check.py, in the order they run.  Each takes the check's context (``shell``:
the IPython shell; ``session``: phalanx's session, where the step runs on the check's cluster)
and returns its figures; ``"failed": True`` among them marks a step that ran but missed."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from _gpu_check_cells import (ACCELERATE_BF16, DEVICE_RULE, FULLY_SHARD_OFFLOAD, HF_TRAINER_BF16,
                              LIGHTNING_BF16, ONE_STEP, ONE_STEP_SETUP, QUICKSTART_REPLACE, SHARDED,
                              SHARDED_BUILDS, SHARDED_SETUP)
from _common import HERE, ROOT
from phalanx.runtime.telemetry._memory import COLLECT_AFTER_BYTES
from _torchrun import Torchrun

RERUN_GOAL = 2.0  # the warm re-run, live view included, at most this many bare round trips
BUDGET_S = 360    # the whole check, on the lent machine


@dataclass
class Step:
    """One check: its name, what runs it, and whether it runs on the check's cluster."""

    name: str
    run: Callable[[dict], dict]
    cluster: bool = True


def run_cell(shell: Any, source: str) -> Any:
    result = shell.run_cell(source, store_history=False)
    result.raise_error()  # what the cell raised, raised here
    return result.result


def in_cell(shell: Any, body: str, flags: str = "--no-widget") -> dict:
    """``body`` as a ``%%distributed_fit`` cell on the GPU engines; the ``figure`` it binds."""
    run_cell(shell, f"%%distributed_fit {flags} --return figure\n{body}")
    return dict(shell.user_ns["figure"])


def quickstart(ctx: dict) -> dict:
    """The quickstart notebook's cells, as written but for one engine per GPU."""
    notebook = json.loads((ROOT / "notebooks" / "01-quickstart.ipynb").read_text())
    shell = ctx["shell"]
    try:
        for cell in notebook["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            for old, new in QUICKSTART_REPLACE.items():
                source = source.replace(old, new)
            if source.strip():
                run_cell(shell, source)
    finally:  # where a cell failed, its cluster is still up: the next steps start their own
        shell.run_cell("%cluster stop", store_history=False)
    accuracy = shell.user_ns.get("accuracy")
    return {"accuracy": accuracy, "failed": not (accuracy or 0) > 0.8}


def device_rule(ctx: dict) -> dict:
    """What the engine sees: its own GPU is the current device and cuda:LOCAL_RANK."""
    seen = in_cell(ctx["shell"], DEVICE_RULE)
    own = f"cuda:{seen['LOCAL_RANK']}"
    return {**seen, "failed": not (seen["device"] == seen["cuda_means"] == own
                                   and seen["current_device"] == int(seen["LOCAL_RANK"]))}


def warm_rerun(ctx: dict, repeats: int = 15) -> dict:
    """A one-step cell re-run warm, the live view included, against a bare ipyparallel
    round trip to the same engines."""
    shell, client = ctx["shell"], ctx["session"].cluster.client
    run_cell(shell, ONE_STEP_SETUP)
    run_cell(shell, ONE_STEP)  # the first run forms the group and ships the names
    reruns, trips = [], []
    view = client[:]
    for _ in range(repeats):
        began = time.perf_counter()
        run_cell(shell, ONE_STEP)
        reruns.append(time.perf_counter() - began)
        began = time.perf_counter()
        view.apply_sync(lambda: None)
        trips.append(time.perf_counter() - began)
    rerun, trip = statistics.median(reruns), statistics.median(trips)
    return {"rerun_ms": round(rerun * 1e3, 2), "round_trip_ms": round(trip * 1e3, 2),
            "ratio": round(rerun / trip, 2), "goal": f"<= {RERUN_GOAL}x",
            "met": rerun / trip <= RERUN_GOAL}


def _trained(figure: dict) -> bool:
    return "bfloat16" in str(figure.get("dtype_seen")) and figure["last_loss"] < figure["first_loss"]


def hf_trainer(ctx: dict) -> dict:
    """HF Trainer with bf16=True in a cell (NCCL) and the same script under torchrun."""
    cell = in_cell(ctx["shell"], HF_TRAINER_BF16)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "hf_trainer_bf16.py"
        script.write_text(HF_TRAINER_BF16)
        launch = Torchrun(nproc=1).run([script], parse=json.loads, timeout=240)
    ratio = cell["steps_per_s"] / launch.figure["steps_per_s"]
    return {"cell": cell, "torchrun": launch.figure, "cell_vs_torchrun": round(ratio, 3),
            "failed": not (_trained(cell) and _trained(launch.figure))}


def accelerate_bf16(ctx: dict) -> dict:
    figure = in_cell(ctx["shell"], ACCELERATE_BF16)
    return {**figure, "failed": not _trained(figure)}


def lightning_bf16(ctx: dict) -> dict:
    figure = in_cell(ctx["shell"], LIGHTNING_BF16)
    return {**figure, "failed": not _trained(figure)}


# What a run may find allocated on its GPU from the runs before it: an engine collects what a
# finished run left once it adds up to this much (phalanx's own rule), so more means a finished
# run's model stayed into the next one.
LEFT_BY_EARLIER_RUNS_MB = COLLECT_AFTER_BYTES / 2**20


def sharded(ctx: dict) -> dict:
    """Each sharded setting in a cell: it trains (the loss falls), its peak CUDA memory, and
    nothing of the run before it is on the GPU when it begins."""
    shell = ctx["shell"]
    run_cell(shell, SHARDED_SETUP + FULLY_SHARD_OFFLOAD)
    figures: dict = {}
    for name, build in SHARDED_BUILDS.items():
        try:
            figures[name] = in_cell(shell, SHARDED.format(build=build))
        except Exception as exc:
            figures[name] = {"error": f"{type(exc).__name__}: {str(exc)[:600]}"}
    figures["failed"] = any("error" in f or f["last_loss"] >= f["first_loss"]
                            or f["start_mb"] > LEFT_BY_EARLIER_RUNS_MB for f in figures.values())
    return figures


def bench_gpu(ctx: dict) -> dict:
    """``bench_gpu.py --quick`` in its own process (its own cluster); its summary rows."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gpu.json"
        done = subprocess.run([sys.executable, str(HERE / "bench_gpu.py"), "--quick", "--json",
                               str(out)], capture_output=True, text=True, timeout=BUDGET_S, cwd=ROOT)
        if done.returncode != 0 or not out.exists():
            return {"failed": True, "error": done.stderr[-3000:]}
        rows = json.loads(out.read_text())["sections"]["gpu"].get("summary", [])
    return {"rows": rows, "met": f"{sum(1 for r in rows if r.get('met'))} of {len(rows)} rows"}


# (step, whether it runs on the check's cluster): the quickstart starts and stops its own, and
# bench_gpu.py starts its own in another process, after the check's cluster is stopped.
STEPS = [Step("quickstart on the GPU engine", quickstart, cluster=False),
         Step("device rule: the engine's GPU is cuda:LOCAL_RANK and the current device",
              device_rule),
         Step("warm one-step re-run vs bare ipyparallel round trip", warm_rerun),
         Step("HF Trainer bf16=True (NCCL) vs torchrun --nproc_per_node 1", hf_trainer),
         Step("accelerate mixed_precision=bf16", accelerate_bf16),
         Step("Lightning precision=bf16-mixed", lightning_bf16),
         Step("wrap(shard=True) plain / bf16 policy / CPU offload; fully_shard + CPUOffloadPolicy",
              sharded),
         Step("bench_gpu.py --quick rows", bench_gpu, cluster=False)]
