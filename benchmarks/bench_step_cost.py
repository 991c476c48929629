"""The cost of a training step (issue 59), measured so that a noisy machine cannot hide it:
the CPU time per step of the process that trains, for the same loop in three places on the
same engines, alternating.

- plain: the loop in this process (a notebook's kernel without phalanx);
- engine: the loop sent to an engine with ipyparallel, no run around it (the engine process's
  own cost against plain);
- run: the loop as the body of a ``%%distributed_fit`` cell (the run's own cost against engine).

For 2 workers the same with ``wrap()`` (DDP): the DDP loop in both engines over the group a run
left warm, against ``wrap()`` in a run.  Each block is one loop of STEPS steps; the places
alternate, in both orders, BLOCKS times.  A ratio is engine/run CPU per step (>= 0.97x: the run
costs at most 3% more), from the fastest block of each place (interference only adds CPU time,
through caches and frequency) and the median of the paired blocks; wall-clock ratios of the
same blocks are reported beside them.  Where the machine exposes a hardware counter, user-space
instructions per step too ("not available" on a virtual machine without one).

Then one run of each kind with every phalanx callable of a step metered (``_step_cost_meter``):
the run's per-step microseconds by component.

    python benchmarks/bench_step_cost.py [--json OUT] [--quick]
"""

from __future__ import annotations

import contextlib
import io
import statistics
from typing import Any

from _common import parse_args, save
from _models import make_data, make_mlp
from _step_cost_loop import timed_loop

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


def plain_loop(steps: int) -> dict[str, Any]:
    X, y = make_data(steps * BATCH)
    return timed_loop(make_mlp(), X, y, steps, BATCH)


def _summary(blocks: list[dict], key: str) -> dict[str, Any] | None:
    values = [b[key] for b in blocks if b.get(key) is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "samples": values}


def ratios(baseline: list[dict], candidate: list[dict], key: str) -> dict[str, Any] | None:
    """baseline cost / candidate cost: >= 1 when the candidate costs no more."""
    if any(b.get(key) is None for b in baseline + candidate):
        return None
    paired = [b[key] / c[key] for b, c in zip(baseline, candidate)]
    return {"fastest": min(b[key] for b in baseline) / min(c[key] for c in candidate),
            "paired_median": statistics.median(paired), "paired": paired}


def compare(places: dict[str, list[dict]], baseline: str, candidate: str) -> dict[str, Any]:
    return {key: ratios(places[baseline], places[candidate], key)
            for key in ("process_us", "thread_us", "instructions", "wall_us")}


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
            f"{p} {places[p][-1]['process_us']:.0f}" for p in measure) + " us CPU a step",
            flush=True)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    from _common import engine_env
    from phalanx._session import Session

    engine_env()
    steps, blocks = (150, 3) if args.quick else (600, 8)
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
        two_workers = {
            "run_wrap": lambda: run_loop(session, steps, 2),
            "engine_ddp": lambda: both.apply_sync(engine_loop, steps, BATCH, True)[0],
        }
        alternate(places, two_workers, blocks)
        components = {"1 worker": metered(session, steps, 1),
                      "2 workers wrap()": metered(session, steps, 2)}
    finally:
        session.close()
    data = {
        "steps_per_block": steps, "blocks": blocks, "batch": BATCH,
        "per_step": {p: {k: _summary(b, k) for k in ("process_us", "thread_us", "wall_us",
                                                      "instructions")}
                     for p, b in places.items()},
        "ratios": {"run_vs_engine_1": compare(places, "engine", "run"),
                   "engine_vs_plain_1": compare(places, "plain", "engine"),
                   "run_vs_plain_1": compare(places, "plain", "run"),
                   "wrap_run_vs_engine_ddp_2": compare(places, "engine_ddp", "run_wrap")},
        "components": components,
        "target": ">= 0.97x by CPU time per step",
    }
    for name, r in data["ratios"].items():
        cpu = r["process_us"]
        print(f"{name:28s} CPU fastest {cpu['fastest']:.3f}, paired median {cpu['paired_median']:.3f}; "
              f"wall paired median {r['wall_us']['paired_median']:.3f}")
    for kind, c in components.items():
        print(f"{kind}: " + ", ".join(f"{k} {v['us']:.1f} us" for k, v in c["components"].items())
              + f" (meter {c['meter_us_per_step']:.1f} us a step)")
    save("step_cost", data, args.json)
    return data


if __name__ == "__main__":
    main()
