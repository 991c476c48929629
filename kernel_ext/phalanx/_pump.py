"""Serve the kernel's comm messages from inside a running cell, where the kernel has no subshells.

A kernel with subshells (ipykernel 7) hands the panel's and the widgets' comm messages to
another thread while a cell runs.  Without them every message waits on the one shell channel
behind the running cell, so the run's wait loop calls :meth:`ShellPump.__call__` at each poll:
it reads what is pending on the shell socket, handles comm messages at once (the panel's
requests, ipywidgets' button clicks) and hands everything else (the next cells) back to the
kernel's own loop, in order, to run after this cell as it would have.

The running cell's parent message is restored after each handled message, so the cell's own
output still lands under the cell.

Example::

    pump = shell_pump(kernel)          # None where the kernel has subshells
    if pump is not None:
        session.serve_messages_during_runs(pump)
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("phalanx")

COMM_TYPES = ("comm_open", "comm_msg", "comm_close")
MAX_PER_CALL = 50  # a burst of widget messages must not starve the wait loop's own work


def answer_where_sent(comm: Any) -> None:
    """Let the frontend pick the subshell that handles ``comm``'s messages.

    ipykernel 7 routes a comm's incoming messages to the subshell that last *sent* on it.  Our
    views send from timer and receiver threads, which count as the main shell, so a click
    would wait behind the running cell although the frontend sent it on a subshell.

    Example::

        answer_where_sent(button.comm)   # its clicks are handled during a run
    """
    if comm is not None:
        comm._reply_subshell_for = lambda data, chosen: chosen


def has_subshells(kernel: Any) -> bool:
    """Whether ``kernel`` runs comm messages on subshell threads (JEP 91)."""
    return bool(getattr(kernel, "_supports_kernel_subshells", False))


def shell_pump(kernel: Any) -> "ShellPump | None":
    """A pump for ``kernel``, or None where it has subshells (or is no ZMQ kernel at all)."""
    if kernel is None or has_subshells(kernel) or getattr(kernel, "shell_stream", None) is None:
        return None
    return ShellPump(kernel)


class ShellPump:
    """Handle pending comm messages of a subshell-less kernel; defer the rest (main thread only)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.handled = 0   # comm messages served from inside a cell (tests and logs read it)
        self.deferred = 0  # other messages handed back to the kernel's loop

    def __call__(self) -> None:
        import threading

        import zmq

        if threading.current_thread() is not threading.main_thread():
            return  # the shell socket belongs to the main thread
        socket = self.kernel.shell_stream.socket
        for _ in range(MAX_PER_CALL):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._one(frames)

    def _one(self, frames: list) -> None:
        kernel = self.kernel
        try:
            idents, rest = kernel.session.feed_identities(frames, copy=False)
            msg = kernel.session.deserialize(rest, content=True, copy=False)
        except Exception:
            log.warning("phalanx: dropping an unreadable shell message", exc_info=True)
            return
        if msg["header"].get("msg_type") not in COMM_TYPES:
            self._defer(frames)
            return
        handler = kernel.shell_handlers.get(msg["header"]["msg_type"])
        parent_ident = kernel._get_shell_context_var(kernel._shell_parent_ident)
        parent = kernel.get_parent("shell")
        try:
            kernel.set_parent(idents, msg, channel="shell")
            handler(kernel.shell_stream, idents, msg)
            self.handled += 1
        except Exception:
            log.exception("phalanx: a comm message failed while a cell ran")
        finally:
            kernel.set_parent(parent_ident, parent, channel="shell")

    def _defer(self, frames: list) -> None:
        # The kernel's loop is blocked by this very cell: what is scheduled now runs after it,
        # before anything the loop reads from the socket later, so the order is kept.
        from functools import partial

        self.deferred += 1
        self.kernel.io_loop.add_callback(partial(self.kernel.shell_main, None, frames))
