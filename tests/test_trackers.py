"""Runs in TensorBoard and MLflow (``--tensorboard DIR``, ``--mlflow URI``, and the export of a
finished run), read back with TensorBoard's own reader and MLflow's own client.

The lines' maths is tested pure; the rest on one real 2-engine cluster: a run written live
(MLflow shows rows while the cell still runs), every row it logged found in both, per rank and
as the mean over ranks, with its options, summary and manifest; the same run exported after the
fact; a missing package said in one line naming the extra to install.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest
from IPython.core.error import UsageError

from conftest import run_cell
from phalanx.fit import FitOptions, FitUsageError
from phalanx.fit.exports._run_shape import Lines, MissingExtra, option_params
from deadlines import hang_limit

pytest.importorskip("tensorboardX")
pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")

STEPS = 120


@pytest.fixture(autouse=True)
def file_store(monkeypatch):
    """MLflow 3.13+ asks for this opt-in before it reads a file store (phalanx sets it for its
    own writer); set per test so the reader here gets it too."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


# --- pure -----------------------------------------------------------------------------------------

def test_lines_give_each_rank_its_points_and_the_mean_once_every_rank_logged_the_step():
    lines = Lines(world_size=2)

    def cols(ranks, steps, loss):
        return {"rank": np.array(ranks), "step": np.array(steps), "t": np.arange(len(ranks)) + 10.0,
                "loss": np.array(loss, float)}

    first = lines.add(cols([0, 0, 1], [1, 2, 1], [1.0, 2.0, 3.0]))
    assert [(s.tag, s.steps.tolist(), s.values.tolist()) for s in first] == [
        ("loss/rank0", [1, 2], [1.0, 2.0]), ("loss/rank1", [1], [3.0]), ("loss/mean", [1], [2.0])]
    assert first[-1].times.tolist() == [12.0]   # the step's latest row
    second = lines.add(cols([1, 1], [2, 3], [4.0, np.nan]))   # NaN: not logged in that row
    assert [(s.tag, s.steps.tolist(), s.values.tolist()) for s in second] == [
        ("loss/rank1", [2], [4.0]), ("loss/mean", [2], [3.0])]
    assert lines.finish() == []


def test_options_become_flat_hyperparameters_without_where_they_are_written(tmp_path):
    opts = FitOptions.build(sync="localsgd", every=4, seed=3, shard="X,y", name="a",
                            tensorboard=str(tmp_path), mlflow="mlruns")
    params = option_params(opts)
    assert params["sync"] == "localsgd" and params["sync_params.every"] == 4
    assert params["seed"] == 3 and params["shard"] == "X,y" and params["name"] == "a"
    assert "tensorboard" not in params and "mlflow" not in params and "steps" not in params
    assert opts.tensorboard == str(tmp_path) and opts.mlflow == "mlruns"
    (tmp_path / "file").write_text("")
    with pytest.raises(FitUsageError, match="--tensorboard .* is a file"):
        FitOptions.build(tensorboard=str(tmp_path / "file"))


# --- reading back ---------------------------------------------------------------------------------

def _expected(record) -> dict[str, tuple[list[int], list[float]]]:
    """Every line the run's history implies: ``{tag: (steps, values)}``."""
    frame = record.history.to_pandas()
    out = {}
    for name in record.history.metric_names():
        logged = frame[frame[name].notna()]
        for rank in range(record.world_size):
            mine = logged[logged["rank"] == rank]
            out[f"{name}/rank{rank}"] = (mine["step"].tolist(), mine[name].tolist())
        means = logged.groupby("step")[name].mean()
        out[f"{name}/mean"] = (means.index.tolist(), means.tolist())
    return out


def _check_tensorboard(path: str, record) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    board = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
    board.Reload()
    for tag, (steps, values) in _expected(record).items():
        points = board.Scalars(tag)
        assert [p.step for p in points] == steps, tag
        assert [p.value for p in points] == pytest.approx(values, rel=1e-6), tag   # float32
    hparams = {tag: plugin_data_pb2.HParamsPluginData.FromString(content)
               for tag, content in board.PluginTagToContent("hparams").items()}
    start = hparams["_hparams_/session_start_info"].session_start_info.hparams
    assert start["sync"].string_value == "allreduce" and start["seed"].number_value == 7
    assert start["world_size"].number_value == 2
    end = hparams["_hparams_/session_end_info"].session_end_info
    assert end.status == api_pb2.STATUS_SUCCESS
    texts = {t: board.Tensors(t)[-1].tensor_proto.string_val[0].decode()
             for t in board.Tags()["tensors"] if t.endswith("text_summary")}
    assert '"status": "done"' in texts["phalanx/summary/text_summary"]
    assert '"world_size": 2' in texts["phalanx/manifest/text_summary"]
    assert board.Scalars("phalanx/wall_s")[0].value == pytest.approx(record.wall_s, rel=1e-6)


def _check_mlflow(uri: str, run_id: str, record) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    for tag, (steps, values) in _expected(record).items():
        history = client.get_metric_history(run_id, tag)
        assert [m.step for m in history] == steps, tag
        assert [m.value for m in history] == pytest.approx(values, rel=1e-12), tag
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == record.name
    params = run.data.params
    assert params["sync"] == "allreduce" and params["seed"] == "7" and params["world_size"] == "2"
    tags = run.data.tags
    assert tags["phalanx.run_id"] == record.run_id and tags["phalanx.status"] == "done"
    assert tags["manifest.world_size"] == "2"
    assert run.data.metrics["phalanx/wall_s"] == pytest.approx(record.wall_s)
    assert "phalanx-manifest.json" in [a.path for a in client.list_artifacts(run_id)]


def _mlflow_runs(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("phalanx")
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


# --- a real run -----------------------------------------------------------------------------------

CELL = """%%distributed_fit --no-widget --name tracked --seed 7 {flags}
from phalanx import log
for step in range(STEPS):
    if step == 40:
        wait_for_the_test()
    log(loss=1.0 / (step + 1) + rank, **({{"acc": step / 10 + rank}} if step % 10 == 0 else {{}}))
"""


def _seen_live(uri: str, gate) -> threading.Thread:
    """Opens ``gate`` once MLflow holds rows of the run that is still waiting on it."""
    def watch() -> None:
        until = time.monotonic() + hang_limit(60)
        while time.monotonic() < until:
            try:
                runs = _mlflow_runs(uri)
            except Exception:  # noqa: BLE001 - read while being written: look again
                runs = []
            if runs and runs[0].data.metrics.get("loss/rank0") is not None:
                gate.write_text("seen")
                return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.cluster
def test_a_run_is_written_live_to_tensorboard_and_mlflow_and_exported_the_same(
        two_engines, shell, tmp_path):
    board, store, gate = tmp_path / "tb", tmp_path / "mlruns", tmp_path / "gate"
    uri = "file://" + str(store)
    waiter = _seen_live(uri, gate)
    shell.user_ns.update(STEPS=STEPS)
    run_cell(shell, "def wait_for_the_test():\n    import os, time\n"
                    "    until = time.monotonic() + 60\n"
                    f"    while not os.path.exists({str(gate)!r}) and time.monotonic() < until:\n"
                    "        time.sleep(0.02)\n")
    run_cell(shell, CELL.format(flags=f"--tensorboard {board} --mlflow {store}"))
    waiter.join()
    assert gate.exists(), "MLflow showed no row while the run was going on"
    record = two_engines.last_run()
    assert record.status == "done" and len(record.history) == 2 * STEPS
    (folder,) = os.listdir(board)
    assert folder == f"tracked-{record.run_id}"
    _check_tensorboard(str(board / folder), record)
    (live,) = _mlflow_runs(uri)
    _check_mlflow(uri, live.info.run_id, record)

    # the finished run, exported: the same lines, parameters, summary and manifest
    exported = record.export_tensorboard(str(tmp_path / "tb2"))
    assert exported == str(tmp_path / "tb2" / folder)
    _check_tensorboard(exported, record)
    other = "file://" + str(tmp_path / "mlruns2")
    _check_mlflow(other, record.export_mlflow(other), record)


@pytest.mark.cluster
def test_a_failed_run_ends_failed_there_with_every_row_it_logged(two_engines, shell, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    from phalanx.fit import DistributedFitError

    board, store = tmp_path / "tb", tmp_path / "mlruns"
    cell = (f"%%distributed_fit --no-widget --name broken --tensorboard {board} --mlflow {store}\n"
            "from phalanx import log\n"
            "for step in range(30):\n"
            "    log(loss=float(step))\n"
            "if rank == 1:\n"
            "    raise ValueError('rank 1 gives up')\n")
    with pytest.raises(DistributedFitError, match="rank 1 gives up"):
        run_cell(shell, cell)
    record = two_engines.last_run()
    assert record.status == "failed"
    (run,) = _mlflow_runs("file://" + str(store))
    assert run.info.status == "FAILED" and run.data.tags["phalanx.status"] == "failed"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri="file://" + str(store))
    for rank in (0, 1):
        assert [m.step for m in client.get_metric_history(run.info.run_id, f"loss/rank{rank}")] \
            == list(range(1, 31))
    (folder,) = os.listdir(board)
    events = EventAccumulator(str(board / folder), size_guidance={"scalars": 0})
    events.Reload()
    end = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_end_info"]).session_end_info
    assert end.status == api_pb2.STATUS_FAILURE and len(events.Scalars("loss/mean")) == 30


@pytest.mark.cluster
def test_a_flag_without_its_package_is_one_line_naming_the_extra(two_engines, shell, tmp_path,
                                                                  monkeypatch, capsys):
    record = two_engines.fits.last
    monkeypatch.setitem(sys.modules, "tensorboardX", None)   # as if it were not installed
    monkeypatch.setitem(sys.modules, "mlflow", None)
    for flag, extra in (("--tensorboard", "tensorboard"), ("--mlflow", "mlflow")):
        result = shell.run_cell(f"%%distributed_fit --no-widget {flag} {tmp_path}\nx = 1\n",
                                store_history=False)
        assert type(result.error_in_exec) is UsageError
        module = "tensorboardX" if extra == "tensorboard" else "mlflow"
        assert str(result.error_in_exec) == (f"{flag} needs the {module} package: "
                                             f"pip install 'phalanx[{extra}]'")
        assert two_engines.fits.last is record   # nothing ran
    assert os.listdir(tmp_path) == []
    if record is not None:
        with pytest.raises(MissingExtra, match=r"pip install 'phalanx\[mlflow\]'"):
            record.export_mlflow(str(tmp_path))
        with pytest.raises(ImportError, match=r"pip install 'phalanx\[tensorboard\]'"):
            record.export_tensorboard(str(tmp_path))
