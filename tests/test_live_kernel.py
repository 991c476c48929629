"""The panel's comm answered while a run trains, against a real kernel and a real cluster.

Two kernels: ipykernel 7 as it is (the panel's comm on a subshell, answered on its thread) and
the same kernel without subshells (the run's wait loop serves the comm itself).  Each test
speaks the panel's protocol over the real comm while a ``%%distributed_fit`` cell runs on the
main shell: attach (a reloaded page), scale (queued for a fixed-size run), stop the run; then
the queued scale is applied, and the next run works.
"""

from __future__ import annotations

import os
import queue
import time
import uuid

import pytest
from kernel_support import kernel_manager
from deadlines import hang_limit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 400
LONG_RUN = f"""%%distributed_fit --steps {STEPS} --name long-run --no-widget
import time
from phalanx import log
for i in range({STEPS}):
    log(loss=1.0 / (i + 1))
    time.sleep(0.05)
"""
SHORT_RUN = "%%distributed_fit --no-widget --name short-run\nfrom phalanx import allreduce\nallreduce(1.0)\n"
# The point is that the panel is answered while the cell still runs (the run lasts far longer);
# the waits are generous so a loaded machine cannot fail them, and the times are printed.
ATTACH_WAIT_S = 30.0


class Kernel:
    """A kernel process and a blocking client that can also speak on a subshell."""

    def __init__(self, subshells: bool) -> None:
        self.km = kernel_manager()
        argv = self.km.kernel_spec.argv
        if not subshells:
            argv[1:3] = ["-m", "nosubshell_kernel"]
        self.km.start_kernel(env=dict(os.environ))
        self.client = self.km.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=hang_limit(60))
        self.iopub: list[dict] = []
        self.backlog: list[dict] = []  # read while looking for something else, not yet seen

    def execute(self, code: str, timeout: float = hang_limit(180)) -> dict:
        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=self.iopub.append)
        return reply["content"]

    def create_subshell(self) -> str:
        msg = self.client.session.msg("create_subshell_request", {})
        self.client.control_channel.send(msg)
        reply = self.client.control_channel.get_msg(timeout=hang_limit(10))
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply["content"]["subshell_id"]

    def send_shell(self, msg_type: str, content: dict, subshell: str | None) -> None:
        msg = self.client.session.msg(msg_type, content)
        if subshell is not None:
            msg["header"]["subshell_id"] = subshell
        self.client.shell_channel.send(msg)

    def comm_messages(self, comm_id: str, until, timeout: float) -> list[dict]:
        """Read IOPub until ``until(data)`` holds for a message of ``comm_id``; all its data."""
        seen: list[dict] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.backlog:
                msg = self.backlog.pop(0)
            else:
                try:
                    msg = self.client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    break
                self.iopub.append(msg)
            content = msg["content"]
            if msg["msg_type"] == "comm_msg" and content.get("comm_id") == comm_id:
                seen.append(content["data"])
                if until(content["data"]):
                    return seen
        raise AssertionError(f"no matching comm message within {timeout} s; got "
                             f"{[d.get('type') for d in seen]}")

    def close(self) -> None:
        try:
            self.execute("import phalanx\nphalanx.get_session().close()", timeout=hang_limit(60))
        finally:
            self.client.stop_channels()
            self.km.shutdown_kernel(now=False)
            self.km.cleanup_resources()


def _running_job(data: dict) -> bool:
    return data.get("type") == "snapshot" and any(
        e.get("type") == "run_started" and e.get("name") == "long-run" for e in data["events"])


def _cluster(data: dict, **want) -> bool:
    return data.get("type") == "cluster" and all(
        (len(data["engines"]) if k == "engines" else data.get(k)) == v for k, v in want.items())


@pytest.mark.parametrize("subshells", [True, False], ids=["subshell", "no-subshell"])
def test_panel_requests_are_answered_while_a_run_trains(subshells):
    kernel = Kernel(subshells)
    try:
        info = kernel.client.kernel_info(reply=True, timeout=hang_limit(10))["content"]
        assert ("kernel subshells" in info.get("supported_features", [])) is subshells
        assert kernel.execute("%load_ext phalanx\n%cluster start -n 2 --gpus none")["status"] == "ok"
        subshell = kernel.create_subshell() if subshells else None
        run_id = kernel.client.execute(LONG_RUN)
        if not subshells:
            # Without subshells a message that reaches the kernel in the same instant as the
            # cell is queued by the kernel's own loop behind it, out of the run's reach; the
            # panel's later messages are served during the run, as the rest checks.
            _wait_for_output(kernel, run_id)
        # A first panel follows the run until rows arrive: the run is training.
        first = _open_panel(kernel, subshell)
        kernel.comm_messages(first, lambda d: d.get("type") == "metrics" and d["rows"], timeout=hang_limit(120))

        # A reloaded page (or a second tab) opens its comm while the cell runs: the job and its
        # rows come at once.
        comm_id, sent = uuid.uuid4().hex, time.monotonic()
        kernel.send_shell("comm_open", {"comm_id": comm_id, "target_name": "phalanx",
                                        "data": {"v": 1, "type": "request_snapshot"}}, subshell)
        snapshot = kernel.comm_messages(comm_id, _running_job, timeout=ATTACH_WAIT_S)[-1]
        attach_s = time.monotonic() - sent
        print(f"a reloaded panel got the running job in {attach_s:.2f} s")
        assert not any(e.get("type") == "run_ended" for e in snapshot["events"]), \
            "the panel was answered only after the run ended"
        rows = kernel.comm_messages(comm_id, lambda d: d.get("type") == "metrics", timeout=3)[-1]
        assert rows["rows"], "a reloaded panel gets the rows logged so far"

        # + on a fixed-size run: queued and said so, not lost.
        kernel.send_shell("comm_msg", {"comm_id": comm_id, "data": {"v": 1, "type": "scale", "n": 3}},
                          subshell)
        kernel.comm_messages(comm_id, lambda d: _cluster(d, notice="scale to 3 after long-run"),
                             timeout=hang_limit(5))

        # Stop: the cell ends at once, saying it was stopped.
        stop_sent = time.monotonic()
        kernel.send_shell("comm_msg", {"comm_id": comm_id, "data": {"v": 1, "type": "stop_run"}},
                          subshell)
        kernel.comm_messages(comm_id, lambda d: d.get("type") == "run_ended", timeout=hang_limit(30))
        stopped_s = time.monotonic() - stop_sent
        reply = kernel.client.get_shell_msg(timeout=hang_limit(30))
        assert reply["parent_header"]["msg_id"] == run_id
        # A stop asked for is said in the cell but is no failed cell (the next one would be
        # aborted by the frontend's stop-on-error).
        assert reply["content"]["status"] == "ok"
        said = _stderr_of(kernel, run_id)
        assert "long-run was stopped (Stop in the phalanx panel)" in said, said
        print(f"the run stopped {stopped_s:.2f} s after Stop")

        # The queued scale is applied after the run; the next run works on the engines.
        kernel.comm_messages(comm_id, lambda d: _cluster(d, engines=3, notice=None), timeout=hang_limit(120))
        assert kernel.execute(SHORT_RUN)["status"] == "ok"
    finally:
        kernel.close()


def _stderr_of(kernel: Kernel, msg_id: str, timeout: float = hang_limit(10)) -> str:
    """What the cell ``msg_id`` wrote to stderr (read from IOPub until it went idle)."""
    text, deadline = [], time.monotonic() + timeout
    for msg in kernel.iopub:
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
    while time.monotonic() < deadline and not any("stopped" in t for t in text):
        try:
            msg = kernel.client.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        kernel.iopub.append(msg)
        kernel.backlog.append(msg)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
    return "".join(text)


def _wait_for_output(kernel: Kernel, msg_id: str, timeout: float = hang_limit(60)) -> None:
    """Until cell ``msg_id`` printed something (it is running); what was read is kept."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kernel.client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        kernel.iopub.append(msg)
        kernel.backlog.append(msg)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            return
    raise AssertionError(f"cell {msg_id} printed nothing within {timeout} s")


def _open_panel(kernel: Kernel, subshell: str | None) -> str:
    comm_id = uuid.uuid4().hex
    kernel.send_shell("comm_open", {"comm_id": comm_id, "target_name": "phalanx",
                                    "data": {"v": 1, "type": "request_snapshot"}}, subshell)
    return comm_id
