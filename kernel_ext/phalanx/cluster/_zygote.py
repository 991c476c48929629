"""A fork server for local CPU engines: torch is imported once per kernel, not once per engine.

A fresh engine process spends about 5 s of CPU importing ipyparallel's engine, torch, torch's
compiler front end (every optimizer's first ``add_param_group`` imports ``torch._dynamo``) and
phalanx's runtime before it can run a first training cell; two engines on two cores pay that
twice at every ``%cluster start``, and again for every engine a restart or a scale-up brings.
This process (the *zygote*) pays it once, while the first controller starts, and then forks each
engine from its already-imported state, for this cluster and the kernel's next ones::

    python .../phalanx/cluster/_zygote.py SOCKET [IDLE_S]

It listens on a Unix socket (``SEQPACKET``) inside a private 0700 directory of the kernel's, so
nothing listens on the network and only the user can ask it for anything.  The process that
ipyparallel launches for an engine stays the usual supervised command (:mod:`._supervise`); it
asks the zygote for the engine (:mod:`._zygote_proxy`) and stands for it: it passes its standard
streams, environment, working directory and arguments, forwards the signals it gets, and exits
as the engine exits.  A proxy that is killed takes its engine with it, and so does a zygote
that is killed: a stand-in never outlives its engine, nor an engine its stand-in.  A forked
engine asks the zygote, over the same socket, for its ipyparallel *nanny* too
(:mod:`._zygote_nanny`): the nanny's own start is a fresh interpreter importing ipyparallel.
A kernel's later clusters have their controller forked here as well (it imports in 0.02 s what
costs a fresh controller about 0.75 s of CPU); the first starts fresh, as the zygote is still
importing then.  A controller does not die with the zygote: engines restarted after a zygote
was killed start fresh and join it.  What a forked process does to become an engine, a nanny or
a controller is in :mod:`._zygote_child`.

What is shared by forking is only what importing creates.  The zygote never computes, creates no
thread and initialises no CUDA: it serves CPU engines only (a GPU engine always starts fresh, as
CUDA state must not cross a fork).  Each engine gets its own session, the proxy's environment
(the zygote refuses a request whose environment differs from its own in a variable read at
import time, below: what was read then would be wrong) and a fresh seed for numpy's global
generator (Python's ``random`` reseeds itself after a fork).

The zygote ends with the kernel (a pidfd on the kernel's process), on SIGTERM, or once it has
served no engine for ``IDLE_S`` seconds (a stopped cluster's fork server does not hold its memory
for good), killing the engines it forked that still run, and removes its socket's directory.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import sys
import traceback

ENV_SOCKET = "PHALANX_ZYGOTE"        # where the proxy asks (set in the engines' environment)
ENV_PID = "PHALANX_ZYGOTE_PID"       # ... and which process answers: dead means start fresh
MAX_MESSAGE = 1 << 20                # a request: arguments and environment, as JSON
NANNY_NAME = "phalanx-nanny"         # the process name of a nanny forked here
CONTROLLER_NAME = "phalanx-control"  # ... and of a controller (15 bytes: the most a name holds)
# Variables that what the zygote imports reads at import time (the interpreter's paths and
# flags, the dynamic loader, the thread pools of OpenMP, MKL and OpenBLAS that load with torch and
# numpy, torch's own switches, the debugger ipykernel loads): an engine whose environment differs
# from the zygote's in one of these starts as a separate process.  Any other variable is simply
# the engine's own: the forked engine gets the environment its launcher gave it, whole.
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "NPY_",
                        "NUMPY_", "TORCH", "PYTORCH_", "MALLOC_", "GLIBC_", "PYDEVD_", "DEBUGPY_")
# What an engine imports from its start to the end of its first run, and what a controller
# imports.  Whatever a forked process still imports costs that CPU in every one: the kernel's
# debugger (debugpy, about 140 modules and 0.13 s, a third of an engine's own start-up,
# measured) and the modules a first run loads.
PRELOAD = ("ipyparallel.engine.app", "ipyparallel.engine.nanny", "ipyparallel.controller.app",
           "ipykernel.debugger", "IPython.extensions.storemagic", "IPython.core.completerlib",
           "sqlite3", "numpy", "torch", "torch._dynamo", "torch.distributed", "cloudpickle",
           "phalanx.fit", "phalanx.runtime.run._entry", "phalanx.runtime.sync._grad_sync",
           "phalanx.runtime.sync._strategies", "phalanx.runtime.telemetry._metrics",
           "phalanx.runtime.telemetry._profile",
           "phalanx.runtime.transport._comm", "phalanx.runtime.transport._comm_torch",
           "phalanx.runtime.transport._shm", "phalanx.cluster._supervise",
           "phalanx.cluster._zygote_nanny", "phalanx.cluster._zygote_child")


def read_at_import(key: str) -> bool:
    """Whether ``key`` may have been read while the zygote imported (then it must not differ)."""
    return key.startswith(IMPORT_TIME_PREFIXES)


def environment_mismatch(mine: dict[str, str], wanted: dict[str, str]) -> str | None:
    """Why an engine with environment ``wanted`` cannot be forked from a process with ``mine``.

    >>> environment_mismatch({"PATH": "/bin", "OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "1"})
    >>> environment_mismatch({"PYTHONPATH": "a"}, {"PYTHONPATH": "b", "OMP_NUM_THREADS": "2"})
    'its environment differs in OMP_NUM_THREADS, PYTHONPATH'
    """
    keys = sorted(k for k in set(mine) | set(wanted)
                  if read_at_import(k) and mine.get(k) != wanted.get(k))
    return f"its environment differs in {', '.join(keys)}" if keys else None


def preload() -> list[str]:
    """Import what every engine imports; returns what could not be imported (left to each
    engine, which then fails or copes as it would have anyway)."""
    import importlib

    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:
            missing.append(name)
    return missing


def cuda_touched() -> bool:
    """Whether anything imported initialised CUDA (the zygote would then fork nothing)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and cuda.is_initialized())


class Zygote:
    """The serving loop: one connection per engine, single-threaded (forking stays safe)."""

    def __init__(self, path: str, kernel_pid: int | None, idle_s: float | None = None) -> None:
        self.path, self.idle_s = path, idle_s
        self.env = dict(os.environ)
        self.refusal: str | None = None
        self.selector = selectors.DefaultSelector()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.getpid()
        self.engines: dict[int, tuple[socket.socket, int]] = {}  # pidfd -> (connection, pid)
        self.nannies: dict[int, int] = {}  # pidfd -> pid of an engine's nanny (reaped here)
        # The kernel's end is seen at once through a pidfd (the kernel starts a zygote only
        # where pidfds exist); opening it fails only if the kernel is already gone.
        self.kernel_fd = os.pidfd_open(kernel_pid) if kernel_pid is not None else None

    def serve(self) -> None:
        from phalanx.cluster._zygote_proxy import unix_address

        with unix_address(self.path) as address:
            self.server.bind(address)
        self.server.listen(64)
        self.selector.register(self.server, selectors.EVENT_READ, "accept")
        if self.kernel_fd is not None:
            self.selector.register(self.kernel_fd, selectors.EVENT_READ, "kernel")
        while True:
            events = self.selector.select(self._idle_left())
            if not events and not self.engines:
                return  # idle for idle_s: the next cluster starts another zygote
            for key, _ in events:
                kind = key.data
                if kind == "kernel":
                    return
                if kind == "accept":
                    conn, _ = self.server.accept()
                    self.selector.register(conn, selectors.EVENT_READ, "request")
                elif kind == "request":
                    self._request(key.fileobj)  # type: ignore[arg-type]
                elif kind == "proxy":
                    self._proxy_gone(key.fileobj)  # type: ignore[arg-type]
                elif kind == "engine":
                    self._engine_exited(key.fd)
                elif kind == "nanny":
                    self._nanny_exited(key.fd)

    def _idle_left(self) -> float | None:
        """How long to wait for a request before ending; None (for ever) while engines run."""
        return None if self.engines or self.nannies or not self.idle_s else self.idle_s

    def _request(self, conn: socket.socket) -> None:
        self.selector.unregister(conn)
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, MAX_MESSAGE, 3)
        except OSError:
            conn.close()
            return
        nanny = False
        try:
            try:
                request = json.loads(data)
                nanny = request.get("kind") == "nanny"  # asked by an engine this zygote forked
                why = None if nanny else self.refusal or environment_mismatch(self.env,
                                                                              request["env"])
                if why is None and not nanny and request["env"].get("CUDA_VISIBLE_DEVICES") != "":
                    why = "it may use a GPU (CUDA state must not cross a fork)"
            except (ValueError, KeyError, TypeError, AttributeError):
                why = "its request could not be read"
            if why is None and len(fds) != 3:
                why = "it did not pass its three standard streams"
            if why is None:
                try:
                    pid = self._fork(request, fds, conn, nanny)
                except OSError as exc:  # no memory or processes left for a fork
                    why = f"fork failed: {exc}"
            if why is not None:
                _reply(conn, {"refused": why})
                conn.close()
                return
        finally:
            for fd in fds:
                os.close(fd)
        pidfd = os.pidfd_open(pid)
        if nanny:  # it ends by itself once its engine has (and says so to the controller)
            self.nannies[pidfd] = pid
            self.selector.register(pidfd, selectors.EVENT_READ, "nanny")
            _reply(conn, {"pid": pid})
            conn.close()
            return
        self.engines[pidfd] = (conn, pid)
        self.selector.register(pidfd, selectors.EVENT_READ, "engine")
        self.selector.register(conn, selectors.EVENT_READ, "proxy")
        _reply(conn, {"pid": pid})  # a proxy gone by now is seen as gone by the loop

    def _fork(self, request: dict, fds: list[int], conn: socket.socket, nanny: bool) -> int:
        from phalanx.cluster._zygote_child import become

        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid:
            return pid
        try:  # the engine, nanny or controller: nothing of the zygote's serving is kept
            controller = request.get("argv", [])[:1] == ["ipyparallel.controller"]
            role = "nanny" if nanny else "controller" if controller else "engine"
            serving = [self.server.fileno(), conn.fileno(), self.selector.fileno(), *self.engines,
                       *(c.fileno() for c, _ in self.engines.values()), *self.nannies,
                       *([self.kernel_fd] if self.kernel_fd is not None else [])]
            become(role, {"nanny": NANNY_NAME, "controller": CONTROLLER_NAME}.get(role),
                   request, fds, serving, self.pid, self.path)  # never returns
        except BaseException:
            traceback.print_exc()
        os._exit(1)

    def _proxy_gone(self, conn: socket.socket) -> None:
        """The proxy closed its end (it was killed): its engine goes with it."""
        self.selector.unregister(conn)  # read to its end: it would be ready forever
        for c, pid in list(self.engines.values()):
            if c is conn:
                _kill(pid)
                return  # the engine's exit is reaped by _engine_exited

    def _engine_exited(self, pidfd: int) -> None:
        conn, pid = self.engines.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = 0
        if os.WIFSIGNALED(status):
            outcome = {"signal": os.WTERMSIG(status)}
        else:
            outcome = {"exit": os.waitstatus_to_exitcode(status)}
        try:
            self.selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        _reply(conn, outcome)
        conn.close()

    def _nanny_exited(self, pidfd: int) -> None:
        pid = self.nannies.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    def close(self) -> None:
        """Kill the engines and nannies still running, reap them, remove the socket's
        directory."""
        pids = [pid for _conn, pid in self.engines.values()] + list(self.nannies.values())
        for pid in pids:
            _kill(pid)
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        import shutil

        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)  # the kernel made it for us


def _reply(conn: socket.socket, message: dict) -> None:
    """Send ``message``; a proxy that is gone is not an error (its engine is killed)."""
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> None:
    if len(argv) not in (1, 2):
        raise SystemExit("usage: python _zygote.py SOCKET [IDLE_S]")
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run as a script: its folder must not shadow anything
    os.umask(0o077)
    # It serves CPU engines only (their CUDA_VISIBLE_DEVICES is empty): anything an import asks
    # of CUDA, and caches, must then say "no device" too.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    kernel = os.environ.get("PHALANX_PARENT_PID")
    try:
        zygote = Zygote(argv[0], int(kernel) if kernel else None,
                        float(argv[1]) if len(argv) == 2 else None)
    except ProcessLookupError:  # the kernel is gone already
        os._exit(0)
    missing = preload()
    if cuda_touched():
        zygote.refusal = "CUDA was initialised while importing"
    elif "phalanx.cluster._supervise" in missing:
        zygote.refusal = "phalanx could not be imported"
    # Every object imported so far lives as long as the engines: moved out of the collector's
    # reach, an engine's collections no longer write to each object's header, which copied
    # nearly every page of the zygote's heap into each engine (Python's gc documentation
    # recommends this before forking).
    gc.collect()
    gc.freeze()

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        zygote.serve()
    except SystemExit:
        pass
    finally:
        zygote.close()
        os._exit(0)  # no interpreter teardown (a second with torch imported): nothing needs it


if __name__ == "__main__":
    main(sys.argv[1:])
