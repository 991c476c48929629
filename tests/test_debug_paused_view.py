"""The live view says which rank is paused where while ``breakpoint()`` holds it.

A real 2-engine cluster, the real live view (the shell counts as a widget frontend) and the
real debugger: rank 1 stops at step 5; while its prompt waits for the person, the view's header
says "rank 1 paused at line 8"; ``p step`` prints 5, ``c`` lets the run end, and the mark goes.
"""

from __future__ import annotations

import builtins
import time

import pytest
from conftest import run_cell
from deadlines import hang_limit
from IPython.utils.capture import capture_output

from phalanx.widgets import _display, _frontend

pytestmark = [pytest.mark.cluster]

CELL = """%%distributed_fit --name bp-run --collective-timeout 2
import time
from phalanx import allreduce
total = 0.0
for step in range(8):
    total += allreduce(1.0, op="sum")
    if rank == 1 and step == 5:
        breakpoint()
"""
PAUSED = "rank 1 paused at line 8 (breakpoint)"


def test_the_live_view_says_which_rank_is_paused_where(two_engines, shell, monkeypatch, capsys):
    views: list = []
    monkeypatch.setattr(_frontend, "widgets_available", lambda shell: True)
    monkeypatch.setattr(_display, "_display", views.append)
    typed, headers, waits = ["p step", "c"], [], []

    def person(prompt: str) -> str:  # reads the view while the rank waits at its prompt
        asked = time.monotonic()
        deadline = asked + hang_limit(20)
        while not (views and PAUSED in views[0].header.value) and time.monotonic() < deadline:
            time.sleep(0.05)
        headers.append(views[0].header.value if views else "")
        waits.append(time.monotonic() - asked)
        return typed.pop(0)

    monkeypatch.setattr(builtins, "input", person)
    with capture_output() as captured:
        run_cell(shell, CELL)
    with capsys.disabled():
        print(f"the view said paused {waits[0]:.2f} s after the debugger's first prompt")
    assert "phalanx: rank 1 paused at line 8 of the cell: breakpoint()" in captured.stdout
    assert "\n5\n" in captured.stdout, captured.stdout   # p step
    assert len(headers) == 2 and all(PAUSED in h and "running" in h for h in headers), headers
    [view] = views
    assert "paused" not in view.header.value and two_engines.last_run().status == "done"
