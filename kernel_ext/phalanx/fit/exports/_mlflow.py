"""One run as an MLflow run, written with MLflow's own client (``pip install
'phalanx[mlflow]'``: mlflow-skinny, the client and its file store without the server).

The tracking URI is any MLflow takes; a local path or a ``file:`` URI is MLflow's file store,
which needs no server.  The run goes to the experiment ``phalanx`` under the run's name: the
options as parameters, every metric per rank (``loss/rank0``) and the mean over ranks
(``loss/mean``) at the steps the ranks logged, each with its row's wall time; at the end the
status (FINISHED, FAILED or KILLED), ``phalanx.*`` tags (run id, status, steps), the metric
``phalanx/wall_s``, the manifest's plain values as ``manifest.*`` tags and the whole manifest as
the artifact ``phalanx-manifest.json``.

Example::

    sink = MlflowSink("mlruns")               # then export_record(record, sink)
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping
from urllib.parse import urlparse

from ._run_shape import RunInfo, Series, require

EXPERIMENT = "phalanx"
BATCH = 1000          # MLflow's limit of metrics in one log_batch
TAG_CHARS = 5000      # a tag's value is cut here (MLflow's limit is a few thousand characters)
_STATUS = {"done": "FINISHED", "interrupted": "KILLED"}   # anything else: FAILED


def tracking_uri(where: str) -> str:
    """``where`` as a tracking URI: a local path becomes an absolute ``file:`` URI (the file
    store), a URI is kept as it is.

    Example: ``tracking_uri("mlruns") == "file://" + os.path.abspath("mlruns")``
    """
    scheme = urlparse(where).scheme
    if scheme and len(scheme) > 1:  # a URI ("C:" is a drive, not a scheme)
        return where
    return "file://" + os.path.abspath(os.path.expanduser(where))


def is_file_store(uri: str) -> bool:
    return urlparse(uri).scheme == "file"


class MlflowSink:
    """Writes one run to the MLflow tracking store at ``uri`` (experiment ``experiment``);
    :attr:`run_id` is MLflow's id of it once begun."""

    what = "MLflow"

    def __init__(self, uri: str, experiment: str = EXPERIMENT) -> None:
        require("mlflow", "mlflow", "--mlflow")
        self.uri = tracking_uri(uri)
        self.experiment = experiment
        self.run_id: str | None = None
        self._client: Any = None

    def begin(self, run: RunInfo) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        if is_file_store(self.uri):
            # MLflow 3.13+ keeps its file store behind an opt-in; giving phalanx a path is
            # asking for it (reading it back, `mlflow ui` included, needs the same variable).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = self._client = MlflowClient(tracking_uri=self.uri)
        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else client.create_experiment(self.experiment))
        created = client.create_run(experiment_id, start_time=_ms(run.started), run_name=run.name,
                                    tags={"phalanx.run_id": run.run_id})
        self.run_id = created.info.run_id
        params = {**run.params, "world_size": run.world_size}
        client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def write(self, lines: list[Series]) -> None:
        from mlflow.entities import Metric

        batch: list[Any] = []
        for line in lines:
            tag = line.tag
            for step, value, t in zip(line.steps.tolist(), line.values.tolist(),
                                      line.times.tolist()):
                batch.append(Metric(tag, value, int(t * 1000), step))
                if len(batch) == BATCH:
                    self._client.log_batch(self.run_id, metrics=batch)
                    batch = []
        if batch:
            self._client.log_batch(self.run_id, metrics=batch)

    def end(self, summary: dict[str, Any], manifest: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric, RunTag

        client, run_id = self._client, self.run_id
        steps = summary["steps"]
        tags = {"phalanx.status": summary["status"], "phalanx.steps": json.dumps(steps),
                "phalanx.rows": str(summary["rows"])}
        tags.update({f"manifest.{k}": _text(v) for k, v in manifest.items()
                     if v is not None and not isinstance(v, (dict, list))})
        client.log_batch(run_id, metrics=[Metric("phalanx/wall_s", summary["wall_s"],
                                                 _ms(time.time()), max(steps.values(), default=0))],
                         tags=[RunTag(k, v) for k, v in tags.items()])
        if manifest:
            client.log_text(run_id, json.dumps(manifest, indent=2, sort_keys=True, default=str),
                            "phalanx-manifest.json")
        client.set_terminated(run_id, status=_STATUS.get(summary["status"], "FAILED"))

    def close(self) -> None:
        """Nothing is buffered: each call above is written when it returns."""


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:TAG_CHARS]
