"""The engine process ipyparallel launched, standing for an engine forked by the zygote.

:mod:`._supervise` calls :func:`run_forked` when the environment names a zygote
(:mod:`._zygote`).  It returns ``None`` when the engine should start here as usual instead: no
zygote (it died, or never got ready), or one that refused (an environment it cannot serve).
Otherwise it passes this process's standard streams, environment, working directory and
arguments to the zygote, forwards every signal it gets to the forked engine, and returns how
the engine ended, which the caller makes its own exit: ipyparallel, the warden and the tests
see the engine's end as this process's end.

Only the standard library is used: the supervised command runs as a script, before phalanx may
be importable.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator

ENV_SOCKET = "PHALANX_ZYGOTE"       # the same names as in ._zygote (not imported: see above)
ENV_PID = "PHALANX_ZYGOTE_PID"
READY_WAIT_S = 120.0                # the zygote imports torch first: seconds on a busy machine
POLL_S = 0.02
# A Unix socket's address holds 107 bytes on Linux; a longer path (a deep TMPDIR) is reached
# through the socket's directory opened as a file descriptor (see unix_address).
MAX_ADDRESS = 107
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGCONT)


def run_forked(argv: list[str], environ: dict | None = None) -> tuple[str, int] | None:
    """Have the zygote fork the engine for ``argv``; ``("exit", code)`` or ``("signal", n)``
    once it ended, ``None`` where this process should run the engine itself."""
    env = dict(os.environ if environ is None else environ)
    conn = _connect(env.get(ENV_SOCKET), env.get(ENV_PID))
    if conn is None:
        return None
    with conn:
        request = {"argv": list(argv), "env": env, "cwd": os.getcwd()}
        try:
            socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
            reply = json.loads(conn.recv(65536) or b"{}")
        except (OSError, ValueError) as exc:
            _say(f"the zygote did not answer ({exc}); starting the engine here")
            return None
        if "pid" not in reply:
            _say(f"the zygote cannot fork this engine: {reply.get('refused', 'no reason')}; "
                 "starting it here")
            return None
        pid = int(reply["pid"])
        _forward_signals_to(pid)
        try:
            outcome = json.loads(conn.recv(65536) or b"{}")
        except (OSError, ValueError):
            outcome = {}
    if "signal" in outcome:
        return "signal", int(outcome["signal"])
    if "exit" in outcome:
        return "exit", int(outcome["exit"])
    # The zygote went first (killed): the operating system ends its engines with it (they are
    # its children, with SIGKILL as their parent-death signal); a controller lives on.  Stand
    # for this one until it is gone (its exit status went to the zygote, which is gone too).
    _wait_gone(pid)
    _say(f"the fork server is gone, and process {pid} it forked has ended")
    return "signal", signal.SIGKILL


def exit_like(outcome: tuple[str, int]) -> None:
    """End this process as the engine ended: the same exit code, or killed by the same signal."""
    kind, value = outcome
    sys.stdout.flush()
    sys.stderr.flush()
    if kind == "signal":
        if value not in (signal.SIGKILL, signal.SIGSTOP):  # those two keep their action anyway
            signal.signal(value, signal.SIG_DFL)
        os.kill(os.getpid(), value)
        os._exit(128 + value)  # a signal that does not end a process by default
    os._exit(value)


def _connect(path: str | None, zygote_pid: str | None) -> socket.socket | None:
    """Connect once the zygote listens; ``None`` if it is gone or never gets ready."""
    if not path or not zygote_pid:
        return None
    deadline = time.monotonic() + READY_WAIT_S
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with unix_address(path) as address:
                conn.connect(address)
            return conn
        except OSError:
            conn.close()
        if not _alive(int(zygote_pid)):
            _say("the zygote is gone; starting the engine here")
            return None
        if time.monotonic() > deadline:
            _say(f"the zygote was not ready within {READY_WAIT_S:.0f} s; starting the engine here")
            return None
        time.sleep(POLL_S)


@contextlib.contextmanager
def unix_address(path: str) -> Iterator[str]:
    """An address for binding or connecting to the Unix socket at ``path``, however long.

    A path longer than an address holds is reached as ``/proc/self/fd/N/NAME``, N being its
    directory opened for the time of the call (the kernel resolves that link to the directory
    itself), so the fork server also works where TMPDIR is deep, instead of every engine then
    importing torch on its own.
    """
    if len(os.fsencode(path)) <= MAX_ADDRESS:
        yield path
        return
    folder = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{os.path.basename(path)}"
    finally:
        os.close(folder)


def _wait_gone(pid: int) -> None:
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [])  # readable once the process has exited
    finally:
        os.close(fd)


def _forward_signals_to(pid: int) -> None:
    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)


def _alive(pid: int) -> bool:
    """Whether the zygote runs (a zombie does not).  Like ``runtime.transport.process_alive``,
    which this script cannot import (it runs before phalanx is importable)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by the kernel) is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _say(text: str) -> None:
    print(f"phalanx: {text}", file=sys.stderr, flush=True)
