"""One run as TensorBoard event files, written with tensorboardX (``pip install
'phalanx[tensorboard]'``): protobuf is all it needs, where torch's own SummaryWriter needs the
whole ``tensorboard`` package.

The run is one TensorBoard run, the directory ``DIR/<run name>-<run id>``: a scalar line per
metric and rank (``loss/rank0``) and the mean over ranks (``loss/mean``), at the steps the ranks
logged and with each row's wall time; the options as hyperparameters (the HParams dashboard: a
session that starts with the run and ends with its status); the manifest and the summary as
text (``phalanx/manifest``, ``phalanx/summary``) and the wall time as ``phalanx/wall_s``.

Example::

    sink = TensorBoardSink("runs")            # then export_record(record, sink)
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

from ._run_shape import RunInfo, Series, require

# The HParams plugin's session status of each run status
_STATUS = {"done": "STATUS_SUCCESS", "failed": "STATUS_FAILURE", "timeout": "STATUS_FAILURE",
           "interrupted": "STATUS_ABORTED"}


class TensorBoardSink:
    """Writes one run under ``directory`` (``subdir``: the run's own folder in it; default
    ``<run name>-<run id>``).  :attr:`path` is where the event file is.

    It writes with tensorboardX's synchronous event writer (``EventsWriter``: records, CRCs,
    the file) from the caller's thread, flushing after each batch of lines: the live export
    already writes from a thread of its own, and SummaryWriter's queue would hand each point
    to another thread through a multiprocessing queue (a few hundred microseconds a point).
    """

    what = "TensorBoard"

    def __init__(self, directory: str, subdir: str | None = None) -> None:
        require("tensorboardX", "tensorboard", "--tensorboard")
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise NotADirectoryError(f"{directory!r} is a file: TensorBoard reads a directory")
        self.directory = os.path.abspath(directory)
        self.subdir = subdir
        self.path: str | None = None
        self._events: Any = None
        self._last_step = 0

    def begin(self, run: RunInfo) -> None:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.summary import hparams, text

        self.path = os.path.join(self.directory, self.subdir or _safe(f"{run.name}-{run.run_id}"))
        os.makedirs(self.path, exist_ok=True)
        self._events = EventsWriter(os.path.join(self.path, "events"))
        _, start, _ = hparams({**run.params, "world_size": run.world_size}, {})
        # (the experiment summary is left out: TensorBoard infers it from the runs' sessions)
        self._add(start, 0, run.started)
        self._add(text("phalanx/options", _code(run.params)), 0, run.started)
        self._events.flush()

    def _add(self, summary: Any, step: int, walltime: float) -> None:
        from tensorboardX.proto.event_pb2 import Event

        self._events.write_event(Event(wall_time=walltime, step=step, summary=summary))

    def write(self, lines: list[Series]) -> None:
        from tensorboardX.proto.event_pb2 import Event

        write = self._events.write_event
        for line in lines:
            event = Event()  # one per line, its fields set for each point: half the cost of new ones
            point = event.summary.value.add(tag=line.tag)
            for step, value, t in zip(line.steps.tolist(), line.values.tolist(),
                                      line.times.tolist()):
                event.wall_time, event.step, point.simple_value = t, step, value
                write(event)
            if len(line.steps):
                self._last_step = max(self._last_step, int(line.steps[-1]))
        self._events.flush()

    def end(self, summary: dict[str, Any], manifest: Mapping[str, Any]) -> None:
        from tensorboardX.summary import scalar, text

        step, now = self._last_step, time.time()
        self._add(scalar("phalanx/wall_s", summary["wall_s"]), step, now)
        self._add(text("phalanx/summary", _code(summary)), step, now)
        if manifest:
            self._add(text("phalanx/manifest", _code(manifest)), step, now)
        self._add(_session_end(summary["status"]), step, now)

    def close(self) -> None:
        if self._events is not None:
            self._events.close()  # flushes


def _session_end(status: str) -> Any:
    """The HParams plugin's session-end summary with the run's status (tensorboardX's own
    ``hparams()`` always says success)."""
    from tensorboardX.proto.api_pb2 import Status
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData, SessionEndInfo
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata

    info = SessionEndInfo(status=Status.Value(_STATUS.get(status, "STATUS_UNKNOWN")))
    content = HParamsPluginData(session_end_info=info, version=0)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name="hparams", content=content.SerializeToString()))
    return Summary(value=[Summary.Value(tag="_hparams_/session_end_info", metadata=meta)])


def _code(value: Any) -> str:
    """JSON as a Markdown code block: TensorBoard's text dashboard renders Markdown."""
    text = json.dumps(value, indent=2, sort_keys=True, default=str)
    return "```json\n" + text + "\n```"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
