"""An engine forked by the zygote (:mod:`._zygote`) has its nanny forked there too.

ipyparallel's engine starts a *nanny* once it has registered: a process that relays the signals
sent through the controller (phalanx's interrupts) and tells the controller as soon as the
engine exits.  ipyparallel starts it as ``python -m ipyparallel.engine.nanny``, a fresh
interpreter that imports ipyparallel first: about 0.4 s of CPU per engine, as much as the forked
engine itself uses to start.  The zygote has those imports done, so a forked engine asks it for
the nanny over the zygote's socket, passing the two pipes ipyparallel would have given the
nanny; the nanny is then the zygote's child, named ``phalanx-nanny``, and runs ipyparallel's own
nanny code.  Where the zygote cannot answer (it ended, or refused) or the forked nanny ends
without answering, ipyparallel starts the nanny as usual.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
from typing import Any

from ._zygote_proxy import unix_address

REPLY_MAX = 65536


class ForkedNanny:
    """What the engine keeps of its nanny (ipyparallel keeps the handle it gets and never uses
    it): the engine's end of the pipe the nanny answered on.  The nanny watches that pipe, so it
    must stay open for as long as the engine runs; its closing says the engine is gone."""

    def __init__(self, pid: int, answers: Any) -> None:
        self.pid, self.answers = pid, answers


def ask_for_nannies(zygote_path: str) -> None:
    """Make this (forked) engine ask the zygote at ``zygote_path`` for its nanny."""
    from ipyparallel.engine import app

    fresh = app.start_nanny

    def start_nanny(**kwargs: Any) -> tuple[str, Any]:
        started = fork_nanny(zygote_path, kwargs)
        return started if started is not None else fresh(**kwargs)

    app.start_nanny = start_nanny


def fork_nanny(zygote_path: str, kwargs: dict) -> tuple[str, ForkedNanny] | None:
    """The nanny's address and handle, as ipyparallel's ``start_nanny`` returns them; ``None``
    where the zygote did not fork it (the caller then starts one itself)."""
    kwargs = {**kwargs, "pid": os.getpid()}
    arguments_in, arguments_out = os.pipe()   # the nanny's standard input
    answers_in, answers_out = os.pipe()       # the nanny's standard output
    try:
        pid = _request(zygote_path, [arguments_in, answers_out, 2])
    finally:
        os.close(arguments_in)
        os.close(answers_out)
    if pid is None:
        os.close(arguments_out)
        os.close(answers_in)
        return None
    with os.fdopen(arguments_out, "wb") as arguments:
        arguments.write(pickle.dumps(kwargs))
    answers = os.fdopen(answers_in, "rb")
    url = answers.readline().decode().strip()
    if not url:  # it ended before answering (its error is on the engine's stderr)
        answers.close()
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        return None  # ipyparallel starts one itself, and fails as it would if that fails too
    return url, ForkedNanny(pid, answers)


def _request(zygote_path: str, fds: list[int]) -> int | None:
    """Ask the zygote to fork a nanny on ``fds`` (its standard streams); its pid, or ``None``."""
    request = {"kind": "nanny", "env": dict(os.environ), "cwd": os.getcwd()}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            with unix_address(zygote_path) as address:
                conn.connect(address)
            socket.send_fds(conn, [json.dumps(request).encode()], fds)
            reply = json.loads(conn.recv(REPLY_MAX) or b"{}")
    except (OSError, ValueError):
        return None
    return int(reply["pid"]) if "pid" in reply else None
