"""Debugging a run in a real kernel, typed through its stdin channel as the notebook's input box.

One real ipykernel, one real 2-engine cluster: the tests execute cells as a frontend does and
answer each ``input_request`` (the ``(Pdb)`` prompt) with the next line a person would type;
what the debugger says is read from the cell's output on IOPub.
"""

from __future__ import annotations

import os
import time

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
THINK, THINK_S = "(think) ", 3.0  # longer than the runs' --collective-timeout 1
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
            line = lines.pop(0)
            if line.startswith(THINK):  # a person taking their time before typing
                time.sleep(THINK_S)
                line = line[len(THINK):]
            self.typed_at = time.monotonic()
            self.client.input(line)

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


def training(stop: str = "") -> str:
    """A seeded loop whose result depends on every step of both ranks; ``stop`` goes at step 5
    of rank 1."""
    return f"""%%distributed_fit --no-widget --seed 0 --return w --collective-timeout 1
import torch
from phalanx import allreduce
w = torch.zeros(4)
for step in range(10):
    w -= 0.1 * allreduce(torch.randn(4), op="mean")
    if rank == 1 and step == 5:
        {stop or "pass"}
"""


def returned_w(notebook) -> list[float]:
    reply, shown, _ = notebook.run("print(w.tolist())")
    assert reply["status"] == "ok", shown
    return [float(x) for x in shown.strip().strip("[]").split(",")]


def test_breakpoint_then_continue_trains_as_without_it(notebook):
    reply, shown, _ = notebook.run(training())
    assert reply["status"] == "ok", shown
    expected = returned_w(notebook)

    # rank 0 waits in its allreduce longer than its collective timeout while the person thinks
    reply, shown, prompts = notebook.run(training("breakpoint()"),
                                         ["p step", "p rank", THINK + "c"])
    assert reply["status"] == "ok", shown
    assert "phalanx: rank 1 paused at line 8 of the cell: breakpoint()" in shown, shown
    assert "the other ranks wait at their next collective" in shown
    assert "\n5\n1\n" in shown, shown
    assert prompts == ["(Pdb) "] * 3
    assert returned_w(notebook) == expected  # the same parameters as without the breakpoint


def test_quitting_the_debugger_ends_the_run_and_the_engines_train_at_once(notebook):
    reply, shown, _ = notebook.run(training("phalanx.breakpoint(rank=1)").replace(
        "import torch\n", "import torch, phalanx\n"), ["p step", "q"])
    ended_s = time.monotonic() - notebook.typed_at
    assert reply["status"] == "ok", shown  # ended on purpose: no failed cell
    said = [line for line in shown.splitlines() if line.startswith("phalanx: rank 1 ended")]
    assert said == ["phalanx: rank 1 ended the run from its debugger (q) at step 0 after "
                    + said[0].split(" after ")[1]], shown
    assert "every rank was released and the engines are ready" in said[0]
    assert "Traceback" not in shown and "BdbQuit" not in shown, shown

    reply, shown, _ = notebook.run("%cluster stacks")
    assert shown.count("idle (no run)") == 2, shown  # nothing of the run is left on the engines
    reply, shown, _ = notebook.run(TRAINS)
    assert reply["status"] == "ok", shown
    print(f"q to the cell's end: {ended_s:.2f} s; the next run after it: "
          f"{time.monotonic() - notebook.typed_at - ended_s:.2f} s (stacks check included)")
