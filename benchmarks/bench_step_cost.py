"""The cost of a training step (issue 59), measured so that a noisy machine cannot hide it:
the CPU time per step of the process that trains, for the same loop in three places on the
same engines, alternating.

- plain: the loop in this process (a notebook's kernel without phalanx);
- engine: the loop sent to an engine with ipyparallel, no run around it (the engine process's
  own cost against plain);
- run: the loop as the body of a ``%%distributed_fit`` cell (the run's own cost against engine).

For 2 workers the same with ``wrap()`` (DDP): the DDP loop in both engines over the group a run
left warm, and under torchrun (one launch whose workers stay up, ``_torchrun.ServedTorchrun``),
against ``wrap()`` in a run.  Each block is one loop of STEPS steps; the places
alternate, in both orders, BLOCKS times.  A ratio is engine/run CPU per step (>= 0.97x: the run
costs at most 3% more): the median of the paired blocks' ratios, decided by its 95% interval
(a target inside it is undecided), for the CPU time of the process less torch's collective
threads (``_step_cost_loop``: gloo's threads spin while the peer is late, which moved the
process's total by 15% between blocks of the same DDP loop).  The process's whole CPU time, the
fastest block of each place and wall-clock ratios of the same blocks are reported beside; where
the machine exposes a hardware counter, user-space instructions per step too ("not available"
on a virtual machine without one).

The run's fixed cost per step, which noise on this machine cannot hide: the same model with
layers two wide (the same parameters and hooks, next to no arithmetic), its step's CPU time on
the training thread in a run and in the engine without one, alternating; the difference in
microseconds, and that difference as a share of the real step above (its implied ratio).

Then one run of each kind with every phalanx callable of a step metered (``_step_cost_meter``):
the run's per-step microseconds by component.  And the Python work the run adds to that tiny
step, counted in bytecodes and calls on the training thread (``_step_trace``): the same figure
on every run of the same code, so a change of a few microseconds shows as it is.

    python benchmarks/bench_step_cost.py [--json OUT] [--quick] [--blocks N]
"""

from __future__ import annotations

import contextlib
import io
import statistics
import tempfile
from pathlib import Path
from typing import Any

from _common import HERE, median_interval, parse_args, save
from _models import make_data, make_mlp
from _step_cost_loop import timed_loop
from _step_trace import added as added_work
from _torchrun import ServedTorchrun

BATCH = 32
RUN_BODY = """
from _step_cost_loop import timed_loop
{setup}
cost = timed_loop(net, X, y, STEPS, BATCH)
"""


def engine_loop(steps: int, batch: int, ddp: bool) -> dict[str, Any]:  # runs on an engine
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from _models import make_data, make_mlp
    from _step_cost_loop import timed_loop

    world = dist.get_world_size() if ddp else 1
    rank = dist.get_rank() if ddp else 0
    X, y = make_data(steps * batch * world)
    net = make_mlp()
    if ddp:
        net = DistributedDataParallel(net)
    return timed_loop(net, X[rank::world], y[rank::world], steps, batch)


# The same DDP loop under torchrun, as the served launch's workers run it (rank 0's costs)
TORCHRUN_LOOP = """
import sys
sys.path.insert(0, {here!r})
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from _models import make_data, make_mlp
from _step_cost_loop import timed_loop
if not dist.is_initialized():
    dist.init_process_group("gloo")
world, rank = dist.get_world_size(), dist.get_rank()
X, y = make_data({steps} * {batch} * world)
figure = timed_loop(DistributedDataParallel(make_mlp()), X[rank::world], y[rank::world],
                    {steps}, {batch})
"""


def run_loop(session: Any, steps: int, workers: int) -> dict[str, Any]:
    from phalanx import wrap
    from phalanx.fit import FitOptions

    X, y = make_data(steps * BATCH * workers)
    ns = {"X": X, "y": y, "net": make_mlp(), "STEPS": steps, "BATCH": BATCH, "wrap": wrap}
    body = RUN_BODY.format(setup="net = wrap(net)" if workers > 1 else "")
    opts = FitOptions.build(n=workers, shard="X,y" if workers > 1 else "", returns="cost",
                            widget=False, name="bench-step-cost")
    with contextlib.redirect_stdout(io.StringIO()):
        session.distributed_fit(body, opts, ns)
    return ns["cost"]


TINY_BODY = """
from _models import make_mlp
from _step_cost_loop import tiny_step_us
net = make_mlp(2, 2, 2)
{setup}
cost = tiny_step_us(net, STEPS, REPS)
"""


def tiny_engine(steps: int, reps: int, ddp: bool, rank1_busy_us: int = 0) -> float:  # on an engine
    import time

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from _models import make_mlp
    from _step_cost_loop import tiny_step_us

    net = make_mlp(2, 2, 2)
    if rank1_busy_us and dist.get_rank() == 1:
        def busy(module: Any, args: Any) -> None:  # work added to rank 1's steps only
            until = time.perf_counter_ns() + rank1_busy_us * 1000
            while time.perf_counter_ns() < until:
                pass

        net.register_forward_pre_hook(busy)
    return tiny_step_us(DistributedDataParallel(net) if ddp else net, steps, reps)


CALIBRATION_US = 50


def peer_wait_calibration(both: Any, steps: int, reps: int, blocks: int) -> dict[str, Any]:
    """What ``CALIBRATION_US`` of work added to rank 1's steps alone does to rank 0's CPU time
    per step in the DDP loop: a DDP rank spins while it waits for its peer, so rank 0's figure
    counts the peer's lateness too, and the 2-worker fixed cost is an upper bound."""
    added = []
    for i in range(blocks):
        order = (0, CALIBRATION_US) if i % 2 == 0 else (CALIBRATION_US, 0)
        got = {busy: both.apply_sync(tiny_engine, steps, reps, True, busy)[0] for busy in order}
        added.append(got[CALIBRATION_US] - got[0])
    return {"rank1_busy_us": CALIBRATION_US, "rank0_added_us": statistics.median(added),
            "pairs_us": added}


def tiny_run(session: Any, steps: int, reps: int, workers: int) -> float:
    return _tiny_cell(session, TINY_BODY, {"STEPS": steps, "REPS": reps}, workers)


def _tiny_cell(session: Any, body: str, ns: dict, workers: int) -> Any:
    """``body`` (with ``{setup}`` where 2 workers wrap() the model) run as a cell; its ``cost``."""
    from phalanx import wrap
    from phalanx.fit import FitOptions

    ns = {**ns, "wrap": wrap}
    opts = FitOptions.build(n=workers, returns="cost", widget=False, name="bench-step-cost")
    with contextlib.redirect_stdout(io.StringIO()):
        session.distributed_fit(body.format(setup="net = wrap(net)" if workers > 1 else ""),
                                opts, ns)
    return ns["cost"]


TRACED_BODY = """
from _models import make_mlp
from _step_trace import tiny_step_work
net = make_mlp(2, 2, 2)
{setup}
cost = tiny_step_work(net, STEPS)
"""


def traced_engine(steps: int, ddp: bool) -> dict[str, Any]:  # runs on an engine
    from torch.nn.parallel import DistributedDataParallel

    from _models import make_mlp
    from _step_trace import tiny_step_work

    net = make_mlp(2, 2, 2)
    return tiny_step_work(DistributedDataParallel(net) if ddp else net, steps)


def python_work(session: Any, one: Any, both: Any, steps: int) -> dict[str, Any]:
    """The Python work per step the run adds, counted (``_step_trace``): the fixed-cost step
    traced in a run and in the engine without one, for 1 worker and for 2 with wrap()."""
    out = {}
    for kind, workers in (("1 worker", 1), ("2 workers wrap()", 2)):
        in_run = _tiny_cell(session, TRACED_BODY, {"STEPS": steps}, workers)
        in_engine = (both.apply_sync(traced_engine, steps, True)[0] if workers > 1
                     else one.apply_sync(traced_engine, steps, False))
        out[kind] = {"steps": steps, "in_run": in_run, "in_engine": in_engine,
                     "added": added_work(in_run, in_engine)}
    return out


def fixed_cost(run: Any, engine: Any, blocks: int, step_us: float) -> dict[str, Any]:
    """The run's added microseconds per tiny step (median of alternating pairs), and that as a
    share of ``step_us``, the real step's CPU time in the engine."""
    added = []
    for i in range(blocks):
        pair = (run, engine) if i % 2 == 0 else (engine, run)
        first, second = pair[0](), pair[1]()
        in_run, in_engine = (first, second) if i % 2 == 0 else (second, first)
        added.append(in_run - in_engine)
    us = statistics.median(added)
    return {"added_us": us, "pairs_us": added, "interval_us": median_interval(added),
            "step_us": step_us, "implied_ratio": step_us / (step_us + us)}


def plain_loop(steps: int) -> dict[str, Any]:
    X, y = make_data(steps * BATCH)
    return timed_loop(make_mlp(), X, y, steps, BATCH)


def _summary(blocks: list[dict], key: str) -> dict[str, Any] | None:
    values = [b[key] for b in blocks if b.get(key) is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "samples": values}


def _threads(blocks: list[dict]) -> dict[str, float]:
    """Each thread name's median CPU microseconds per step over the blocks (0 where absent)."""
    names = {name for b in blocks for name in b.get("threads_us", {})}
    return {name: statistics.median(b.get("threads_us", {}).get(name, 0.0) for b in blocks)
            for name in sorted(names)}


def ratios(baseline: list[dict], candidate: list[dict], key: str) -> dict[str, Any] | None:
    """baseline cost / candidate cost: >= 1 when the candidate costs no more."""
    if any(b.get(key) is None for b in baseline + candidate):
        return None
    paired = [b[key] / c[key] for b, c in zip(baseline, candidate)]
    return {"fastest": min(b[key] for b in baseline) / min(c[key] for c in candidate),
            "paired_median": statistics.median(paired), "ci95": median_interval(paired),
            "paired": paired}


def compare(places: dict[str, list[dict]], baseline: str, candidate: str) -> dict[str, Any]:
    return {key: ratios(places[baseline], places[candidate], key)
            for key in ("own_us", "process_us", "thread_us", "instructions", "wall_us")}


def metered(session: Any, steps: int, workers: int) -> dict[str, Any]:
    """One run with the meter on every engine of the run: per-step microseconds by component."""
    # the engines of the run's ranks: engine ids follow the order engines registered in, ranks
    # the slots' order, so rank 0 may be engine 1 (a 1-worker run metered on engine 0 read 0)
    targets = session.cluster.client[[s.engine_id for s in session.cluster.slots()[:workers]]]
    targets.apply_sync(lambda: __import__("_step_cost_meter").install())
    try:
        total = run_loop(session, steps, workers)
    finally:
        parts = targets.apply_sync(lambda s: __import__("_step_cost_meter").read(s), steps)[0]
    meter = session.cluster.client[0].apply_sync(lambda: __import__("_step_cost_meter").meter_cost())
    calls = sum(p["calls"] for p in parts.values())
    return {"components": parts, "process_us": total["process_us"],
            "meter_us_per_call": meter, "meter_us_per_step": meter * calls}


def alternate(places: dict[str, list[dict]], measure: dict[str, Any], blocks: int) -> None:
    """``blocks`` blocks of each place, in turn, every other round in the reverse order."""
    for i in range(blocks):
        for place in (list(measure) if i % 2 == 0 else list(reversed(measure))):
            places.setdefault(place, []).append(measure[place]())
        print(f"  block {i + 1}/{blocks}: " + ", ".join(
            f"{p} {places[p][-1]['own_us']:.0f}" for p in measure) + " us CPU a step",
            flush=True)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv, lambda parser: parser.add_argument(
        "--blocks", type=int, default=None,
        help="blocks of each place (default 24; --quick 3): fewer where the machine has cores "
             "to spare and its intervals are narrow, or a time limit"))
    from _common import engine_env
    from phalanx._session import Session

    engine_env()
    # 24 rounds: with 12, the whole step's 95% interval was 0.02-0.09 wide, for a 3% question
    steps, blocks = (150, 3) if args.quick else (600, 24)
    blocks = args.blocks or blocks
    session = Session()
    session.start_cluster(n=2, gpus="none")
    one = session.cluster.client[session.cluster.slots()[0].engine_id]  # rank 0's, as the runs'
    both = session.cluster.client[:]
    try:
        run_loop(session, 20, 1)
        one.apply_sync(engine_loop, 20, BATCH, False)
        places: dict[str, list[dict]] = {}
        one_worker = {
            "plain": lambda: plain_loop(steps),
            "engine": lambda: one.apply_sync(engine_loop, steps, BATCH, False),
            "run": lambda: run_loop(session, steps, 1),
        }
        alternate(places, one_worker, blocks)
        # A 1-worker run leaves a group of one on its engine: the 2-worker blocks come after
        # them, the first behind a warm-up run that leaves the 2-rank group the DDP loop uses.
        run_loop(session, 20, 2)
        with tempfile.TemporaryDirectory(prefix="bench-step-cost-") as folder:
            served = ServedTorchrun(Path(folder))
            try:
                script = Path(folder) / "ddp_loop.py"
                script.write_text(TORCHRUN_LOOP.format(here=str(HERE), steps=steps, batch=BATCH))
                served.run(script)  # warm: imports, the process group
                two_workers = {
                    "run_wrap": lambda: run_loop(session, steps, 2),
                    "engine_ddp": lambda: both.apply_sync(engine_loop, steps, BATCH, True)[0],
                    "torchrun_ddp": lambda: served.run(script),
                }
                alternate(places, two_workers, blocks)
            finally:
                served.close()
        tiny_steps, tiny_reps = (300, 2) if args.quick else (1500, 3)
        # 1 worker first: its run leaves a group of one on rank 0's engine, and each 2-worker
        # pair begins with the run (the first pair's leaves the 2-rank group DDP needs)
        fixed = {
            "1 worker": fixed_cost(lambda: tiny_run(session, tiny_steps, tiny_reps, 1),
                                   lambda: one.apply_sync(tiny_engine, tiny_steps, tiny_reps, False),
                                   blocks, statistics.median(b["own_us"] for b in places["engine"])),
            "2 workers wrap()": fixed_cost(
                lambda: tiny_run(session, tiny_steps, tiny_reps, 2),
                lambda: both.apply_sync(tiny_engine, tiny_steps, tiny_reps, True)[0],
                blocks, statistics.median(b["own_us"] for b in places["engine_ddp"])),
        }
        fixed["2 workers wrap()"]["peer_wait"] = peer_wait_calibration(
            both, tiny_steps, tiny_reps, max(2, blocks // 2))
        components = {"1 worker": metered(session, steps, 1),
                      "2 workers wrap()": metered(session, steps, 2)}
        # 200 steps hold two of the guard's checks (every 100 steps by default)
        work = python_work(session, one, both, 200)
    finally:
        session.close()
    data = {
        "steps_per_block": steps, "blocks": blocks, "batch": BATCH,
        "per_step": {p: {k: _summary(b, k) for k in ("own_us", "process_us", "collective_threads_us",
                                                      "thread_us", "wall_us", "instructions")}
                     for p, b in places.items()},
        # which threads each place runs besides the training one (the median block's figure)
        "threads_us": {p: _threads(b) for p, b in places.items()},
        "ratios": {"run_vs_engine_1": compare(places, "engine", "run"),
                   "engine_vs_plain_1": compare(places, "plain", "engine"),
                   "run_vs_plain_1": compare(places, "plain", "run"),
                   "wrap_run_vs_engine_ddp_2": compare(places, "engine_ddp", "run_wrap"),
                   "wrap_run_vs_torchrun_ddp_2": compare(places, "torchrun_ddp", "run_wrap"),
                   "engine_ddp_vs_torchrun_2": compare(places, "torchrun_ddp", "engine_ddp")},
        "components": components,
        "fixed_cost": fixed,
        "python_work": work,
        "target": ">= 0.97x by CPU time per step (the process less torch's collective threads)",
    }
    for name, r in data["ratios"].items():
        own, cpu = r["own_us"], r["process_us"]
        print(f"{name:28s} CPU less collective threads: paired median {own['paired_median']:.3f} "
              f"({own['ci95'][0]:.3f}-{own['ci95'][1]:.3f}); whole process: paired median "
              f"{cpu['paired_median']:.3f}, fastest {cpu['fastest']:.3f}; "
              f"wall paired median {r['wall_us']['paired_median']:.3f}")
    for kind, f in fixed.items():
        print(f"{kind}: the run adds {f['added_us']:.1f} us a step ({f['interval_us'][0]:.1f}-"
              f"{f['interval_us'][1]:.1f}); on a {f['step_us']:.0f} us step: {f['implied_ratio']:.3f}")
        if "peer_wait" in f:
            print(f"  {f['peer_wait']['rank1_busy_us']} us of work on rank 1 alone added "
                  f"{f['peer_wait']['rank0_added_us']:.1f} us to rank 0's step")
    for kind, w in work.items():
        print(f"{kind}: the run adds {w['added']['opcodes']['total']:.0f} bytecodes and "
              f"{w['added']['calls']['total']:.1f} Python calls a step (counted)")
    for kind, c in components.items():
        print(f"{kind}: " + ", ".join(f"{k} {v['us']:.1f} us" for k, v in c["components"].items())
              + f" (meter {c['meter_us_per_step']:.1f} us a step)")
    save("step_cost", data, args.json)
    return data


if __name__ == "__main__":
    main()
