"""The kernel's side of the engines' control requests (``runtime/run/_control_channel.py``).

A request on ipyparallel's control channel reaches an engine even while a run keeps its shell
busy.  Each engine is asked on its own, so one that is gone or slow does not hold up the others'
answers; an answer that does not come within ``timeout`` is None.

Example::

    answers = ask_engines(cluster, [0, 1], "phalanx_stacks_request", {}, timeout=1.5)
"""

from __future__ import annotations

import time
from typing import Any


def send_request(cluster: Any, engine_id: int, msg_type: str, content: dict) -> Any:
    """Send one control request; a future of its reply message (None: the engine is gone)."""
    try:
        return cluster.client._send_control_request(targets=[engine_id], msg_type=msg_type,
                                                    content=content, block=False)
    except Exception:  # an engine ipyparallel no longer knows
        return None


def reply_of(future: Any, timeout: float | None) -> dict | None:
    """The content of a request's reply, None when none came in time or it failed."""
    if future is None:
        return None
    try:
        (reply,) = future.result(timeout=timeout)
    except Exception:
        return None
    content = reply["content"]
    return content if content.get("status") == "ok" else None


def ask_engines(cluster: Any, engine_ids: list[int], msg_type: str, content: dict,
                timeout: float) -> list[dict | None]:
    """Ask every engine at once; their answers in order, None where none came within ``timeout``."""
    futures = [send_request(cluster, engine_id, msg_type, content) for engine_id in engine_ids]
    deadline = time.monotonic() + timeout
    return [reply_of(f, max(0.0, deadline - time.monotonic())) for f in futures]
