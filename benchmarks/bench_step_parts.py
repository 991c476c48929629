"""Benchmark of the per-step time breakdown (issue 16): training throughput with it on vs off.

The breakdown costs a few clock reads per step on the training thread (a mark at the first
gradient hook, at the end of backward, at the optimizer's pre- and post-step hooks, and around
each collective and ``log()`` call, which were timed before).  ``PHALANX_STEP_PARTS=0`` on the
engines turns the marks off; collectives and ``log()`` keep their own timing either way.

Runs come in interleaved pairs (on/off, then off/on, ...), so drift on a shared machine hits
both modes alike; the figure is the median of the paired ratios on/off, with their spread (min,
max, quartiles).  Throughput is measured on the engines: optimizer steps per second between a
rank's first and last logged step (engine timestamps).  Target: >= 0.99x.

    python benchmarks/bench_step_parts.py [--json OUT] [--quick]
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics

from _common import RESULTS, engine_steps_per_s, machine, parse_args, save, stats
from phalanx._session import Session
from phalanx.fit import FitOptions

# The same short-step loop as the memory-sampling benchmark (a small MLP, a few ms a step).
from bench_inside import BODY  # noqa: E402


def _set_parts(value: str) -> None:  # runs on each engine
    import os

    os.environ["PHALANX_STEP_PARTS"] = value


def one_run(session: Session, steps: int, parts_on: bool) -> float:
    """Steps per second per rank (mean of the ranks) of one run."""
    session.cluster.view().apply_sync(_set_parts, "1" if parts_on else "0")
    opts = FitOptions.build(widget=False, name="bench-step-parts")
    with contextlib.redirect_stdout(io.StringIO()):
        record = session.distributed_fit(BODY, opts, {"STEPS": steps})
    if parts_on != bool(record.timing.get(0, {}).get("steps")):
        raise RuntimeError(f"the breakdown was {'off' if parts_on else 'on'} in a run meant "
                           f"to have it {'on' if parts_on else 'off'}")
    return engine_steps_per_s(record)


def paired(session: Session, steps: int, pairs: int) -> dict:
    on, off = [], []
    for i in range(pairs):
        for parts_on in ((True, False) if i % 2 == 0 else (False, True)):
            (on if parts_on else off).append(one_run(session, steps, parts_on))
        print(f"  pair {i + 1}/{pairs}: on {on[-1]:.0f}, off {off[-1]:.0f} steps/s per rank",
              flush=True)
    ratios = [a / b for a, b in zip(on, off)]
    return {"steps_per_run": steps, "pairs": pairs, "on_steps_per_s_per_rank": stats(on),
            "off_steps_per_s_per_rank": stats(off), "paired_ratio": stats(ratios),
            "paired_ratio_iqr": _quartiles(ratios), "target_ratio": 0.99}


def in_process(steps: int, pairs: int) -> dict:
    """The same loop in this process with the clock's calls where the runtime makes them (on),
    or with a clock whose parts are off (the calls return at once, as on an engine with
    ``PHALANX_STEP_PARTS=0``): the breakdown's own cost without the cluster's noise."""
    import time

    import torch

    from phalanx.runtime.telemetry._timing import StepClock

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X, y = torch.randn(256, 64), torch.randn(256, 1)

    def rate(parts_on: bool) -> float:
        clock = StepClock()
        clock.parts_enabled = parts_on
        clock.begin()
        began = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            loss = ((model(X) - y) ** 2).mean()
            clock.mark("backward_s")     # the first gradient hook
            loss.backward()
            clock.mark("other_s")        # the end of backward
            clock.mark("optimizer_s")    # the optimizer's pre-step hook
            opt.step()
            clock.step_end()             # its post-step hook
        return steps / (time.perf_counter() - began)

    rate(True), rate(False)  # warm
    on, off = [], []
    for i in range(pairs):
        for parts_on in ((True, False) if i % 2 == 0 else (False, True)):
            (on if parts_on else off).append(rate(parts_on))
    ratios = [a / b for a, b in zip(on, off)]
    return {"steps_per_run": steps, "pairs": pairs, "on_steps_per_s": stats(on),
            "off_steps_per_s": stats(off), "paired_ratio": stats(ratios),
            "paired_ratio_iqr": _quartiles(ratios)}


def clock_cost(calls: int = 200_000) -> dict:
    """The clock's own cost per step, measured alone (no training around it): the calls one
    step makes (three marks and a step end), on vs off, best of 5 rounds."""
    import time

    from phalanx.runtime.telemetry._timing import StepClock

    def per_step(parts_on: bool) -> float:
        clock = StepClock()
        clock.parts_enabled = parts_on
        clock.begin()
        began = time.perf_counter()
        for _ in range(calls):
            clock.mark("backward_s")
            clock.mark("other_s")
            clock.mark("optimizer_s")
            clock.step_end()
        return (time.perf_counter() - began) / calls

    on = min(per_step(True) for _ in range(5))
    off = min(per_step(False) for _ in range(5))
    return {"on_us_per_step": on * 1e6, "off_us_per_step": off * 1e6,
            "added_us_per_step": (on - off) * 1e6}


def _quartiles(values: list[float]) -> list[float]:
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return [q1, q3]


def summary(p: dict, local: dict) -> list[dict]:
    r, lr = p["paired_ratio"], local["paired_ratio"]
    return [{"name": "training with the step-time breakdown vs off (median of paired ratios)",
             "value": r["median"], "target": ">= 0.99x", "met": r["median"] >= 0.99,
             "detail": f"2 engines, {p['pairs']} pairs, spread {r['min']:.3f}-{r['max']:.3f} (IQR "
                       f"{p['paired_ratio_iqr'][0]:.3f}-{p['paired_ratio_iqr'][1]:.3f}); off "
                       f"{p['off_steps_per_s_per_rank']['median']:.0f} steps/s per rank"},
            {"name": "the clock's added time per step vs this loop's step (one process)",
             "value": local["cost_ratio"], "target": ">= 0.99x", "met": local["cost_ratio"] >= 0.99,
             "detail": f"{local['clock']['added_us_per_step']:.1f} us added per step; the loop's step "
                       f"{1e3 / local['off_steps_per_s']['median']:.2f} ms"},
            {"name": "the same loop in one process, the clock's calls on vs off", "value": lr["median"],
             "target": ">= 0.99x", "met": lr["median"] >= 0.99,
             "detail": f"{local['pairs']} pairs, spread {lr['min']:.3f}-{lr['max']:.3f} (IQR "
                       f"{local['paired_ratio_iqr'][0]:.3f}-{local['paired_ratio_iqr'][1]:.3f}); "
                       f"off {local['off_steps_per_s']['median']:.0f} steps/s"}]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    steps, pairs = (100, 5) if args.quick else (1000, 10)
    local_pairs = 6 if args.quick else 20
    print(f"in one process: {local_pairs} interleaved pairs", flush=True)
    local = in_process(steps, local_pairs)
    local["clock"] = clock_cost()
    # What the clock adds per step against this loop's own step time (off): a ratio free of
    # the run-to-run noise of a shared machine.
    step_us = 1e6 / local["off_steps_per_s"]["median"]
    local["cost_ratio"] = step_us / (step_us + local["clock"]["added_us_per_step"])
    session = Session()
    session.start_cluster(n=2, gpus="none")
    try:
        one_run(session, 100, True)  # warm: imports, process group
        print(f"step parts: {pairs} interleaved pairs, {steps} steps per rank", flush=True)
        result = paired(session, steps, pairs)
    finally:
        session.stop_cluster()
        session.close()
    data = {"load_avg_1m": os.getloadavg()[0], "step_parts": result, "in_process": local,
            "summary": summary(result, local)}
    path = save("step_parts", data, args.json or str(RESULTS / "step-parts.json"))
    print({"machine": machine()["kind"], "results": str(path),
           "paired_ratio_median": round(result["paired_ratio"]["median"], 3),
           "in_process_median": round(local["paired_ratio"]["median"], 4),
           "clock_us_per_step": round(local["clock"]["added_us_per_step"], 2),
           "cost_ratio": round(local["cost_ratio"], 5),
           "spread": [round(result["paired_ratio"]["min"], 3), round(result["paired_ratio"]["max"], 3)]})
    return data


if __name__ == "__main__":
    main()
