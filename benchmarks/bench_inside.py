"""Benchmarks for seeing inside a run (issue 16), on a real 2-engine cluster through the Session API.

1. Training throughput with the engines' memory sampling on (about once a second, the default)
   against the same runs with it off.  Runs alternate between the two so drift on a shared
   machine hits both alike.  Target: on / off >= 0.99 (median of 5 runs each, with min and max).
2. ``--profile 5`` overhead, reported (not bounded): the whole run's wall time with and without
   the flag (recording, trace export, the transfer and the merge included), and within one
   profiled run the time of a profiled step against an unprofiled one; plus the trace's size.

Throughput is measured on the engines: optimizer steps per second between a rank's first and
last logged step (by their engine timestamps), so the figure is the loop's own rate.

    python benchmarks/bench_inside.py [--json OUT] [--quick]
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import tempfile

from _common import engine_steps_per_s, machine, parse_args, save, stats
from phalanx._session import Session
from phalanx.fit import FitOptions

REPEATS = 5
PROFILED = 5

# A small MLP, an optimizer step and a log() per iteration: a loop whose step is short enough
# (a few ms) that a per-step cost would show.
BODY = """
import torch
from phalanx import log
torch.manual_seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
X, y = torch.randn(256, 64), torch.randn(256, 1)
for step in range(STEPS):
    opt.zero_grad()
    loss = ((model(X) - y) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item())
"""


def one_run(session: Session, steps: int, sampling: bool, profile: int | None = None) -> dict:
    session.fits.memory_interval_s = 1.0 if sampling else 0.0
    opts = FitOptions.build(widget=False, profile=profile, name="bench-inside")
    with contextlib.redirect_stdout(io.StringIO()):
        record = session.distributed_fit(BODY, opts, {"STEPS": steps})
    rows = record.history.rows()
    profiled, plain = [], []
    for rank in range(record.world_size):
        times = sorted(r["t"] for r in rows if r["rank"] == rank)
        gaps = [b - a for a, b in zip(times, times[1:])]  # gap i ends at step i + 2
        profiled += gaps[:PROFILED - 1]                  # steps 2..5 ran under the profiler
        plain += gaps[PROFILED + 1:]                     # from step 7 on it had stopped
    out = {"steps_per_s_per_rank": engine_steps_per_s(record), "wall_s": record.wall_s,
           "peak_rss_mb": {r: m.get("rss_mb") for r, m in record.memory.items()}}
    if record.profile is not None:
        out.update(trace_bytes=os.path.getsize(record.profile.path),
                   profiled_step_s=statistics.median(profiled), plain_step_s=statistics.median(plain))
    return out


def sampling_throughput(session: Session, steps: int) -> dict:
    on, off = [], []
    for i in range(REPEATS):
        for sampling in ((True, False) if i % 2 == 0 else (False, True)):
            (on if sampling else off).append(one_run(session, steps, sampling)["steps_per_s_per_rank"])
        print(f"  run {i + 1}/{REPEATS}: sampling on {on[-1]:.0f}, off {off[-1]:.0f} steps/s per rank",
              flush=True)
    return {"steps_per_run": steps, "on_steps_per_s_per_rank": stats(on),
            "off_steps_per_s_per_rank": stats(off),
            "ratio_of_medians": statistics.median(on) / statistics.median(off),
            "paired_ratio": stats([a / b for a, b in zip(on, off)]), "target_ratio": 0.99}


def profile_overhead(session: Session, steps: int) -> dict:
    with_profile, without = [], []
    for i in range(REPEATS):
        for profiled in ((True, False) if i % 2 == 0 else (False, True)):
            run = one_run(session, steps, True, PROFILED if profiled else None)
            (with_profile if profiled else without).append(run)
    walls_on = [r["wall_s"] for r in with_profile]
    walls_off = [r["wall_s"] for r in without]
    step_ratio = [r["profiled_step_s"] / r["plain_step_s"] for r in with_profile]
    return {"profiled_steps": PROFILED, "steps_per_run": steps,
            "wall_s_with_profile": stats(walls_on), "wall_s_without": stats(walls_off),
            "wall_ratio": statistics.median(walls_on) / statistics.median(walls_off),
            "profiled_step_vs_plain_step": stats(step_ratio),
            "trace_bytes": stats([r["trace_bytes"] for r in with_profile])}


def summary(s: dict, p: dict) -> list[dict]:
    return [
        {"name": "training with memory sampling (1 Hz) vs off", "value": s["ratio_of_medians"],
         "target": ">= 0.99x", "met": s["ratio_of_medians"] >= 0.99,
         "detail": f"paired median {s['paired_ratio']['median']:.3f}; "
                   f"off {s['off_steps_per_s_per_rank']['median']:.0f} steps/s per rank"},
        {"name": f"--profile {PROFILED}: run wall time vs without", "value": p["wall_ratio"],
         "target": "reported", "met": None,
         "detail": f"{p['wall_s_with_profile']['median']:.2f} s vs {p['wall_s_without']['median']:.2f} s, "
                   f"{p['steps_per_run']} steps; trace {p['trace_bytes']['median'] / 1e6:.1f} MB"},
        {"name": "--profile: a profiled step vs an unprofiled one", "target": "reported", "met": None,
         "value": p["profiled_step_vs_plain_step"]["median"], "detail": "same run, engine timestamps"},
    ]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    steps = 100 if args.quick else 1000
    session = Session()
    session.start_cluster(n=2, gpus="none")
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as traces:
        os.chdir(traces)  # where --profile writes its trace (the notebook's directory in use)
        try:
            one_run(session, 100, True)  # warm: imports, process group
            print(f"memory sampling: {REPEATS} runs per mode, {steps} steps per rank", flush=True)
            sampling = sampling_throughput(session, steps)
            print("--profile overhead", flush=True)
            profile = profile_overhead(session, steps // 2)
        finally:
            os.chdir(here)
            session.stop_cluster()
            session.close()
    data = {"load_avg_1m": os.getloadavg()[0], "memory_sampling": sampling,
            "profile": profile, "summary": summary(sampling, profile)}
    path = save("inside", data, args.json)
    print({"machine": machine()["kind"], "results": str(path),
           "sampling_ratio": round(sampling["ratio_of_medians"], 3),
           "profile_wall_ratio": round(profile["wall_ratio"], 3),
           "profiled_step_vs_plain": round(profile["profiled_step_vs_plain_step"]["median"], 2)})
    return data


if __name__ == "__main__":
    main()
