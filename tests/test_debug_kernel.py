"""Debugging a run in a real kernel, typed through its stdin channel as the notebook's input box.

One real ipykernel, one real 2-engine cluster: the tests execute cells as a frontend does and
answer each ``input_request`` (the ``(Pdb)`` prompt) with the next line a person would type;
what the debugger says is read from the cell's output on IOPub.
"""

from __future__ import annotations

import os

import pytest
from deadlines import hang_limit
from kernel_support import kernel_manager

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

FAILING = """%%distributed_fit --no-widget
from phalanx import allreduce
for step in range(10):
    allreduce(1.0)
    if rank == 1 and step == 4:
        lr = 0.5 * step
        raise RuntimeError("diverged")
"""
TRAINS = """%%distributed_fit --no-widget --return total
from phalanx import allreduce
total = allreduce(float(rank + 1), op="sum")
"""


class Notebook:
    """A real kernel driven as a frontend does: cells, their output, the input box."""

    def __init__(self) -> None:
        self.km = kernel_manager()
        self.km.start_kernel(env=dict(os.environ))
        self.client = self.km.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=hang_limit(60))

    def run(self, code: str, typed: list[str] | None = None,
            timeout: float = hang_limit(180)) -> tuple[dict, str, list[str]]:
        """Execute ``code``, typing ``typed`` into the input box line by line; returns the
        reply's content, the cell's text output and the prompts shown."""
        out: list[str] = []
        prompts: list[str] = []
        lines = list(typed or [])

        def on_output(msg: dict) -> None:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(content["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(content["traceback"]) + "\n")
            elif msg["msg_type"] in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", "") + "\n")

        def on_input(msg: dict) -> None:
            prompts.append(msg["content"]["prompt"])
            assert lines, f"the kernel asked for input ({msg['content']['prompt']!r}) after " \
                          f"everything typed was used; output so far: {''.join(out)}"
            self.client.input(lines.pop(0))

        reply = self.client.execute_interactive(code, timeout=timeout, allow_stdin=True,
                                                output_hook=on_output, stdin_hook=on_input)
        return reply["content"], "".join(out), prompts

    def close(self) -> None:
        try:
            self.run("import phalanx\nphalanx.get_session().close()", timeout=hang_limit(60))
        finally:
            self.client.stop_channels()
            self.km.shutdown_kernel(now=False)
            self.km.cleanup_resources()


@pytest.fixture(scope="module")
def notebook():
    nb = Notebook()
    try:
        reply, out, _ = nb.run("%load_ext phalanx\n%cluster start -n 2 --gpus none")
        assert reply["status"] == "ok", out
        yield nb
    finally:
        nb.close()


def test_post_mortem_through_the_input_box(notebook):
    reply, said, _ = notebook.run(FAILING)
    assert reply["status"] == "error"
    assert "rank 1" in said and "RuntimeError: diverged" in said
    assert "%debug opens a debugger in rank 1's frames" in said

    reply, shown, prompts = notebook.run("%debug", ["p lr", "p step", "q"])
    assert reply["status"] == "ok", shown
    assert prompts == ["(Pdb) "] * 3
    assert shown.startswith("rank 1: RuntimeError: diverged"), shown
    assert "-> raise RuntimeError(\"diverged\")" in shown
    assert "\n2.0\n4\n" in shown, shown

    reply, shown, _ = notebook.run(TRAINS + "\n")
    assert reply["status"] == "ok", shown
    reply, shown, _ = notebook.run("total")
    assert "3.0" in shown
