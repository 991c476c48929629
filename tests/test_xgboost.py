"""Gradient boosting on a real 2-engine cluster: XGBoost's and LightGBM's own collectives inside
``%%distributed_fit`` (one model over every rank's shard, the same booster on every rank, rounds
and evaluation metrics in the live views, nothing left listening, a killed rank named), and
``phalanx.dask_client()`` running ``xgboost.dask`` as it is."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest

from conftest import run_cell
from deadlines import hang_limit

xgb = pytest.importorskip("xgboost")
pytest.importorskip("distributed")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

ROUNDS = 20
PARAMS = {"tree_method": "hist", "max_depth": 4, "eta": 0.3, "seed": 0, "nthread": 1}

TRAIN = f"""
import xgboost as xgb
dtrain = xgb.DMatrix(X, label=y)
dvalid = xgb.DMatrix(Xv, label=yv)
booster = xgb.train(PARAMS, dtrain, {ROUNDS}, evals=[(dvalid, "valid")], verbose_eval=False)
with open(f"{{OUT}}/rank{{rank}}.ubj", "wb") as f:
    f.write(booster.save_raw("ubj"))
"""


def _data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Features of 32 levels each: fewer than ``hist``'s 256 bins, so the bins are the levels
    whether the quantile sketch is one process's or merged across ranks, and the comparison
    with one process tests the training rather than the sketch.  (With continuous features the
    merged sketch moves the bins, which moves the test RMSE of these small models by a few
    per cent either way, as changing ``max_bin`` from 256 to 260 does in one process.)"""
    rng = np.random.default_rng(seed)
    X = (rng.integers(0, 32, size=(rows, 8)) / 8.0 - 2.0).astype(np.float32)
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + np.cos(X[:, 2]) * X[:, 3] + 0.1 * rng.normal(size=rows)
    return X, y.astype(np.float32)


def _rmse(model, X, y) -> float:
    return float(np.sqrt(np.mean((model.predict(xgb.DMatrix(X)) - y) ** 2)))


def _listening() -> set[tuple[str, int]]:
    """The kernel's (this process's) listening TCP sockets."""
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def _listening_anywhere() -> set[int]:
    """(On an engine) the ports it listens on at every interface, as XGBoost's ranks do."""
    import psutil

    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.ip in ("0.0.0.0", "::")}


def _engine_listening(session, rank: int) -> set[int]:
    slot = session.cluster.slots()[rank]
    return set(session.cluster.client[slot.engine_id].apply_sync(_listening_anywhere))


@pytest.fixture
def data(two_engines, shell, tmp_path):
    X, y = _data(4000, 0)
    Xv, yv = _data(1000, 1)
    shell.user_ns.update(X=X, y=y, Xv=Xv, yv=yv, PARAMS=dict(PARAMS), OUT=str(tmp_path))
    return two_engines


def test_train_on_shards_is_one_model_same_on_every_rank_with_rounds_in_the_views(
        data, shell, tmp_path, monkeypatch):
    from phalanx.fit.run import _xgboost_tracker

    run_cell(shell, "%%distributed_fit --no-widget\npass")  # the run's own listeners exist now
    before = _listening()
    trackers = []
    start = _xgboost_tracker.XGBoostTracker.__init__

    def spy(self, *args, **kwargs):
        start(self, *args, **kwargs)
        trackers.append(dict(self.args))

    monkeypatch.setattr(_xgboost_tracker.XGBoostTracker, "__init__", spy)
    run_cell(shell, "%%distributed_fit --shard X,y --return booster --no-widget\n" + TRAIN)

    # one tracker, on loopback, gone with the run
    assert [t["dmlc_tracker_uri"] for t in trackers] == ["127.0.0.1"]
    assert _listening() <= before, f"left listening: {_listening() - before}"
    assert all(not _engine_listening(data, rank) for rank in (0, 1))
    # every rank holds the same booster, and it is the one that came back
    raw = [(tmp_path / f"rank{r}.ubj").read_bytes() for r in (0, 1)]
    assert raw[0] == raw[1]
    booster = shell.user_ns["booster"]
    assert bytes(booster.save_raw("ubj")) == raw[0]
    assert booster.num_boosted_rounds() == ROUNDS
    # one model over both shards predicts as well as one process on all the data
    ns = shell.user_ns
    single = xgb.train(PARAMS, xgb.DMatrix(ns["X"], label=ns["y"]), ROUNDS)
    Xt, yt = _data(2000, 2)
    distributed, alone = _rmse(booster, Xt, yt), _rmse(single, Xt, yt)
    print(f"test RMSE: distributed {distributed:.4f}, one process {alone:.4f}")
    assert abs(distributed - alone) <= 0.01 * alone
    # rounds are the run's steps; XGBoost's evaluation of each round is every rank's row
    record = data.last_run()
    assert record.status == "done" and record.steps == {0: ROUNDS, 1: ROUNDS}
    rows = record.history.rows()
    for rank in (0, 1):
        steps = [r["step"] for r in rows if r["rank"] == rank and "valid-rmse" in r]
        assert steps == list(range(1, ROUNDS + 1))
    last = {r["rank"]: r["valid-rmse"] for r in rows if r["step"] == ROUNDS}
    assert last[0] == pytest.approx(last[1])   # XGBoost reduces its metric over both shards
    assert record.total_steps == ROUNDS


def _rank_1_killed_while_boosting(session, shell, body: str):
    """Run ``body`` for (nearly) endless rounds and SIGKILL rank 1's engine once it has boosted
    3 rounds; returns the cell's DistributedFitError and the seconds the cell took."""
    from phalanx.fit import DistributedFitError

    victim = session.cluster.slots()[1]
    done = threading.Event()

    def kill_once_it_boosts():
        deadline = time.monotonic() + hang_limit(60)
        while time.monotonic() < deadline and not done.is_set():
            active = session.fits.active
            if active is not None and active.steps.get(1, 0) >= 3:
                os.kill(victim.pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_once_it_boosts, daemon=True)
    killer.start()
    began = time.monotonic()
    try:
        with pytest.raises(DistributedFitError) as info:
            run_cell(shell, "%%distributed_fit --shard X,y --no-widget\n"
                     + body.replace(str(ROUNDS), "100_000"))
    finally:
        done.set()
        killer.join(5)
    took = time.monotonic() - began
    print(f"killed rank reported after {took:.1f} s: {info.value}")
    return info.value, took


def test_a_rank_killed_while_boosting_is_named_and_releases_the_other(data, shell):
    from phalanx.runtime import Outcome

    session = data
    survivor_before = _engine_listening(session, 0)
    error, took = _rank_1_killed_while_boosting(session, shell, TRAIN)
    assert error.rank == 1, str(error)
    assert "rank 1" in str(error)
    survivor = error.results[0]
    # released by XGBoost's own error (its peer's sockets closed), not left for phalanx to end
    assert survivor.outcome in (Outcome.RAISED, Outcome.INTERRUPTED), survivor
    assert took < hang_limit(30)
    # the survivor's XGBoost stopped listening for its tracker's signals with the run
    assert _engine_listening(session, 0) <= survivor_before
    # the next run on the same engines (the survivor's XGBoost included) trains as before
    run_cell(shell, "%cluster restart 1")
    run_cell(shell, "%%distributed_fit --shard X,y --no-widget\n" + TRAIN.replace(str(ROUNDS), "3"))
    assert session.last_run().steps == {0: 3, 1: 3}


def test_a_rank_that_never_trains_is_named_at_the_collective_timeout(data, shell):
    from phalanx.fit import DistributedFitError

    before = _engine_listening(data, 0)
    began = time.monotonic()
    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, "%%distributed_fit --shard X,y --collective-timeout 2 --no-widget\n"
                 "if rank == 0:\n" + "\n".join("    " + line for line in TRAIN.splitlines()))
    took = time.monotonic() - began
    # rank 1 waits for rank 0 at the run's end, gives up at the deadline and names it; rank 0
    # is interrupted where it waits for XGBoost's peer
    assert info.value.rank == 0 and "stalled" in str(info.value), str(info.value)
    assert "xgb.train(PARAMS" in str(info.value)
    assert took < hang_limit(20), took
    # XGBoost leaves a failed bootstrap's error listener open: phalanx closed it
    assert _engine_listening(data, 0) <= before


def test_dask_client_runs_xgboost_dask_as_is_and_follows_scale(data, shell, capsys):
    import distributed
    import phalanx
    import xgboost.dask as dxgb
    from dask import array as da

    session = data
    client = phalanx.dask_client()
    assert distributed.get_client() is client and phalanx.dask_client() is client
    X, y = _data(4000, 0)
    dX, dy = da.from_array(X, chunks=(1000, 8)), da.from_array(y, chunks=1000)
    out = dxgb.train(None, PARAMS, dxgb.DaskDMatrix(None, dX, dy), ROUNDS)
    booster = out["booster"]
    single = xgb.train(PARAMS, xgb.DMatrix(X, label=y), ROUNDS)
    Xt, yt = _data(2000, 2)
    on_dask, alone = _rmse(booster, Xt, yt), _rmse(single, Xt, yt)
    print(f"test RMSE: xgboost.dask {on_dask:.4f}, one process {alone:.4f}")
    assert abs(on_dask - alone) <= 0.01 * alone
    assert float(dX.sum().compute()) == pytest.approx(float(X.sum()), rel=1e-4)  # dask.array too

    # %cluster status says when dask work runs on the engines
    assert session.dask_tasks() == 0
    future = client.submit(time.sleep, 3, pure=False)
    deadline = time.monotonic() + hang_limit(10)
    while not session.dask_tasks() and time.monotonic() < deadline:
        time.sleep(0.05)
    shell.run_line_magic("cluster", "status")
    assert "dask: 1 task(s) running on the engines" in capsys.readouterr().out
    future.result()

    session.scale(1)
    try:
        smaller = distributed.get_client()
        assert client.status == "closed" and smaller is not client
        assert phalanx.dask_client() is smaller
        assert len(smaller.scheduler_info()["workers"]) == 1
    finally:
        session.scale(2)
    assert len(distributed.get_client().scheduler_info()["workers"]) == 2


def test_a_network_machine_with_xgboost_fits_over_both_shards_and_refits_only_what_changed(
        data, shell):
    import phalanx
    from phalanx.network import machine, source
    from sklearn.preprocessing import StandardScaler

    session, ns = data, shell.user_ns

    def regressor(rounds: int):
        return xgb.XGBRegressor(n_estimators=rounds, tree_method="hist", max_depth=4,
                                learning_rate=0.3, random_state=0, n_jobs=1)

    X, y = source(ns["X"], name="X"), source(ns["y"], name="y")
    stand = machine(StandardScaler(), X, name="stand")
    W = stand.transform(X)
    boost = machine(regressor(ROUNDS), W, y, name="boost",
                    fit_runner=phalanx.data_parallel(session=session))
    yhat = boost.predict(W)

    assert session.fit_network(yhat).actions == {"stand": "fit", "boost": "fit"}
    run = session.last_run()   # the machine's fit was one run over both shards
    assert run.world_size == 2 and run.status == "done" and run.steps == {0: ROUNDS, 1: ROUNDS}
    scaler = StandardScaler().fit(ns["X"])
    single = regressor(ROUNDS).fit(scaler.transform(ns["X"]), ns["y"])
    Xt, yt = _data(2000, 2)
    rmse = {name: float(np.sqrt(np.mean((model.predict(scaler.transform(Xt)) - yt) ** 2)))
            for name, model in (("network", boost.fitted), ("alone", single))}
    print(f"test RMSE: {rmse}")
    assert abs(rmse["network"] - rmse["alone"]) <= 0.01 * rmse["alone"]

    assert session.fit_network(yhat).actions == {"stand": "skip", "boost": "skip"}
    boost.model.set_params(n_estimators=10)
    assert session.fit_network(yhat).actions == {"stand": "skip", "boost": "fit"}
    assert session.last_run().steps == {0: 10, 1: 10}


LGB_PARAMS = {"objective": "regression", "num_leaves": 15, "learning_rate": 0.3, "seed": 0,
              "num_threads": 1, "verbose": -1, "deterministic": True}
LGB_TRAIN = f"""
import lightgbm as lgb
model = lgb.train(LGB_PARAMS, lgb.Dataset(X, label=y), {ROUNDS},
                  valid_sets=[lgb.Dataset(Xv, label=yv)], valid_names=["valid"])
with open(f"{{OUT}}/lgb-rank{{rank}}.txt", "w") as f:
    f.write(model.model_to_string().split("\\nparameters:\\n")[0])
"""


def test_lightgbm_train_on_shards_is_one_model_same_on_every_rank(data, shell, tmp_path):
    lgb = pytest.importorskip("lightgbm")
    shell.user_ns["LGB_PARAMS"] = dict(LGB_PARAMS)
    run_cell(shell, "%%distributed_fit --shard X,y --return model --no-widget\n" + LGB_TRAIN)
    trees = [(tmp_path / f"lgb-rank{r}.txt").read_text() for r in (0, 1)]
    assert trees[0] == trees[1]                                 # one model over both shards
    assert all(not _engine_listening(data, rank) for rank in (0, 1))   # its network freed
    ns = shell.user_ns
    single = lgb.train(LGB_PARAMS, lgb.Dataset(ns["X"], label=ns["y"]), ROUNDS)
    Xt, yt = _data(2000, 2)
    rmse = {name: float(np.sqrt(np.mean((model.predict(Xt) - yt) ** 2)))
            for name, model in (("distributed", ns["model"]), ("alone", single))}
    print(f"test RMSE: {rmse}")
    assert abs(rmse["distributed"] - rmse["alone"]) <= 0.01 * rmse["alone"]
    record = data.last_run()           # rounds are steps; LightGBM's evaluation, every rank's row
    assert record.steps == {0: ROUNDS, 1: ROUNDS} and record.total_steps == ROUNDS
    rows = record.history.rows()
    for rank in (0, 1):
        assert [r["step"] for r in rows if r["rank"] == rank and "valid-l2" in r] == \
            list(range(1, ROUNDS + 1))


def test_a_rank_killed_while_lightgbm_boosts_is_named_and_releases_the_other(data, shell):
    pytest.importorskip("lightgbm")

    session = data
    shell.user_ns["LGB_PARAMS"] = dict(LGB_PARAMS)
    error, took = _rank_1_killed_while_boosting(session, shell, LGB_TRAIN)
    assert error.rank == 1 and "rank 1" in str(error), str(error)
    assert took < hang_limit(30), took
    assert not _engine_listening(session, 0)   # the survivor's LightGBM network was freed
    run_cell(shell, "%cluster restart 1")        # and the same engines train again
    run_cell(shell, "%%distributed_fit --shard X,y --no-widget\n"
             + LGB_TRAIN.replace(str(ROUNDS), "3"))
    assert session.last_run().steps == {0: 3, 1: 3}
