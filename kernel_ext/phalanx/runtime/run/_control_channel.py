"""Requests an engine answers on ipyparallel's control channel, even while a run keeps it busy.

ipyparallel serves an engine's control channel on a thread of its own (it is how interrupts
reach a busy engine), separate from the shell channel the run occupies.  :func:`answer_on_control`
teaches that thread one more request type; the answer is computed there, from state the run
shares (``engine_state()``), so a handler installed once serves every later run.  The kernel
sends them with :func:`phalanx.fit.run._engine_control.ask_engines`.

Example::

    answer_on_control("phalanx_stacks_request", lambda content: rank_stack())
"""

from __future__ import annotations

import sys
from typing import Any, Callable


def answer_on_control(msg_type: str, answer: Callable[[dict], dict]) -> bool:
    """Answer ``msg_type`` requests with ``answer(content)`` (status ok, or error with the
    exception); False where this process is no ipyparallel engine.  Installed once per type."""
    kernel = _engine_kernel()
    if kernel is None:
        return False
    if msg_type not in kernel.control_handlers:
        reply_type = msg_type.replace("_request", "_reply")

        def handler(stream: Any, ident: Any, parent: Any) -> None:
            try:
                content = {"status": "ok", **answer(parent["content"])}
            except Exception as exc:  # said to the kernel; the engine goes on
                content = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            kernel.session.send(stream, reply_type, content, parent=parent, ident=ident)

        kernel.control_handlers[msg_type] = handler
    return True


def _engine_kernel() -> Any:
    """The ipyparallel kernel of this engine process, if it is one (without importing it)."""
    kernelbase = sys.modules.get("ipykernel.kernelbase")
    if kernelbase is None or not kernelbase.Kernel.initialized():
        return None
    kernel = kernelbase.Kernel.instance()
    return kernel if hasattr(kernel, "control_handlers") else None
