"""The cost of a host-bound CUDA step (issue 59 on a GPU): where ``wrap()`` loses to torchrun.

The small MLP of bench_gpu (64-256-10, batch 32, the data on the GPU), whose step the host
bounds (kernel launches, Python, hooks), as DDP on NCCL with one rank in three places on the
same GPU, alternating in both orders:

- torchrun: the DDP loop under ``torchrun --nproc-per-node 1`` (one served launch, warm);
- engine: the same DDP loop sent to the GPU engine with ipyparallel, over the group a run left
  warm, no run around it (the engine process against torchrun's);
- run: ``wrap(net)`` in a ``%%distributed_fit`` cell (the run's own cost against the engine).

Per step: wall microseconds (what a host-bound loop loses) and the training thread's CPU.  Then
one block of the engine and of the run under cProfile, their functions with the most time of
their own per step side by side, and a run with every phalanx callable of a step metered, by
the thread's CPU clock and by the wall clock (a call that waits for the GPU shows in the latter).

    python benchmarks/bench_gpu_step.py [--json OUT] [--quick] [--blocks N] [--cpu]

Records ``skipped`` without CUDA; ``--cpu`` runs the same on a CPU engine and gloo (a dry run of
the benchmark itself: the figures mean nothing there).
"""

from __future__ import annotations

import contextlib
import io
import statistics
import tempfile
from pathlib import Path
from typing import Any

from _common import HERE, median_interval, parse_args, save

BATCH = 32
MODEL = "make_mlp(64, 256, 10)"

RUN_BODY = f"""
from _models import make_mlp
from _step_cost_loop import timed_device_loop
net = wrap({MODEL}.to(device))
cost = timed_device_loop(net, STEPS, BATCH, profile=PROFILE)
"""

TORCHRUN_LOOP = f"""
import os, sys
sys.path.insert(0, {{here!r}})
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from _models import make_mlp
from _step_cost_loop import timed_device_loop
CUDA = {{cuda}}
if CUDA:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
if not dist.is_initialized():
    dist.init_process_group("nccl" if CUDA else "gloo")
net = {MODEL}
net = (DistributedDataParallel(net.cuda(), device_ids=[torch.cuda.current_device()]) if CUDA
       else DistributedDataParallel(net))
figure = timed_device_loop(net, {{steps}}, {{batch}})
"""


def engine_loop(steps: int, batch: int, profile: bool = False) -> dict[str, Any]:  # on the engine
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from _models import make_mlp
    from _step_cost_loop import timed_device_loop

    net = make_mlp(64, 256, 10)
    if torch.cuda.is_available():
        net = DistributedDataParallel(net.cuda(), device_ids=[torch.cuda.current_device()])
    else:
        net = DistributedDataParallel(net)
    return timed_device_loop(net, steps, batch, profile=profile)


def run_loop(session: Any, steps: int, profile: bool = False) -> dict[str, Any]:
    from phalanx import wrap
    from phalanx.fit import FitOptions

    ns = {"STEPS": steps, "BATCH": BATCH, "PROFILE": profile, "wrap": wrap}
    opts = FitOptions.build(n=1, returns="cost", widget=False, name="bench-gpu-step")
    with contextlib.redirect_stdout(io.StringIO()):
        session.distributed_fit(RUN_BODY, opts, ns)
    return ns["cost"]


def metered(session: Any, engine: Any, steps: int, clock: str) -> dict[str, Any]:
    engine.apply_sync(lambda c: __import__("_step_cost_meter").install(c), clock)
    try:
        total = run_loop(session, steps)
    finally:
        parts = engine.apply_sync(lambda s: __import__("_step_cost_meter").read(s), steps)
    return {"components": parts, "wall_us": total["wall_us"], "thread_us": total["thread_us"]}


def side_by_side(engine: list[dict], run: list[dict]) -> list[dict]:
    """The profiled blocks' functions, per step: engine and run, the run's largest first."""
    seen: dict[str, dict[str, float]] = {}
    for place, rows in (("engine_us", engine), ("run_us", run)):
        for row in rows:
            seen.setdefault(row["function"], {"engine_us": 0.0, "run_us": 0.0})[place] = row["us"]
    return sorted(({"function": f, **v, "added_us": v["run_us"] - v["engine_us"]}
                   for f, v in seen.items()), key=lambda r: -abs(r["added_us"]))[:30]


def compare(places: dict[str, list[dict]], baseline: str, candidate: str) -> dict[str, Any]:
    """baseline / candidate per step, paired by block: >= 1 when the candidate costs no more."""
    out = {}
    for key in ("wall_us", "thread_us", "process_us"):
        paired = [b[key] / c[key] for b, c in zip(places[baseline], places[candidate])]
        out[key] = {"paired_median": statistics.median(paired), "ci95": median_interval(paired),
                    "paired": paired}
    return out


def main(argv: list[str] | None = None) -> dict:
    def options(parser: Any) -> None:
        parser.add_argument("--blocks", type=int, default=None,
                            help="blocks of each place (default 8; --quick 2)")
        parser.add_argument("--cpu", action="store_true",
                            help="a dry run on a CPU engine and gloo (figures mean nothing)")

    args = parse_args(__doc__, argv, options)
    import torch

    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda and not args.cpu:
        data = {"skipped": "no CUDA device on this machine"}
        save("gpu_step", data, args.json)
        return data
    from _torchrun import ServedTorchrun
    from phalanx._session import Session

    steps, blocks = (500, 2) if args.quick else (2000, 8)
    blocks = args.blocks or blocks
    session = Session()
    session.start_cluster(n=1, gpus="auto" if cuda else "none")
    engine = session.cluster.client[session.cluster.slots()[0].engine_id]
    places: dict[str, list[dict]] = {}
    try:
        run_loop(session, 50)  # the group of one the engine's DDP loop uses, and warm imports
        engine.apply_sync(engine_loop, 50, BATCH)
        with tempfile.TemporaryDirectory(prefix="bench-gpu-step-") as folder:
            served = ServedTorchrun(Path(folder), nproc=1)
            try:
                script = Path(folder) / "ddp_loop.py"
                script.write_text(TORCHRUN_LOOP.format(here=str(HERE), steps=steps, batch=BATCH,
                                                        cuda=cuda))
                served.run(script)
                measure = {"run_wrap": lambda: run_loop(session, steps),
                           "engine_ddp": lambda: engine.apply_sync(engine_loop, steps, BATCH),
                           "torchrun_ddp": lambda: served.run(script)}
                for i in range(blocks):
                    for place in (list(measure) if i % 2 == 0 else list(reversed(measure))):
                        places.setdefault(place, []).append(measure[place]())
                    print(f"  block {i + 1}/{blocks}: " + ", ".join(
                        f"{p} {places[p][-1]['wall_us']:.0f}/{places[p][-1]['thread_us']:.0f}"
                        for p in measure) + " us a step (wall/thread CPU)", flush=True)
            finally:
                served.close()
        profiled = {"engine": engine.apply_sync(engine_loop, steps, BATCH, True),
                    "run": run_loop(session, steps, profile=True)}
        meters = {clock: metered(session, engine, steps, clock) for clock in ("thread", "wall")}
    finally:
        session.close()
    data = {
        "steps_per_block": steps, "blocks": blocks, "batch": BATCH, "model": MODEL,
        "gpu": torch.cuda.get_device_name(0) if cuda else "none: a dry run on the CPU",
        "per_step": {p: {k: statistics.median(b[k] for b in v)
                         for k in ("wall_us", "thread_us", "process_us")} for p, v in places.items()},
        "blocks_figures": places,
        "ratios": {"wrap_run_vs_torchrun_ddp": compare(places, "torchrun_ddp", "run_wrap"),
                   "wrap_run_vs_engine_ddp": compare(places, "engine_ddp", "run_wrap"),
                   "engine_ddp_vs_torchrun_ddp": compare(places, "torchrun_ddp", "engine_ddp")},
        "profiled": {"engine_wall_us": profiled["engine"]["wall_us"],
                     "run_wall_us": profiled["run"]["wall_us"],
                     "functions": side_by_side(profiled["engine"]["top"], profiled["run"]["top"])},
        "components": meters,
        "target": ">= 0.97x torchrun + DDP per step",
    }
    for name, r in data["ratios"].items():
        print(f"{name:28s} wall {r['wall_us']['paired_median']:.3f} "
              f"({r['wall_us']['ci95'][0]:.3f}-{r['wall_us']['ci95'][1]:.3f}); thread CPU "
              f"{r['thread_us']['paired_median']:.3f} ({r['thread_us']['ci95'][0]:.3f}-"
              f"{r['thread_us']['ci95'][1]:.3f})")
    for place, figures in data["per_step"].items():
        print(f"{place:14s} " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    print(f"profiled: engine {data['profiled']['engine_wall_us']:.0f} us, run "
          f"{data['profiled']['run_wall_us']:.0f} us a step")
    for row in data["profiled"]["functions"][:20]:
        print(f"  {row['added_us']:+8.1f} us  (engine {row['engine_us']:7.1f}, run "
              f"{row['run_us']:7.1f})  {row['function']}")
    for clock, m in meters.items():
        print(f"meter by {clock}: " + ", ".join(f"{k} {v['us']:.1f} us"
                                                for k, v in m["components"].items()))
    save("gpu_step", data, args.json)
    return data


if __name__ == "__main__":
    main()
