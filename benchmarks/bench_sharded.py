"""Sharded mode on the warm engines (issue 43): memory per rank with ``wrap(model, shard=True)``
against the same cell replicated, and an FSDP2 training script's speed as a
``%%distributed_fit`` cell against the same script under torchrun.  2 CPU ranks (gloo), in a
real Jupyter kernel with a 2-engine cluster (``%cluster start -n 2 --gpus none``).

1. **Peak memory per rank, sharded vs replicated** (target <= 0.6x).  One cell text builds an
   MLP of ``DEPTH`` residual blocks in a ``ModuleList`` (``WIDTH -> HIDDEN -> WIDTH`` each,
   25.2M parameters, 101 MB in fp32) on each rank, an AdamW optimizer, and trains ``STEPS``
   steps on a batch of 8: its parameters, gradients and AdamW's two moments are the memory.
   The sharded cell has one line more, ``model = wrap(model, shard=True)`` (FSDP2 per block,
   then the whole model); the replicated cell is plain data-parallel ``%%distributed_fit``
   (phalanx averages the gradients; no wrap).  On each engine :class:`_sharded_memory.PeakRSS`
   measures, from just before the model is built to the end of the last step, how far the
   process's resident memory rose above what it held just before: the kernel's high-water mark
   (``VmHWM``, reset at that start through ``/proc/self/clear_refs``, so a warm engine's earlier
   cells do not count), with a 2 ms psutil sampling thread beside it as a cross-check.  Before
   the start figure is read, garbage is collected and glibc's ``malloc_trim(0)`` returns the
   heap pages earlier cells freed, so neither mode reuses the other's freed pages unseen.  A
   run's model and optimizer should go with its namespace (nothing is ``--keep``'d); what a
   sharded run still leaves behind (see below) stays in use, so it cannot be reused unseen
   either: each run's growth is its own.
   Both modes run once unmeasured first (imports, lazy set-up); then pairs alternate which mode
   goes first.  Per pair, the ratio is the sharded run's peak over the replicated run's, of the
   rank with the larger peak (the memory a rank must have); the figure is the median over
   pairs, each rank's own ratio and peaks beside it, and ``phalanx.last_run().held`` (each
   rank's bytes of parameters, gradients and optimizer state at the run's end) for each mode;
   and what a run of each mode left resident on its engine once it ended (the next run's
   starting figure less its own).  All of it twice, each time in a kernel and cluster of its own: with glibc's allocator as is,
   and with its mmap threshold held at its starting value (``MALLOC_MMAP_THRESHOLD_=131072`` in
   the kernel's environment, which its engines inherit).  As is, glibc raises the threshold as
   large blocks are freed (up to 32 MiB), and then serves blocks up to that size from heaps that
   keep the pages once they are freed; FSDP2 all-gathers each block's parameters anew in every
   forward and backward (16 MB a block here), so the heaps grow step after step.  Held fixed,
   every large block is a mapping of its own, returned as it is freed, and the resident size
   follows the live tensors.  The first is what a user gets; the second, the modes' own memory.
2. **Throughput vs the same FSDP2 code under torchrun** (target >= 0.97x).  One script text,
   written for torchrun: ``dist.init_process_group(backend="gloo")``, RANK/WORLD_SIZE from the
   environment, a smaller MLP of the same kind (4.2M parameters, batch 32), ``fully_shard`` per
   block then the whole model, AdamW, ``STEPS`` steps stamping the clock at each
   ``opt.step()``'s end, ``destroy_process_group()`` at its end.  Rank 0's figure is its
   optimizer steps/s from the end of step ``WARMUP`` to the last step (process start, imports,
   sharding and the first steps stay out under both launchers), printed as one JSON line.  It
   runs as a ``%%distributed_fit --return figure`` cell on the 2 warm engines of the first
   cluster (the allocator as is, as torchrun's workers have it; the warm group stands for the
   script's ``init_process_group``) and as a file under
   ``torchrun --standalone --nproc-per-node 2``; pairs alternate which goes first; the ratio is
   the median of the pairs' own ratios, with their spread.  Beside it, the CPU time rank 0's
   process spent per step and the kernel's CPU during each cell.  ``torch.set_num_threads(1)``
   in every rank (2 ranks on 2 cores).  torchrun launches are judged by the figure rank 0
   printed (see _torchrun.py); crashes at teardown are counted.

The machine's load average is recorded at the start and the end: on a shared 2-core machine the
steps/s pairs say as much about the load as about either launcher; memory does not depend on it.

    python benchmarks/bench_sharded.py [--json OUT] [--quick]
"""

from __future__ import annotations

import ast
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from _common import paired, parse_args, save, stats
from _torchrun import Torchrun

MEMORY_PAIRS, QUICK_MEMORY_PAIRS = 3, 1
SPEED_PAIRS, QUICK_SPEED_PAIRS = 5, 2
WARMUP = 5  # steps left out of the rate: FSDP2's lazy set-up in its first steps, allocations

# The model both parts train: residual blocks in a ModuleList (each one FSDP2 unit), a head.
MODEL = """\
class Blocks(torch.nn.Module):
    def __init__(self, width, hidden, depth):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(),
                                torch.nn.Linear(hidden, width)) for _ in range(depth))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)
"""

MEMORY_SIZE = {"WIDTH": 1024, "HIDDEN": 2048, "DEPTH": 6, "BATCH": 8, "STEPS": 10}
SPEED_SIZE = {"WIDTH": 512, "HIDDEN": 1024, "DEPTH": 4, "BATCH": 32}
SPEED_STEPS, QUICK_SPEED_STEPS = 45, 25

# The engines' allocator, set in the kernel's environment before it starts (its engines inherit
# it; glibc reads it once, at a process's start).  As is, glibc raises its mmap threshold after
# a large block is freed (up to 32 MiB), so later blocks up to that size come from its heaps and
# stay resident after they are freed: FSDP2 all-gathers every block's parameters anew each
# forward and backward (16 MB here), and those blocks pile up in the heaps.  Held at glibc's own
# starting value (128 KiB) each large block is its own mapping, returned when freed, so the
# resident size follows the live tensors.  Both are measured, each in its own kernel and cluster.
ALLOCATORS = {"default": {}, "mmap_threshold_128k": {"MALLOC_MMAP_THRESHOLD_": "131072"}}

# The memory cell; {wrap} is the one line the modes differ by.
MEMORY_CELL = """\
%%distributed_fit --return figure
import torch
import torch.distributed as dist
from phalanx import wrap
from _sharded_memory import PeakRSS
torch.set_num_threads(1)
{model}
{sizes}
torch.manual_seed(100 + rank)
X, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)
with PeakRSS() as memory:
    torch.manual_seed(0)  # the same model on every rank
    model = Blocks(WIDTH, HIDDEN, DEPTH)
    {wrap}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(STEPS):
        opt.zero_grad()
        ((model(X) - y) ** 2).mean().backward()
        opt.step()
every = [None] * world_size
dist.all_gather_object(every, memory.figure())  # --return brings rank 0's value back
figure = {{"ranks": every}}
"""

WRAP = {"sharded": "model = wrap(model, shard=True)",
        "replicated": "pass  # replicated: the model stays whole on each rank"}

# The FSDP2 script, as written for torchrun; the cell is this very text under the magic's line.
SPEED_SCRIPT = """\
import json
import os
import time
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
torch.set_num_threads(1)
{model}
{sizes}
STEPS, WARMUP = {steps}, {warmup}

dist.init_process_group(backend="gloo")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.manual_seed(0)
model = Blocks(WIDTH, HIDDEN, DEPTH)
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
torch.manual_seed(100 + rank)
X, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)
stamps = [(time.perf_counter(), time.process_time())]
for _ in range(STEPS):
    opt.zero_grad()
    ((model(X) - y) ** 2).mean().backward()
    opt.step()
    stamps.append((time.perf_counter(), time.process_time()))
timed = STEPS - WARMUP
figure = {{"steps_per_s": timed / (stamps[-1][0] - stamps[WARMUP][0]),
          "cpu_ms_per_step": (stamps[-1][1] - stamps[WARMUP][1]) / timed * 1e3,
          "timed_steps": timed}}
if rank == 0:
    print(json.dumps(figure), flush=True)
dist.destroy_process_group()
"""


def _sizes(size: dict[str, int]) -> str:
    return "\n".join(f"{name} = {value}" for name, value in size.items())


def memory_cell(mode: str) -> str:
    """The memory cell of ``mode`` ("sharded" or "replicated")."""
    return MEMORY_CELL.format(model=MODEL, sizes=_sizes(MEMORY_SIZE), wrap=WRAP[mode])


def speed_script(quick: bool) -> str:
    """The FSDP2 script both launchers run."""
    return SPEED_SCRIPT.format(model=MODEL, sizes=_sizes(SPEED_SIZE), warmup=WARMUP,
                               steps=QUICK_SPEED_STEPS if quick else SPEED_STEPS)


def parameters(size: dict[str, int]) -> int:
    """The MLP's parameter count at ``size`` (the cells build it; this says how big it is)."""
    width, hidden, depth = size["WIDTH"], size["HIDDEN"], size["DEPTH"]
    return depth * (2 * width * hidden + hidden + width) + width + 1


def _figure(line: str) -> dict:
    figure = json.loads(line)
    if not isinstance(figure, dict) or "steps_per_s" not in figure:
        raise ValueError(line)
    return figure


class Kernel:
    """A real kernel with 2 warm engines; the cells run as a notebook runs them."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        from _kernel import ClusterKernel

        self.cluster = ClusterKernel(2, env)
        self.notebook = self.cluster.notebook
        self.kernel = psutil.Process(self.cluster.pid)

    def memory(self, mode: str) -> dict:
        """One memory cell: each rank's figures and the run's ``held`` bytes per rank."""
        text = self.notebook.evaluate(memory_cell(mode), "(figure, phalanx.last_run().held)",
                                      timeout=300)
        figure, held = ast.literal_eval(text)
        return {"ranks": figure["ranks"], "held": {int(r): h for r, h in held.items()}}

    def speed(self, cell: str) -> dict:
        """Rank 0's figure, with the kernel's CPU seconds during the cell."""
        cpu = sum(self.kernel.cpu_times()[:2])
        figure = ast.literal_eval(self.notebook.evaluate(cell, "figure", timeout=300))
        figure["kernel_cpu_s"] = sum(self.kernel.cpu_times()[:2]) - cpu
        return figure

    def close(self, stop: bool = True) -> None:
        self.cluster.close(stop)



def measure_memory(kernel: Kernel, pairs: int) -> dict[str, Any]:
    runs: dict[str, list[dict]] = {"sharded": [], "replicated": []}
    sequence = []  # (mode, run) in the order they ran, the unmeasured ones too
    for mode in ("replicated", "sharded"):  # unmeasured: imports, FSDP2's and phalanx's set-up
        sequence.append((mode, kernel.memory(mode)))
    for i in range(pairs):
        for mode in (["replicated", "sharded"] if i % 2 == 0 else ["sharded", "replicated"]):
            runs[mode].append(kernel.memory(mode))
            sequence.append((mode, runs[mode][-1]))
        print(f"memory pair {i + 1}: peak per rank sharded "
              + ", ".join(f"{f['peak_mb']:.0f}" for f in runs["sharded"][-1]["ranks"])
              + " MB, replicated "
              + ", ".join(f"{f['peak_mb']:.0f}" for f in runs["replicated"][-1]["ranks"])
              + " MB", flush=True)
    return {**summarize_memory(runs), "kept_after_run_mb": kept_after(sequence)}


def kept_after(sequence: list[tuple[str, dict]]) -> dict[str, dict]:
    """What a run of each mode left resident on its engine: the next run's starting figure less
    its own (both after gc and ``malloc_trim``), the larger rank's; the last run has no next.
    A run that leaves nothing behind keeps ~0 MB: its namespace goes with it."""
    kept: dict[str, list[float]] = {"sharded": [], "replicated": []}
    for (mode, run), (_, after) in zip(sequence, sequence[1:]):
        kept[mode].append(max(b["start_mb"] - a["start_mb"]
                              for a, b in zip(run["ranks"], after["ranks"])))
    return {mode: stats(values) for mode, values in kept.items() if values}


def summarize_memory(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Per-rank peaks of each mode, the paired ratios, ``held`` per rank (MB)."""
    ranks = range(len(runs["sharded"][0]["ranks"]))

    def peaks(mode: str, key: str = "peak_mb") -> dict[str, dict]:
        return {str(r): stats([run["ranks"][r][key] for run in runs[mode]]) for r in ranks}

    def largest(mode: str) -> list[float]:
        return [max(f["peak_mb"] for f in run["ranks"]) for run in runs[mode]]

    def held(mode: str) -> dict[str, dict[str, float]]:
        last = runs[mode][-1]["held"]  # the same every run: the model and optimizer's tensors
        return {str(r): {k: v / 2**20 for k, v in last[r].items()} for r in ranks}

    return {"parameters": parameters(MEMORY_SIZE), "size": MEMORY_SIZE,
            "peak_mb": {mode: peaks(mode) for mode in runs},
            "sampled_peak_mb": {mode: peaks(mode, "sampled_peak_mb") for mode in runs},
            "start_mb": {mode: peaks(mode, "start_mb") for mode in runs},
            "malloc_mmap_threshold": sorted({str(f["malloc_mmap_threshold"]) for m in runs.values()
                                             for run in m for f in run["ranks"]}),
            "high_water_reset": all(f["high_water_reset"] for m in runs.values() for run in m
                                    for f in run["ranks"]),
            "sharded_vs_replicated": paired(largest("sharded"), largest("replicated")),
            "per_rank": {str(r): paired([run["ranks"][r]["peak_mb"] for run in runs["sharded"]],
                                        [run["ranks"][r]["peak_mb"] for run in
                                         runs["replicated"]]) for r in ranks},
            "held_mb": {mode: held(mode) for mode in runs}, "runs": runs}


def measure_speed(kernel: Kernel, root: Path, pairs: int, quick: bool) -> dict[str, Any]:
    script = speed_script(quick)
    (root / "train_fsdp2.py").write_text(script)
    torchrun = Torchrun(nproc=2, env={"GLOO_SOCKET_IFNAME": "lo"})
    cell = "%%distributed_fit --return figure\n" + script
    figures: dict[str, list[dict]] = {"magic": [], "torchrun": []}
    kernel.speed(cell)  # unmeasured: the cell's first run (FSDP2's imports on the engines)
    for i in range(pairs):
        for side in (["torchrun", "magic"] if i % 2 == 0 else ["magic", "torchrun"]):
            if side == "torchrun":
                figures["torchrun"].append(torchrun.run([root / "train_fsdp2.py"],
                                                        parse=_figure).figure)
            else:
                figures["magic"].append(kernel.speed(cell))
        print(f"speed pair {i + 1}: {figures['magic'][-1]['steps_per_s']:.2f} vs "
              f"{figures['torchrun'][-1]['steps_per_s']:.2f} steps/s", flush=True)

    def series(side: str, key: str) -> list[float]:
        return [f[key] for f in figures[side]]

    return {"parameters": parameters(SPEED_SIZE), "size": SPEED_SIZE,
            "steps": QUICK_SPEED_STEPS if quick else SPEED_STEPS, "warmup_steps": WARMUP,
            "magic_steps_per_s": stats(series("magic", "steps_per_s")),
            "torchrun_steps_per_s": stats(series("torchrun", "steps_per_s")),
            "magic_vs_torchrun": paired(series("magic", "steps_per_s"),
                                        series("torchrun", "steps_per_s")),
            "magic_cpu_ms_per_step": stats(series("magic", "cpu_ms_per_step")),
            "torchrun_cpu_ms_per_step": stats(series("torchrun", "cpu_ms_per_step")),
            "kernel_cpu_s_per_cell": stats(series("magic", "kernel_cpu_s")),
            "torchrun": torchrun.record()}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    started, load_before = time.perf_counter(), os.getloadavg()
    memory_pairs = QUICK_MEMORY_PAIRS if args.quick else MEMORY_PAIRS
    memory, speed = {}, {}
    for allocator, env in ALLOCATORS.items():
        print(f"allocator: {allocator}", flush=True)
        kernel = Kernel(env)
        try:
            memory[allocator] = measure_memory(kernel, memory_pairs)
            if not speed:  # the engines as torchrun's workers run: the allocator as is
                with tempfile.TemporaryDirectory(prefix="bench-sharded-") as tmp:
                    speed = measure_speed(kernel, Path(tmp), QUICK_SPEED_PAIRS if args.quick
                                          else SPEED_PAIRS, args.quick)
        finally:
            kernel.close()
    data = {"memory": memory, "speed": speed, "allocators": ALLOCATORS,
            "load_average": [load_before, os.getloadavg()],
            "targets": {"memory": "<= 0.6x replicated", "speed": ">= 0.97x torchrun"},
            "measured_s": time.perf_counter() - started}
    for allocator, figures in memory.items():
        r = figures["sharded_vs_replicated"]
        print(f"peak memory ({allocator}), sharded / replicated: {r['ratio']:.3f}x (pairs "
              f"{r['min']:.3f}-{r['max']:.3f}); per rank " + "; ".join(
                  f"rank {k} {figures['peak_mb']['sharded'][k]['median']:.0f} vs "
                  f"{figures['peak_mb']['replicated'][k]['median']:.0f} MB"
                  for k in sorted(figures["peak_mb"]["sharded"])))
    r = speed["magic_vs_torchrun"]
    print(f"FSDP2 steps/s, 2 engines vs torchrun: {speed['magic_steps_per_s']['median']:.2f} vs "
          f"{speed['torchrun_steps_per_s']['median']:.2f}: {r['ratio']:.3f}x (pairs "
          f"{r['min']:.3f}-{r['max']:.3f}); torchrun launches {speed['torchrun']['launches']}, "
          f"crashed at teardown after their figure {speed['torchrun']['crashed_at_teardown']}")
    save("sharded", data, args.json)
    return data


if __name__ == "__main__":
    main()
