"""Gradient boosting on the warm engines (issue 46): XGBoost's ``xgb.train`` in a
``%%distributed_fit --shard X,y`` cell on 2 engines (phalanx sets up XGBoost's own collective),
against the same training in one process and against ``xgboost.dask`` on a dask
``LocalCluster`` of the same size (2 worker processes, 1 thread each), same data, same rounds,
same parameters (``hist``).

The figure of each is boosting rounds per second of the ``train`` call alone: data generation,
``DMatrix``/``DaskDMatrix`` construction, imports and the cluster's start stay out, the same way
for all three.  One process is measured twice: with one thread (what one engine has) and with
two (the whole 2-core machine, which the two engines share).  Each rank and each dask worker
uses one thread (``nthread=1``).

Pairs alternate which side goes first, so a slow moment of a shared machine hits all; a ratio
is the median of the pairs' own ratios, with their spread.  LightGBM's ``lgb.train`` in a cell
is measured the same way against one process (one thread) where lightgbm is installed.

    python benchmarks/bench_boosting.py [--json OUT] [--quick]
"""

from __future__ import annotations

import ast
import time
from typing import Any

import numpy as np

from _common import paired, parse_args, save, stats

PAIRS, QUICK_PAIRS = 5, 2
ROWS, QUICK_ROWS = 200_000, 40_000
ROUNDS, QUICK_ROUNDS = 50, 20
FEATURES = 20
PARAMS = {"tree_method": "hist", "max_depth": 6, "eta": 0.1, "seed": 0, "nthread": 1}
LGB_PARAMS = {"objective": "regression", "num_leaves": 63, "learning_rate": 0.1, "seed": 0,
              "num_threads": 1, "verbose": -1}

CELL = """%%distributed_fit --shard X,y --return figure --no-widget
import time
import xgboost as xgb
dtrain = xgb.DMatrix(X, label=y)
started = time.perf_counter()
xgb.train(PARAMS, dtrain, ROUNDS)
figure = ROUNDS / (time.perf_counter() - started)
"""
LGB_CELL = """%%distributed_fit --shard X,y --return figure --no-widget
import time
import lightgbm as lgb
dtrain = lgb.Dataset(X, label=y, free_raw_data=False).construct()
started = time.perf_counter()
lgb.train(LGB_PARAMS, dtrain, ROUNDS)
figure = ROUNDS / (time.perf_counter() - started)
"""


def data(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.5 * X[:, 3] + 0.1 * rng.normal(size=rows))
    return X, y.astype(np.float32)


def one_process(X: np.ndarray, y: np.ndarray, rounds: int, threads: int) -> float:
    import xgboost as xgb

    dtrain = xgb.DMatrix(X, label=y, nthread=threads)
    started = time.perf_counter()
    xgb.train({**PARAMS, "nthread": threads}, dtrain, rounds)
    return rounds / (time.perf_counter() - started)


def one_process_lightgbm(X: np.ndarray, y: np.ndarray, rounds: int) -> float:
    import lightgbm as lgb

    dtrain = lgb.Dataset(X, label=y, free_raw_data=False).construct()
    started = time.perf_counter()
    lgb.train(LGB_PARAMS, dtrain, rounds)
    return rounds / (time.perf_counter() - started)


class DaskSide:
    """``xgboost.dask`` on a LocalCluster of 2 single-threaded worker processes."""

    def __init__(self, X: np.ndarray, y: np.ndarray) -> None:
        from dask import array as da
        from distributed import Client, LocalCluster

        self.cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                    dashboard_address=None, host="127.0.0.1")
        self.client = Client(self.cluster)
        half = (len(X) + 1) // 2
        self.X = da.from_array(X, chunks=(half, FEATURES)).persist()
        self.y = da.from_array(y, chunks=half).persist()

    def run(self, rounds: int) -> float:
        import xgboost.dask as dxgb

        dtrain = dxgb.DaskDMatrix(self.client, self.X, self.y)
        started = time.perf_counter()
        dxgb.train(self.client, PARAMS, dtrain, rounds)
        return rounds / (time.perf_counter() - started)

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


class MagicSide:
    """The training as a ``%%distributed_fit`` cell in a real kernel with 2 warm engines."""

    def __init__(self, X: np.ndarray, y: np.ndarray, rounds: int) -> None:
        from _kernel import ClusterKernel

        self.cluster = ClusterKernel(2)
        self.notebook = self.cluster.notebook
        try:
            # the data reaches the kernel once, as a notebook's would: generated there
            self.notebook.run(f"import numpy as np\nROUNDS = {rounds}\nPARAMS = {PARAMS!r}\n"
                              f"LGB_PARAMS = {LGB_PARAMS!r}\n"
                              f"rng = np.random.default_rng(0)\n"
                              f"X = rng.normal(size=({len(X)}, {FEATURES})).astype(np.float32)\n"
                              f"y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.5 * X[:, 3] "
                              f"+ 0.1 * rng.normal(size={len(X)})).astype(np.float32)\n")
        except BaseException:
            self.close()
            raise

    def run(self, cell: str = CELL) -> float:
        return float(ast.literal_eval(self.notebook.evaluate(cell, "figure", timeout=600)))

    def close(self) -> None:
        self.cluster.close()



def measure(pairs: int, rows: int, rounds: int) -> dict[str, Any]:
    X, y = data(rows)
    have_lightgbm = _importable("lightgbm")
    series: dict[str, list[float]] = {k: [] for k in (
        "phalanx", "one_thread", "two_threads", "dask", "lgb_phalanx", "lgb_one_thread")}
    magic = MagicSide(X, y, rounds)
    dask = DaskSide(X, y)
    try:
        magic.run()                       # warm: the engines import xgboost, the first round
        dask.run(2)
        if have_lightgbm:
            magic.run(LGB_CELL)
        print(f"warm; {pairs} pairs", flush=True)
        for i in range(pairs):
            sides = ["phalanx", "alone", "dask"]
            for side in sides if i % 2 == 0 else list(reversed(sides)):
                if side == "phalanx":
                    series["phalanx"].append(magic.run())
                    if have_lightgbm:
                        series["lgb_phalanx"].append(magic.run(LGB_CELL))
                elif side == "alone":
                    series["one_thread"].append(one_process(X, y, rounds, 1))
                    series["two_threads"].append(one_process(X, y, rounds, 2))
                    if have_lightgbm:
                        series["lgb_one_thread"].append(one_process_lightgbm(X, y, rounds))
                else:
                    series["dask"].append(dask.run(rounds))
            print(f"pair {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in series.items() if v),
                  flush=True)
    finally:
        dask.close()
        magic.close()
    out: dict[str, Any] = {"rounds_per_s": {k: stats(v) for k, v in series.items() if v},
                           "phalanx_vs_one_thread": paired(series["phalanx"], series["one_thread"]),
                           "phalanx_vs_two_threads": paired(series["phalanx"], series["two_threads"]),
                           "phalanx_vs_xgboost_dask": paired(series["phalanx"], series["dask"])}
    if have_lightgbm:
        out["lightgbm_phalanx_vs_one_thread"] = paired(series["lgb_phalanx"],
                                                       series["lgb_one_thread"])
    return out


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    started = time.perf_counter()
    pairs = QUICK_PAIRS if args.quick else PAIRS
    rows, rounds = (QUICK_ROWS, QUICK_ROUNDS) if args.quick else (ROWS, ROUNDS)
    data_ = measure(pairs, rows, rounds)
    data_.update(pairs=pairs, rows=rows, rounds=rounds, features=FEATURES, params=PARAMS,
                 measured_s=time.perf_counter() - started)
    for key in ("phalanx_vs_one_thread", "phalanx_vs_two_threads", "phalanx_vs_xgboost_dask",
                "lightgbm_phalanx_vs_one_thread"):
        if key in data_:
            r = data_[key]
            print(f"{key:32s} {r['ratio']:.2f}x (pairs {r['min']:.2f}-{r['max']:.2f})")
    save("boosting", data_, args.json)
    return data_


if __name__ == "__main__":
    main()
