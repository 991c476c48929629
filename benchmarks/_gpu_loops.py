"""The MLP loops that bench_gpu.py times, and how each setting runs them: plainly in this
process, in the engine's own namespace without a phalanx run, as a ``%%distributed_fit`` cell,
and under torchrun + DDP on NCCL.  Every loop keeps its data on the GPU, so the figure is the
step."""

from __future__ import annotations

import tempfile
from pathlib import Path

from _torchrun import Torchrun

# Every torchrun launch of bench_gpu: judged by the figure rank 0 printed (see _torchrun.py).
TORCHRUN = Torchrun(nproc=1)

# Every timed loop, plain or in a cell: the data lives on the GPU, so the figure is the step.
SETUP = """
import time, torch
torch.manual_seed(0)
WIDTH, HIDDEN, CLASSES = {width}, {hidden}, 10
net = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(),
                          torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                          torch.nn.Linear(HIDDEN, CLASSES))
"""

LOOP = """
net = net.to(device)
{wrap}
g = torch.Generator(device=device).manual_seed(1)
xb = torch.randn(BATCH, WIDTH, device=device, generator=g)
yb = torch.randint(0, CLASSES, (BATCH,), device=device, generator=g)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
for i in range(STEPS + WARMUP):
    if i == WARMUP:
        torch.cuda.synchronize()
        started = time.perf_counter()
    opt.zero_grad()
    loss_fn(net(xb), yb).backward()
    opt.step()
torch.cuda.synchronize()
elapsed = time.perf_counter() - started
engine_peak_mb = torch.cuda.max_memory_allocated() / 2**20
"""

DDP_SCRIPT = SETUP + """
import os, sys, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
STEPS, WARMUP, BATCH = {steps}, {warmup}, {batch}
dist.init_process_group("nccl")
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
""" + LOOP.format(wrap="net = DistributedDataParallel(net, device_ids=[0])") + """
print(STEPS * BATCH / elapsed, flush=True)
dist.destroy_process_group()
"""


def run_cell(shell, source: str):
    result = shell.run_cell(source, store_history=False)
    result.raise_error()  # what the cell raised, raised here
    return result.result


def plain(code: str, names: dict) -> dict:
    import torch

    ns = {"device": torch.device("cuda", 0), "rank": 0, "world_size": 1, **names}
    exec(code, ns)
    return ns


def magic_rate(shell, session, width: int, hidden: int, steps: int, batch: int, wrap: bool,
               flags: str = "") -> tuple[float, dict]:
    """Samples/s of the loop as a cell on the engine, and the run's memory: the peaks phalanx
    reported, the engine's own ``max_memory_allocated``, and the live samples' largest reading."""
    run_cell(shell, SETUP.format(width=width, hidden=hidden)
             + f"\nSTEPS, WARMUP, BATCH = {steps}, 10, {batch}\nfrom phalanx import wrap\n")
    body = LOOP.format(wrap="net = wrap(net)" if wrap else "")
    live: list[float] = []

    def watch(event: dict) -> None:
        if event.get("type") == "memory":
            live.extend(s["cuda_allocated_mb"] for s in event["ranks"] if "cuda_allocated_mb" in s)

    unsubscribe = session.events.subscribe(watch)
    try:
        run_cell(shell, f"%%distributed_fit --no-widget {flags} --return elapsed,engine_peak_mb\n" + body)
    finally:
        unsubscribe()
    memory = {**session.last_run().memory.get(0, {}), "engine_max_memory_allocated_mb":
              round(shell.user_ns["engine_peak_mb"], 1), "live_samples": len(live),
              "live_max_allocated_mb": max(live, default=None)}
    return steps * batch / shell.user_ns["elapsed"], memory


def engine_rate(session, width: int, hidden: int, steps: int, batch: int) -> float:
    """Samples/s of the loop run in the engine's own namespace by ipyparallel's ``execute``:
    the engine process without a phalanx run (no hooks, no metrics thread, no process group)."""
    client = session.cluster.client
    view = client[client.ids[0]]
    code = (f"import torch\ndevice = torch.device('cuda', 0)\n"
            f"STEPS, WARMUP, BATCH = {steps}, 10, {batch}\n"
            + SETUP.format(width=width, hidden=hidden) + LOOP.format(wrap="")
            + "\nbench_rate = STEPS * BATCH / elapsed\n")
    view.execute(code, block=True)
    return float(view.pull("bench_rate", block=True))


def plain_rate(width: int, hidden: int, steps: int, batch: int) -> tuple[float, float]:
    """Samples/s of the loop run plainly in this process, and its peak CUDA memory (MB)."""
    import torch

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    ns = plain(SETUP.format(width=width, hidden=hidden) + LOOP.format(wrap=""),
               {"STEPS": steps, "WARMUP": 10, "BATCH": batch})
    return steps * batch / ns["elapsed"], torch.cuda.max_memory_allocated() / 2**20


def torchrun_rate(width: int, hidden: int, steps: int, batch: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "ddp_step.py"
        script.write_text(DDP_SCRIPT.format(width=width, hidden=hidden, steps=steps, warmup=10,
                                            batch=batch))
        return TORCHRUN.run([script]).figure


# (label, width, hidden, batch, steps): a model whose step the GPU's arithmetic bounds, and the
# small MLP of bench_throughput, whose step (about 1 ms) is bound by per-step overhead
# (launches, hooks): 3,000 of its steps (about 3 s) make a loop long enough to time.
MODELS = [("gpu_bound", 1024, 4096, 1024, 300), ("small", 64, 256, 32, 3000)]
SMALL = (64, 256, 32)  # width, hidden, batch of the small MLP
