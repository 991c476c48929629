"""What a process forked by the fork server (:mod:`._zygote`) does to become an engine, an
engine's nanny or a controller.

It keeps nothing of the zygote's serving (its sockets, its selector, its children's pidfds), takes
the requester's standard streams, working directory and environment, and then runs what a
separately started process would have run.  An engine also ends with the zygote
(``PR_SET_PDEATHSIG``) and draws fresh numbers from numpy's global generator; a nanny and a
controller get a process name of their own, as their command line is the zygote's.

Example (in the zygote's child after ``os.fork()``)::

    become("engine", None, request, fds, serving, zygote_pid, zygote_path)   # never returns
"""

from __future__ import annotations

import os
import signal
import sys

from phalanx.cluster._zygote_proxy import ENV_PID, ENV_SOCKET


def become(role: str, name: str | None, request: dict, fds: list[int], serving: list[int],
           zygote_pid: int, zygote_path: str) -> None:
    """Turn this forked child into ``role`` ("engine", "nanny" or "controller"), named ``name``
    where given: ``fds`` become its standard streams, ``serving`` (the zygote's descriptors) are
    closed.  Runs the process's whole life and never returns."""
    os.setsid()
    # A nanny outlives its engine a moment, to tell the controller; the controller outlives a
    # zygote that dies under it, so that restarted engines (then started fresh) still find it.
    # Its stand-in waits for it either way.
    if role == "engine":
        _die_with(zygote_pid)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in [*fds, *serving]:
        if fd not in (0, 1, 2):
            _close(fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(request.get("cwd") or "/")
    os.environ.clear()
    os.environ.update({k: v for k, v in request["env"].items()
                       if k not in (ENV_SOCKET, ENV_PID)})  # the engine is no proxy
    if name is not None:
        _set_name(name)  # ps and psutil then find it by name, not by the zygote's command line
    if role == "nanny":
        _run_nanny()
        os._exit(0)
    _reseed()
    from phalanx.cluster._supervise import main as supervised_main
    from phalanx.cluster._zygote_nanny import ask_for_nannies

    if role == "engine":
        ask_for_nannies(zygote_path)
    supervised_main(request["argv"])  # runs the engine or controller; never returns


def _die_with(zygote: int) -> None:
    """The engine ends when the zygote does (``PR_SET_PDEATHSIG``): a zygote killed under its
    engines takes them along, as one fault that their stand-ins report, rather than leaving
    engines that nothing stands for."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != zygote:  # it died before the signal was armed
        os._exit(1)


def _run_nanny() -> None:
    """Be an engine's nanny, as ``python -m ipyparallel.engine.nanny`` would: its arguments
    come on standard input, its address goes back on standard output (line-buffered here: the
    engine waits for that line), and it runs until its engine has exited."""
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    from ipyparallel.engine.nanny import main as nanny_main

    nanny_main()


def _set_name(name: str) -> None:
    """The process name ps and psutil's ``name()`` show, where the command line is the zygote's."""
    import ctypes

    pr_set_name = 15
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_name, name.encode())


def _reseed() -> None:
    """numpy's global generator was seeded once, in the zygote: every engine would draw the same
    numbers where separately started engines draw different ones."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
