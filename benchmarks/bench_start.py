"""Cluster start and stop: `%cluster start -n 2` until a first %%distributed_fit cell has run,
against a bare `ipyparallel.Cluster(n=2).start_and_connect_sync()` until a first task has run;
then each one's stop, until every process is gone.  phalanx is measured with its engines forked
from the fork server (the default) and with separately started engines (PHALANX_FORK_SERVER=0);
the first cell runs an optimizer step, which is where torch's imports are felt; then one rank is
restarted (as after a fault) and the cell runs again; then the cluster is stopped and started
again in the same kernel (the fork server is kept for it) until the cell has run once more.

    python benchmarks/bench_start.py [--json OUT] [--quick]
"""

from __future__ import annotations

import time

from _common import parse_args, save, stats


def bare_ipyparallel() -> tuple[float, float]:
    import ipyparallel as ipp

    started = time.perf_counter()
    cluster = ipp.Cluster(n=2, log_level=40)
    client = cluster.start_and_connect_sync()
    client[:].apply_sync(lambda: 1)
    elapsed = time.perf_counter() - started
    client.close()
    stopping = time.perf_counter()
    cluster.stop_cluster_sync()
    return elapsed, time.perf_counter() - stopping


FIRST_CELL = """
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(2, 4)).sum().backward()
opt.step()
"""


def phalanx_start(fork_server: bool = True) -> tuple[float, float, float, float, float]:
    import os

    from phalanx._session import Session
    from phalanx.fit import FitOptions

    os.environ["PHALANX_FORK_SERVER"] = "1" if fork_server else "0"
    started = time.perf_counter()
    session = Session()
    session.start_cluster(n=2, gpus="none")
    ready = time.perf_counter() - started
    session.distributed_fit(FIRST_CELL, FitOptions.build(widget=False), {})
    first_cell = time.perf_counter() - started
    restarting = time.perf_counter()  # what a rank lost to a fault costs to bring back
    session.restart(1)
    session.distributed_fit(FIRST_CELL, FitOptions.build(widget=False), {})
    restart = time.perf_counter() - restarting
    stopping = time.perf_counter()
    session.stop_cluster()  # returns once every engine and the controller are gone
    stopped = time.perf_counter() - stopping
    again = time.perf_counter()  # a stop and start, as when changing the engine count
    session.start_cluster(n=2, gpus="none")
    session.distributed_fit(FIRST_CELL, FitOptions.build(widget=False), {})
    second = time.perf_counter() - again
    session.close()
    return ready, first_cell, restart, stopped, second


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    repeats = 3 if args.quick else 5
    runs: dict[str, list[float]] = {k: [] for k in (
        "bare", "bare_stop", "ready", "first", "restart", "stop", "second",
        "fresh_ready", "fresh_first", "fresh_restart", "fresh_stop", "fresh_second")}
    for _ in range(repeats):  # interleaved, so that a slower spell of the machine hits all three
        b, bs = bare_ipyparallel()
        runs["bare"].append(b)
        runs["bare_stop"].append(bs)
        for prefix, forked in (("", True), ("fresh_", False)):
            r, f, rs, s, again = phalanx_start(fork_server=forked)
            runs[prefix + "ready"].append(r)
            runs[prefix + "first"].append(f)
            runs[prefix + "restart"].append(rs)
            runs[prefix + "stop"].append(s)
            runs[prefix + "second"].append(again)
    med = {k: stats(v)["median"] for k, v in runs.items()}
    data = {"bare_ipyparallel_s": stats(runs["bare"]), "phalanx_ready_s": stats(runs["ready"]),
            "phalanx_first_cell_s": stats(runs["first"]),
            "bare_ipyparallel_stop_s": stats(runs["bare_stop"]),
            "phalanx_stop_s": stats(runs["stop"]),
            "fresh_engines_ready_s": stats(runs["fresh_ready"]),
            "fresh_engines_first_cell_s": stats(runs["fresh_first"]),
            "phalanx_restart_to_cell_s": stats(runs["restart"]),
            "fresh_engines_restart_to_cell_s": stats(runs["fresh_restart"]),
            "phalanx_second_start_to_cell_s": stats(runs["second"]),
            "fresh_engines_second_start_to_cell_s": stats(runs["fresh_second"]),
            "ratio_restart_fresh_vs_forked": med["fresh_restart"] / med["restart"],
            "ratio_second_start_fresh_vs_forked": med["fresh_second"] / med["second"],
            "ratio_ready_vs_bare": med["bare"] / med["ready"],
            "ratio_first_cell_vs_bare": med["bare"] / med["first"],
            "ratio_first_cell_fresh_vs_forked": med["fresh_first"] / med["first"],
            "ratio_stop_vs_bare": med["bare_stop"] / med["stop"]}
    for key in ("bare_ipyparallel_s", "phalanx_ready_s", "phalanx_first_cell_s",
                "fresh_engines_ready_s", "fresh_engines_first_cell_s",
                "phalanx_restart_to_cell_s", "fresh_engines_restart_to_cell_s",
                "phalanx_second_start_to_cell_s", "fresh_engines_second_start_to_cell_s",
                "bare_ipyparallel_stop_s", "phalanx_stop_s"):
        s = data[key]
        print(f"{key:28s} {s['median']:6.2f} s (min {s['min']:.2f}, max {s['max']:.2f})")
    save("cluster_start", data, args.json)
    return data


if __name__ == "__main__":
    main()
