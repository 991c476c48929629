"""Benchmarks for learning networks (issue 6).

1. Refit after changing one leaf estimator, against: the same network refitted from scratch,
   an equivalent scikit-learn Pipeline(StandardScaler, PCA, VotingRegressor(Ridge, tree))
   refitted after the same change, and that leaf's own fit time (target: within 1.1x).
2. Two independent branches of equal cost fitted on a 2-engine ipyparallel cluster through
   dask, against the same fit done serially in the kernel (target: <= 0.6x).

Every figure is the median of ``--repeats`` runs (at least 5), with min and max.  Variants
are timed round-robin so they see the same machine load; ``_paired`` ratios are medians of
per-round ratios, and ``_cpu`` ratios use the kernel process's CPU time, which contention on a
shared machine leaves mostly alone (in-kernel comparisons only).

What a leaf refit costs beyond the leaf is mostly hashing the sources (how in-place mutation
is detected): sha1 by default, several times less with the optional ``xxhash`` package.

    python benchmarks/bench_network.py --json OUT.json [--repeats 5] [--no-cluster]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

KERNEL_EXT = Path(__file__).resolve().parents[1] / "kernel_ext"
sys.path.insert(0, str(KERNEL_EXT))

import numpy as np  # noqa: E402
import sklearn  # noqa: E402
from phalanx.network import machine, node, source, stop_dask  # noqa: E402
from sklearn.datasets import make_regression  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402
from sklearn.ensemble import GradientBoostingRegressor, VotingRegressor  # noqa: E402
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.tree import DecisionTreeRegressor  # noqa: E402


def summary(runs: list[float], cpu: list[float]) -> dict:
    """Median, min and max of wall times (and the kernel process's CPU times), with the runs."""
    return {"median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs),
            "runs": runs, "cpu_median_s": statistics.median(cpu), "cpu_runs": cpu}


def interleaved(cases: dict, repeats: int) -> dict:
    """Time each case ``repeats`` times, round-robin, so all see the same machine load.

    ``cases`` maps a name to ``fn`` or ``(fn, setup)``; ``setup()`` runs untimed before ``fn()``.
    """
    runs: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, case in cases.items():
            fn, setup = case if isinstance(case, tuple) else (case, None)
            if setup is not None:
                setup()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            runs[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return {name: summary(runs[name], cpu[name]) for name in cases}


def paired_ratio(results: dict, num: str, den: str, key: str = "runs") -> float:
    """Median over rounds of ``num / den``, each pair measured in the same round."""
    pairs = zip(results[num][key], results[den][key], strict=True)
    return statistics.median(a / b for a, b in pairs)


def blend(a, b):
    return 0.5 * a + 0.5 * b


# --- 1. refit after one leaf change -----------------------------------------------------------

def bench_leaf_refit(repeats: int, n_samples: int) -> dict:
    # An upstream that costs something (scaling and a full-SVD PCA of 150 features) and a
    # cheaper leaf: the case where retraining only the leaf pays.
    Xd, yd = make_regression(n_samples=n_samples, n_features=150, n_informative=30, noise=5.0,
                             random_state=0)
    X, y = source(Xd, name="X"), source(yd, name="y")
    stand = machine(StandardScaler(), X, name="stand")
    W = stand.transform(X)
    pca = machine(PCA(10, svd_solver="full"), W, name="pca")
    Z = pca.transform(W)
    ridge = machine(Ridge(), Z, y, name="ridge")
    tree = machine(DecisionTreeRegressor(max_depth=8, random_state=0), Z, y, name="tree")
    yhat = node(blend, ridge.predict(Z), tree.predict(Z), name="yhat")
    yhat.fit()
    depths = iter(range(10**6))

    def change_leaf():
        # A different depth each run, so every timed fit really has a change to act on.
        tree.model.set_params(max_depth=9 - next(depths) % 2)

    def network_leaf():
        assert yhat.fit().actions == {"stand": "skip", "pca": "skip", "ridge": "skip",
                                      "tree": "fit"}

    Zd = PCA(10, svd_solver="full").fit_transform(StandardScaler().fit_transform(Xd))
    own_depths = iter(range(10**6))

    def leaf_own():
        DecisionTreeRegressor(max_depth=9 - next(own_depths) % 2, random_state=0).fit(Zd, yd)

    pipe = make_pipeline(StandardScaler(), PCA(10, svd_solver="full"), VotingRegressor(
        [("ridge", Ridge()), ("tree", DecisionTreeRegressor(max_depth=8, random_state=0))]))
    pipe.fit(Xd, yd)
    pipe_depths = iter(range(10**6))

    def sklearn_refit():
        pipe.set_params(votingregressor__tree__max_depth=9 - next(pipe_depths) % 2)
        pipe.fit(Xd, yd)

    results = interleaved({
        "leaf_own_fit": leaf_own,
        "network_refit_one_leaf": (network_leaf, change_leaf),
        "network_full_refit": lambda: yhat.fit(force=True),
        "sklearn_pipeline_refit": sklearn_refit,
    }, repeats)
    # Same model, same predictions: the comparison is fair.
    tree.model.set_params(max_depth=8)
    yhat.fit()
    pipe.set_params(votingregressor__tree__max_depth=8).fit(Xd, yd)
    np.testing.assert_allclose(yhat(), pipe.predict(Xd), rtol=1e-6, atol=1e-6)
    return results


# --- 2. two branches on two engines -----------------------------------------------------------

def _add_path(path):
    import sys as engine_sys

    if path not in engine_sys.path:
        engine_sys.path.insert(0, path)


def bench_branches(repeats: int, n_samples: int) -> dict:
    import ipyparallel as ipp

    Xd, yd = make_regression(n_samples=n_samples, n_features=20, noise=5.0, random_state=1)
    X, y = source(Xd, name="X"), source(yd, name="y")
    a = machine(GradientBoostingRegressor(n_estimators=60, random_state=0), X, y, name="a")
    b = machine(GradientBoostingRegressor(n_estimators=60, random_state=1), X, y, name="b")
    yhat = node(blend, a.predict(X), b.predict(X), name="yhat")
    cluster = ipp.Cluster(n=2, controller_ip="127.0.0.1", log_level=logging.WARNING)
    rc = cluster.start_and_connect_sync(activate=False)
    try:
        rc.wait_for_engines(2, timeout=120)
        rc[:].apply_sync(_add_path, str(KERNEL_EXT))
        t0 = time.perf_counter()
        yhat.fit(cluster=rc)                      # starts dask on the engines (cached after)
        first_fit = time.perf_counter() - t0
        results = interleaved({
            "serial_two_branches": lambda: yhat.fit(force=True),
            "cluster_two_branches": lambda: yhat.fit(force=True, cluster=rc),
        }, repeats)
        spans = yhat.fit(force=True, cluster=rc).spans
        overlap = min(spans["a"][1], spans["b"][1]) - max(spans["a"][0], spans["b"][0])
        results["branch_overlap_s"] = overlap
        results["first_cluster_fit_with_dask_setup_s"] = first_fit
        tiny_x, tiny_y = source(np.ones((4, 1)), name="tx"), source(np.arange(4.0), name="ty")
        tiny = machine(Ridge(), tiny_x, tiny_y, name="tiny")
        results.update(interleaved(
            {"cluster_overhead_one_tiny_fit": lambda: tiny.fit(force=True, cluster=rc)},
            repeats))
    finally:
        stop_dask(rc)
        rc.close()
        cluster.stop_cluster_sync()
    return results


# --- reporting --------------------------------------------------------------------------------

def ratios(r: dict) -> dict:
    """Ratios of medians, and medians of per-round ratios (``paired``), for the targets."""
    med = {k: v["median_s"] for k, v in r.items() if isinstance(v, dict)}
    pairs = [("leaf_refit_vs_leaf_own_fit", "network_refit_one_leaf", "leaf_own_fit"),
             ("leaf_refit_vs_network_full_refit", "network_refit_one_leaf", "network_full_refit"),
             ("leaf_refit_vs_sklearn_pipeline_refit", "network_refit_one_leaf",
              "sklearn_pipeline_refit"),
             ("cluster_vs_serial_two_branches", "cluster_two_branches", "serial_two_branches")]
    out = {}
    for name, num, den in pairs:
        if num in med and den in med:
            out[name] = med[num] / med[den]
            out[name + "_paired"] = paired_ratio(r, num, den)
            if not name.startswith("cluster"):
                # In-kernel work only: CPU time is what contention on a shared box leaves alone.
                out[name + "_cpu"] = r[num]["cpu_median_s"] / r[den]["cpu_median_s"]
    return out


TARGETS = {"leaf_refit_vs_leaf_own_fit": 1.1, "leaf_refit_vs_leaf_own_fit_paired": 1.1,
           "leaf_refit_vs_leaf_own_fit_cpu": 1.1,
           "cluster_vs_serial_two_branches": 0.6, "cluster_vs_serial_two_branches_paired": 0.6}


def print_table(results: dict, rat: dict) -> None:
    print(f"{'benchmark':<40} {'median s':>9} {'min s':>9} {'max s':>9} {'cpu med s':>9}")
    for name, v in results.items():
        if isinstance(v, dict):
            print(f"{name:<40} {v['median_s']:9.4f} {v['min_s']:9.4f} {v['max_s']:9.4f} "
                  f"{v['cpu_median_s']:9.4f}")
        else:
            print(f"{name:<40} {v:9.4f}")
    print()
    for name, value in rat.items():
        target = TARGETS.get(name)
        verdict = "" if target is None else f"  (target <= {target}: " \
                                            f"{'met' if value <= target else 'MISSED'})"
        print(f"{name:<44} {value:7.3f}x{verdict}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write results here")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-cluster", action="store_true", help="skip the cluster benchmark")
    parser.add_argument("--quick", action="store_true", help="smaller data (smoke run)")
    parser.add_argument("--samples", type=int, default=20000, help="rows for the leaf benchmark")
    parser.add_argument("--branch-samples", type=int, default=3000,
                        help="rows for the two-branch benchmark")
    args = parser.parse_args(argv)
    repeats = max(5, args.repeats)
    if args.quick:
        args.samples, args.branch_samples = args.samples // 4, args.branch_samples // 2
    load_before = os.getloadavg()   # this machine may be shared: say how busy it was
    results = bench_leaf_refit(repeats, args.samples)
    if not args.no_cluster:
        results.update(bench_branches(repeats, args.branch_samples))
    rat = ratios(results)
    print_table(results, rat)
    if args.json:
        report = {"benchmark": "network", "repeats": repeats, "results": results,
                  "load_average_before_after": [load_before, os.getloadavg()],
                  "ratios": rat, "targets": TARGETS,
                  "environment": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                  "sklearn": sklearn.__version__, "numpy": np.__version__,
                                  "machine": platform.machine()}}
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
