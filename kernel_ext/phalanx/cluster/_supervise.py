"""Run an ipyparallel controller or engine that cannot outlive its kernel.

ipyparallel starts the controller and local engines in sessions of their own (so a notebook
interrupt does not reach them), which also means nothing stops them when the kernel is SIGKILLed
or crashes: engines would notice the lost controller after their heartbeats run out, but the
controller itself would run forever.  phalanx therefore starts both through this file, run as
a script (so that starting a controller never depends on importing phalanx itself)::

    python .../phalanx/cluster/_supervise.py ipyparallel.controller --ip=127.0.0.1 ...

It does two things before handing over to ipyparallel's own entry point:

* ``umask 077``: ipyparallel writes its connection files (which hold the cluster's keys) and
  *then* chmods them to 0600; with a private umask they are owner-only from the moment they exist;
* a watchdog thread: when the process named by ``PHALANX_PARENT_PID`` (the kernel) is gone, it
  stops this process's children (the controller's schedulers, an engine's nanny) and exits.
"""

from __future__ import annotations

import os
import runpy
import select
import sys
import threading
import time
import traceback

PARENT_PID = "PHALANX_PARENT_PID"
PARENT_START = "PHALANX_PARENT_START"   # the parent's start time: a reused pid is not our kernel
POLL_S = 0.5                            # only where a pidfd cannot be had
ENTRY_POINTS = ("ipyparallel.controller", "ipyparallel.engine")
# what tornado raises in an engine that SIGTERM stopped (it logged the signal): no traceback
STOPPED = "Event loop stopped before Future completed."


def parent_env() -> dict[str, str]:
    """What a supervised child needs to know about this (the kernel's) process."""
    pid = os.getpid()
    started = _start_ticks(pid)
    return {PARENT_PID: str(pid), **({PARENT_START: str(started)} if started is not None else {})}


def _start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``); ``None`` once it
    has exited (a zombie included).  The standard library only: every engine's and controller's
    stand-in runs this, and psutil's import alone costs it 0.05 s of CPU."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def parent_alive(pid: int, started: int | None) -> bool:
    """Whether ``pid`` still runs and is the process that started us (not a reused pid)."""
    if not os.path.isdir("/proc/self"):  # no procfs (macOS): psutil, without the start check
        import psutil

        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    ticks = _start_ticks(pid)
    return ticks is not None and (started is None or ticks == started)


def _stop_children_and_exit() -> None:
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=2)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    os._exit(70)  # no cleanup: the kernel that would read our state is gone


def _watch(pid: int, started: int | None) -> None:
    """Return once the parent has ended: a pidfd wakes this thread only then (no polling, which
    every engine, controller and stand-in would otherwise do twice a second for its whole life)."""
    try:
        parent = os.pidfd_open(pid)
    except (AttributeError, OSError):  # gone already, or no pidfds here: poll
        parent = None
    if parent is not None:
        if parent_alive(pid, started):  # checked after opening: the fd is our parent's
            waiter = select.poll()
            waiter.register(parent, select.POLLIN)
            waiter.poll()  # readable once it has exited
        os.close(parent)
        return
    while parent_alive(pid, started):
        time.sleep(POLL_S)


def _watch_then_stop(pid: int, started: int | None) -> None:
    _watch(pid, started)
    sys.stderr.write(f"phalanx: the kernel (pid {pid}) is gone; stopping\n")
    sys.stderr.flush()
    _stop_children_and_exit()


def start_watchdog(environ: dict | None = None) -> threading.Thread | None:
    """Start the parent watchdog when the environment names a parent; returns the thread."""
    env = os.environ if environ is None else environ
    if not env.get(PARENT_PID):
        return None
    started = int(env[PARENT_START]) if env.get(PARENT_START) else None
    thread = threading.Thread(target=_watch_then_stop, args=(int(env[PARENT_PID]), started),
                              name="phalanx-parent-watchdog", daemon=True)
    thread.start()
    return thread


def command(entry_point: str) -> list[str]:
    """The command line that runs ``entry_point`` supervised, with this interpreter."""
    return [sys.executable, os.path.abspath(__file__), entry_point]


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ENTRY_POINTS:
        raise SystemExit(f"usage: python _supervise.py {{{'|'.join(ENTRY_POINTS)}}} [ARGS...]")
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run as a script: its folder must not shadow anything
    os.umask(0o077)
    start_watchdog()
    module = argv[0]
    if os.environ.get("PHALANX_ZYGOTE"):
        _forked_by_zygote(argv)  # returns only where it must start here after all
    sys.argv = [module] + argv[1:]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.__stderr__)
    except RuntimeError as exc:  # ipyparallel's engine ends this way when stopped by SIGTERM
        if str(exc) != STOPPED:
            traceback.print_exc(file=sys.__stderr__)
        code = 1
    except BaseException:
        traceback.print_exc(file=sys.__stderr__)
        code = 1
    _exit_now(code)


def _forked_by_zygote(argv: list[str]) -> None:
    """Have the kernel's zygote fork this engine or controller (:mod:`._zygote`) and end as it
    ends."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_zygote_proxy.py")
    spec = importlib.util.spec_from_file_location("_phalanx_zygote_proxy", path)
    if spec is None or spec.loader is None:
        return
    proxy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(proxy)
    outcome = proxy.run_forked(argv)
    if outcome is not None:
        proxy.exit_like(outcome)


def _exit_now(code: int) -> None:
    """Exit without tearing down the interpreter: with torch imported, the teardown's garbage
    collection alone takes over a second, and nothing here needs it.  What a normal exit would
    still do that matters, runs first: the atexit handlers and flushing the process's own
    output (the log file); ``sys.stdout`` may still be the engine's stream to the kernel, whose
    flush would wait for a publisher that has stopped."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
