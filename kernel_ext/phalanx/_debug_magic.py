"""``%debug`` after a failed ``%%distributed_fit``: IPython's own magic, taught about ranks.

When the last error of the notebook is a run that failed on a rank, ``%debug`` opens a
debugger on that rank's frames on its engine (``%debug --rank R`` on another rank that
raised); every other use of ``%debug`` (a plain cell's error, ``%debug statement``,
``%%debug``) is IPython's, unchanged.

Example::

    %debug            # rank 1 raised: (Pdb) on rank 1's frames, typed in the input box
    %debug --rank 0   # rank 0's frames (it raised too)
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from IPython.core.error import UsageError

from ._session import session_for_shell
from .fit.debug._post_mortem import DebugUnavailable, post_mortem


def register_debug(ipython: Any) -> None:
    """Put phalanx's ``%debug`` in front of IPython's (which it delegates to)."""
    manager = ipython.magics_manager
    # IPython loads its magics lazily: resolve its %debug now, before ours takes the name
    find = getattr(manager, "find", None)
    original = find("line", "debug") if find is not None else manager.magics["line"].get("debug")
    original = getattr(original, "ipython_debug", original)  # loaded twice: wrap IPython's once

    def debug(line: str = "", local_ns: Any = None) -> Any:
        """IPython's ``%debug``; after a failed ``%%distributed_fit``, a debugger on the
        failing rank's frames (``%debug --rank R``: another rank that raised)."""
        rank, rest = _rank_flag(line)
        target = getattr(_last_error(), "debug_target", None)
        if target is None:
            if rank is not None:
                raise UsageError("%debug --rank R opens a rank's frames after a "
                                 "%%distributed_fit cell failed; the last error was not a run's")
            return _delegate(original, line, local_ns)
        if rest:
            raise UsageError(f"%debug after a failed run takes only --rank R, not {rest!r}")
        try:
            post_mortem(session_for_shell(ipython).cluster, target, rank)
        except DebugUnavailable as exc:
            raise UsageError(str(exc)) from None
        return None

    debug.needs_local_scope = True  # type: ignore[attr-defined]  # as IPython's: local_ns
    debug.ipython_debug = original  # type: ignore[attr-defined]
    ipython.register_magic_function(debug, "line", "debug")


def _delegate(original: Callable | None, line: str, local_ns: Any) -> Any:
    if original is None:
        raise UsageError("IPython's %debug is not available in this shell")
    return original(line, local_ns=local_ns)


def _last_error() -> BaseException | None:
    """The notebook's last error (IPython keeps it where ``pdb.pm()`` looks)."""
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def _rank_flag(line: str) -> tuple[int | None, str]:
    """``--rank R`` (or ``--rank=R``) out of ``line``; (rank or None, the rest)."""
    words = line.replace("--rank=", "--rank ").split()
    if "--rank" not in words:
        return None, line.strip()
    at = words.index("--rank")
    value = words[at + 1] if at + 1 < len(words) else None
    if value is None or not value.isdigit():
        raise UsageError(f"%debug --rank takes a rank number (0, 1, ...), got {value!r}")
    rest = words[:at] + words[at + 2:]
    return int(value), " ".join(rest)
