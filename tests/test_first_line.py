"""What a cell shows first, read from a real kernel's IOPub as a notebook page receives it.

A ``%cluster start`` cell and a ``%%distributed_fit`` cell each show one light line before
anything else (no widget, no BokehJS), then the same output slot becomes the engine table or
the live view, and a finished run's slot becomes its static summary.  The order of the messages
is what a person sees; the latency of the first line is printed (the benchmarks measure it).
"""

from __future__ import annotations

import os
import time

import pytest
from deadlines import hang_limit
from kernel_support import kernel_manager

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WIDGET = "application/vnd.jupyter.widget-view+json"
RUN = """%%distributed_fit --steps 40 --name first-line
import time
from phalanx import log
for i in range(40):
    log(loss=1.0 / (i + 1))
    time.sleep(0.02)
"""


class Cell:
    """The IOPub messages of one executed cell, with when each arrived."""

    def __init__(self, client, code: str, status: str = "ok") -> None:
        self.sent = time.monotonic()
        self.messages: list[tuple[float, dict]] = []
        reply = client.execute_interactive(
            code, timeout=hang_limit(240),
            output_hook=lambda msg: self.messages.append((time.monotonic(), msg)))
        self.reply = reply["content"]
        assert self.reply["status"] == status, self.said()

    def said(self) -> str:
        return "".join(m["content"].get("text", "") for _, m in self.messages
                       if m["msg_type"] == "stream")

    def outputs(self) -> list[dict]:
        """Display messages and widget messages, in arrival order."""
        kinds = ("display_data", "update_display_data", "comm_open", "comm_msg")
        return [m for _, m in self.messages if m["msg_type"] in kinds]

    def first_output_s(self) -> float:
        return next(t for t, m in self.messages
                    if m["msg_type"] in ("display_data", "comm_open")) - self.sent


def _display_id(msg: dict) -> str | None:
    return msg["content"].get("transient", {}).get("display_id")


def _is_bokeh(msg: dict) -> bool:
    if msg["msg_type"] == "comm_open":
        state = msg["content"].get("data", {}).get("state", {})
        return "Bokeh" in str(state.get("_model_name", ""))
    data = msg["content"].get("data", {})
    return any("bokeh" in mime for mime in data)


@pytest.fixture(scope="module")
def kernel():
    km = kernel_manager()
    km.start_kernel(env=dict(os.environ))
    client = km.blocking_client()
    client.start_channels()
    client.wait_for_ready(timeout=hang_limit(60))
    try:
        yield client
    finally:
        try:
            client.execute_interactive("import phalanx\nphalanx.get_session().close()",
                                       timeout=hang_limit(60))
        finally:
            client.stop_channels()
            km.shutdown_kernel(now=False)
            km.cleanup_resources()


def test_cluster_start_shows_a_line_that_becomes_the_engine_table(kernel):
    Cell(kernel, "%load_ext phalanx")
    cell = Cell(kernel, "%cluster start -n 2 --gpus none")
    outputs = cell.outputs()
    first = outputs[0]
    assert first["msg_type"] == "display_data", outputs
    assert first["content"]["data"]["text/plain"].startswith("%cluster start:")
    slot = _display_id(first)
    updates = [m for m in outputs if m["msg_type"] == "update_display_data" and _display_id(m) == slot]
    assert updates, "the line was never replaced"
    assert "idle" in updates[-1]["content"]["data"]["text/html"], "the engine table ends in the slot"
    print(f"%cluster start: first line {cell.first_output_s() * 1000:.0f} ms after the request")


def test_a_run_shows_its_line_then_bars_then_the_chart_then_its_summary(kernel):
    cell = Cell(kernel, RUN)
    outputs = cell.outputs()
    first = outputs[0]
    # The first thing under the cell is the light line: no widget, no plot, no BokehJS before it.
    assert first["msg_type"] == "display_data" and WIDGET not in first["content"]["data"], outputs[:3]
    assert first["content"]["data"]["text/plain"].startswith("starting:")
    slot = _display_id(first)
    in_slot = [m for m in outputs if m["msg_type"] == "update_display_data" and _display_id(m) == slot]
    view_at = outputs.index(in_slot[0])
    assert WIDGET in in_slot[0]["content"]["data"], "the live view takes the line's place"
    # Every widget of the view before it is shown; bokeh's only after: the chart never delays
    # the bars.
    assert not any(_is_bokeh(m) for m in outputs[:view_at]), "bokeh came before the bars"
    assert any(_is_bokeh(m) for m in outputs[view_at:]), "the chart was never built"
    headers = [str(m["content"]["data"].get("state", {}).get("value", ""))
               for m in outputs[:view_at] if m["msg_type"] in ("comm_open", "comm_msg")]
    assert any("sending the cell to 2 rank(s)" in h for h in headers), headers
    # The run's end puts the static summary in the same slot: a saved notebook keeps no widget.
    final = in_slot[-1]["content"]
    assert WIDGET not in final["data"] and "phalanx-run-summary" in final["data"]["text/html"]
    assert final["metadata"]["phalanx"]["manifest"]["world_size"] == 2
    print(f"run: first line {cell.first_output_s() * 1000:.0f} ms after the request, "
          f"live view {(cell.messages[[m for _, m in cell.messages].index(in_slot[0])][0] - cell.sent) * 1000:.0f} ms")


def test_a_refused_run_leaves_its_error_alone(kernel):
    cell = Cell(kernel, "%%distributed_fit --steps 3\nnot_defined_anywhere + 1", status="error")
    assert "not_defined_anywhere" in cell.reply["evalue"]
    outputs = cell.outputs()
    slot = _display_id(outputs[0])
    last = [m for m in outputs if _display_id(m) == slot][-1]["content"]["data"]
    assert last == {"text/plain": ""}, "the first line stays only while there is work to say"


LINE_THEN_SUMMARY = """
import sys
from phalanx.widgets._status_line import StatusLine
_flushed = []
for _stream in (sys.stdout, sys.stderr):
    _stream.flush = lambda _real=_stream.flush, _name=_stream.name: (_flushed.append(_name), _real())[1]
print("printed before the line")
_line = StatusLine.show("a line")
_line.say("rewritten with nothing printed")
print("printed before the summary", file=sys.stderr)
_line.replace_with({"text/plain": "the summary"}, raw=True)
del sys.stdout.flush, sys.stderr.flush
print("flushed:", _flushed)
"""


def test_text_printed_before_a_line_stays_before_it_and_nothing_else_waits_for_the_io_thread(kernel):
    # Each display makes ipykernel flush both streams, each flush a wait on its IO thread; the
    # line and the summary flush only a stream with text waiting, which then comes first.
    cell = Cell(kernel, LINE_THEN_SUMMARY)
    kinds = [(m["msg_type"], m["content"].get("text", "").strip()) for _, m in cell.messages
             if m["msg_type"] in ("stream", "display_data", "update_display_data")]
    assert kinds[:5] == [("stream", "printed before the line"), ("display_data", ""),
                         ("update_display_data", ""), ("stream", "printed before the summary"),
                         ("update_display_data", "")], kinds
    assert "flushed: ['stdout', 'stderr']" in cell.said(), cell.said()
