"""Cluster start and stop: `%cluster start -n 2` until a first %%distributed_fit cell has run,
against a bare `ipyparallel.Cluster(n=2).start_and_connect_sync()` until a first task has run;
then each one's stop, until every process is gone.

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


def phalanx_start() -> tuple[float, float, float]:
    from phalanx._session import Session
    from phalanx.fit import FitOptions

    started = time.perf_counter()
    session = Session()
    session.start_cluster(n=2, gpus="none")
    ready = time.perf_counter() - started
    ns = {"allreduce": __import__("phalanx").allreduce}
    session.distributed_fit("allreduce(1.0)", FitOptions.build(widget=False), ns)
    first_cell = time.perf_counter() - started
    stopping = time.perf_counter()
    session.stop_cluster()  # returns once every engine and the controller are gone
    stopped = time.perf_counter() - stopping
    session.close()
    return ready, first_cell, stopped


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    repeats = 3 if args.quick else 5
    bare, bare_stop, ready, first, stop = [], [], [], [], []
    for _ in range(repeats):
        b, bs = bare_ipyparallel()
        bare.append(b)
        bare_stop.append(bs)
        r, f, s = phalanx_start()
        ready.append(r)
        first.append(f)
        stop.append(s)
    data = {"bare_ipyparallel_s": stats(bare), "phalanx_ready_s": stats(ready),
            "phalanx_first_cell_s": stats(first),
            "bare_ipyparallel_stop_s": stats(bare_stop), "phalanx_stop_s": stats(stop),
            "ratio_ready_vs_bare": stats(bare)["median"] / stats(ready)["median"],
            "ratio_first_cell_vs_bare": stats(bare)["median"] / stats(first)["median"],
            "ratio_stop_vs_bare": stats(bare_stop)["median"] / stats(stop)["median"]}
    for key in ("bare_ipyparallel_s", "phalanx_ready_s", "phalanx_first_cell_s",
                "bare_ipyparallel_stop_s", "phalanx_stop_s"):
        s = data[key]
        print(f"{key:22s} {s['median']:6.2f} s (min {s['min']:.2f}, max {s['max']:.2f})")
    save("cluster_start", data, args.json)
    return data


if __name__ == "__main__":
    main()
