"""The line a ``%cluster start`` or ``%cluster scale`` cell shows while engines come up.

Starting a cluster takes seconds to tens of seconds (a controller, then engines that import
torch and answer a probe); the cell used to stay blank until the engine table came.  The line
says what is under way and is then replaced by the table (see :mod:`._status_line`).

Example::

    >>> change_text("%cluster start", (0, 0), 2.0)
    '%cluster start: starting the controller · 2 s'
    >>> change_text("%cluster start", (1, 4), 9.4)
    '%cluster start: 1 of 4 engines answered · 9 s'
"""

from __future__ import annotations

from typing import Any, Callable

from ._status_line import StatusLine

DOT = " · "


def change_text(what: str, engines: tuple[int, int], seconds: float) -> str:
    """``what`` (the magic's words), how many engines answered, and for how long it has gone."""
    answered, launched = engines
    doing = (f"{answered} of {launched} engine{'s' * (launched != 1)} answered" if launched
             else "starting the controller" if what.endswith("start") else "starting engines")
    return f"{what}: {doing}{DOT}{seconds:.0f} s"


def follow_change(line: StatusLine | None, what: str,
                  engines: Callable[[], tuple[int, int]]) -> None:
    """Keep ``line`` (None: no frontend) saying how a start or scale goes until replaced."""
    if line is not None:
        line.follow(lambda seconds: change_text(what, engines(), seconds))


def show_result(line: StatusLine | None, result: Any, show: Callable[[Any], None]) -> None:
    """``result`` (the engine table) in the line's place, else shown as usual."""
    if line is None:
        show(result)
    else:
        line.replace_with(result)
