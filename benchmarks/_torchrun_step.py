"""The one training step that bench_latency and bench_throughput launch under torchrun.

Usage: torchrun --standalone --nproc-per-node N _torchrun_step.py STEPS BATCH
Prints rank 0's samples/s of the timed loop as the last line, flushed at once (a launch is
judged by it, see _torchrun.py: a worker that aborts at exit loses what its buffered stdout
still holds).  bench_throughput also runs
``ddp_loop`` in the engines, over the group a run left warm.
"""

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from _models import make_data, make_mlp


def ddp_loop(steps: int, batch: int) -> float:
    """The timed DDP loop over the process group already formed; this rank's samples/s.  Run
    here under torchrun, and by bench_throughput in the engines over their warm group (no
    phalanx run around it), so the two differ only in the process that runs it."""
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    X, y = make_data(batch * world * max(steps, 1), seed=0)
    X, y = X[rank::world], y[rank::world]
    model = DistributedDataParallel(make_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    started = time.perf_counter()
    for i in range(steps):
        xb, yb = X[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    return steps * batch / (time.perf_counter() - started)


def main() -> None:
    steps, batch = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rate = ddp_loop(steps, batch)
    if dist.get_rank() == 0:
        print(f"{rate:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
