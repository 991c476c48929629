"""``%debug`` after a failed run opens the failing rank's frames, typed as in a notebook.

A real 2-engine cluster and the real IPython shell: rank 1 raises, the next cell's ``%debug``
reads its lines from ``input()`` (the notebook's input box; here the answers are queued), and
what the debugger prints is read back from the cell's output.  The kernel test at the end
types through a real kernel's stdin channel.
"""

from __future__ import annotations

import builtins

import pytest
from conftest import run_cell
from IPython.core.error import UsageError

pytestmark = [pytest.mark.cluster]

FAILING = """%%distributed_fit --no-widget
import torch
from phalanx import allreduce
w = torch.zeros(3)
for step in range(10):
    w += allreduce(torch.ones(3), op="sum")
    if rank == 1 and step == 3:
        scale = step * 10
        raise ValueError(f"bad batch at step {step}")
"""
TRAINS = """%%distributed_fit --no-widget --return total
from phalanx import allreduce
total = allreduce(float(rank + 1), op="sum")
"""


class Typed:
    """``input()`` answered from a list, recording the prompts (the notebook's input box)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines, self.prompts = list(lines), []

    def __call__(self, prompt: str = "") -> str:
        self.prompts.append(prompt)
        if not self.lines:
            raise AssertionError("the debugger asked for more input than was typed")
        return self.lines.pop(0)


def failed_run(shell, capsys) -> str:
    capsys.readouterr()
    result = shell.run_cell(FAILING, store_history=False)
    assert result.error_in_exec is not None
    out = capsys.readouterr()
    return out.out + out.err


def debug(shell, capsys, monkeypatch, line: str, typed: list[str]) -> tuple[str, Typed]:
    answers = Typed(typed)
    monkeypatch.setattr(builtins, "input", answers)
    capsys.readouterr()
    run_cell(shell, f"%debug {line}".strip())
    out = capsys.readouterr()
    return out.out + out.err, answers


def test_debug_opens_the_failing_rank_and_the_next_run_trains(shell, two_engines, capsys,
                                                               monkeypatch):
    said = failed_run(shell, capsys)
    assert "rank 1" in said and "ValueError: bad batch at step 3" in said
    assert "%debug opens a debugger in rank 1's frames" in said, said

    text, typed = debug(shell, capsys, monkeypatch, "",
                        ["p step", "p scale", "pp {'rank': rank}", "l", "up", "q"])
    assert text.startswith("rank 1: ValueError: bad batch at step 3"), text
    assert "<distributed_fit>(9)<module>()" in text  # the editor's line number of the raise
    assert "\n3\n" in text and "\n30\n" in text and "{'rank': 1}" in text
    # `l` shows the cell's own lines, numbered as in the editor (the magic's line is line 1)
    assert "  6  \t    w += allreduce(torch.ones(3), op=\"sum\")" in text, text
    assert "Oldest frame" in text  # the cell is the top: phalanx's frames are not shown
    assert typed.prompts == ["(Pdb) "] * 6

    run_cell(shell, TRAINS)
    assert shell.user_ns["total"] == 3.0  # both ranks trained on the same warm engines


def test_debug_rank_picks_another_rank_that_raised(shell, two_engines, capsys, monkeypatch):
    failed_run(shell, capsys)
    text, _ = debug(shell, capsys, monkeypatch, "--rank 0", ["where", "q"])
    # rank 0 raised because rank 1 left its collective: its frames are there too
    assert text.startswith("rank 0: "), text
    assert "w += allreduce(" in text

    with pytest.raises(UsageError, match=r"--rank 5: the failed run had ranks 0..1"):
        debug(shell, capsys, monkeypatch, "--rank 5", [])
    with pytest.raises(UsageError, match="takes a rank number"):
        debug(shell, capsys, monkeypatch, "--rank one", [])


def test_frames_go_with_the_next_run(shell, two_engines, capsys, monkeypatch):
    failed_run(shell, capsys)
    run_cell(shell, TRAINS)  # a successful cell leaves the run's error as the last one
    with pytest.raises(UsageError, match="its frames are gone: a later run on its engine"):
        debug(shell, capsys, monkeypatch, "", [])


def test_debug_after_a_plain_error_is_ipythons(shell, capsys, monkeypatch):
    shell.run_cell("def f():\n    local_value = 41\n    1 / 0\nf()\n", store_history=False)
    text, _ = debug(shell, capsys, monkeypatch, "", ["p local_value + 1", "q"])
    assert "42" in text and "rank" not in text
    with pytest.raises(UsageError, match="the last error was not a run's"):
        debug(shell, capsys, monkeypatch, "--rank 1", [])
