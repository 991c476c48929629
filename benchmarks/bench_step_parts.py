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

from _common import RESULTS, machine, parse_args, save, stats
from phalanx._session import Session
from phalanx.fit import FitOptions

# A loop whose step is short (about a millisecond), so a per-step cost would show.
BODY = """
import torch
from phalanx import log
torch.manual_seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
X, y = torch.randn(64, 32), torch.randn(64, 1)
for step in range(STEPS):
    opt.zero_grad()
    loss = ((model(X) - y) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item())
"""


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
    rows = record.history.rows()
    rates = []
    for rank in range(record.world_size):
        times = sorted(r["t"] for r in rows if r["rank"] == rank)
        rates.append((len(times) - 1) / (times[-1] - times[0]))
    return statistics.mean(rates)


def paired(session: Session, steps: int, pairs: int) -> dict:
    on, off = [], []
    for i in range(pairs):
        for parts_on in ((True, False) if i % 2 == 0 else (False, True)):
            (on if parts_on else off).append(one_run(session, steps, parts_on))
        print(f"  pair {i + 1}/{pairs}: on {on[-1]:.0f}, off {off[-1]:.0f} steps/s per rank",
              flush=True)
    ratios = [a / b for a, b in zip(on, off)]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return {"steps_per_run": steps, "pairs": pairs, "on_steps_per_s_per_rank": stats(on),
            "off_steps_per_s_per_rank": stats(off), "paired_ratio": stats(ratios),
            "paired_ratio_iqr": [q1, q3], "target_ratio": 0.99}


def summary(p: dict) -> list[dict]:
    r = p["paired_ratio"]
    return [{"name": "training with the step-time breakdown vs off (median of paired ratios)",
             "value": r["median"], "target": ">= 0.99x", "met": r["median"] >= 0.99,
             "detail": f"{p['pairs']} pairs, spread {r['min']:.3f}-{r['max']:.3f} (IQR "
                       f"{p['paired_ratio_iqr'][0]:.3f}-{p['paired_ratio_iqr'][1]:.3f}); off "
                       f"{p['off_steps_per_s_per_rank']['median']:.0f} steps/s per rank"}]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    steps, pairs = (300, 6) if args.quick else (1000, 10)
    session = Session()
    session.start_cluster(n=2, gpus="none")
    try:
        one_run(session, 100, True)  # warm: imports, process group
        print(f"step parts: {pairs} interleaved pairs, {steps} steps per rank", flush=True)
        result = paired(session, steps, pairs)
    finally:
        session.stop_cluster()
        session.close()
    data = {"load_avg_1m": os.getloadavg()[0], "step_parts": result, "summary": summary(result)}
    path = save("step_parts", data, args.json or str(RESULTS / "step-parts.json"))
    print({"machine": machine()["kind"], "results": str(path),
           "paired_ratio_median": round(result["paired_ratio"]["median"], 3),
           "spread": [round(result["paired_ratio"]["min"], 3), round(result["paired_ratio"]["max"], 3)]})
    return data


if __name__ == "__main__":
    main()
