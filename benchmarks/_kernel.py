"""A real Jupyter kernel and the two connections a notebook page holds to it, for benchmarks.

:class:`Connection` is one client (its own shell, control and IOPub sockets, as the notebook's
and the panel's connections are) with a thread that reads IOPub and hands every message, with
its arrival time, to the listeners.  :class:`Notebook` runs cells on one connection and returns
what they printed; :class:`PanelClient` speaks the phalanx panel's protocol on another
connection over a kernel subshell, as the lab extension does.

Example::

    kernel = start_kernel()
    notebook = Notebook(kernel)
    notebook.run("%load_ext phalanx")
    panel = PanelClient(kernel)
    panel.attach()
    panel.request_ms()        # one request_snapshot answered, in ms
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import uuid
from typing import Any, Callable


def start_kernel() -> Any:
    """An ipykernel (this interpreter, this environment) managed by jupyter_client."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.kernel_spec.argv[0] = sys.executable
    km.start_kernel(env=dict(os.environ))
    return km


class Connection:
    """One client of the kernel; IOPub is read on a thread and fanned out to listeners."""

    def __init__(self, km: Any, busy_kernel: bool = False) -> None:
        self.client = km.blocking_client()
        self.client.start_channels()
        if busy_kernel:  # the shell may be running a cell: ask on the control channel, as the panel does
            self.control("kernel_info_request")
        else:
            self.client.wait_for_ready(timeout=120)
        self.listeners: list[Callable[[dict, float], None]] = []
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True, name="bench-iopub")
        self._reader.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                msg = self.client.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            except Exception:  # the channel closed under us at the end
                return
            now = time.monotonic()
            for listener in list(self.listeners):
                listener(msg, now)

    def send_shell(self, msg_type: str, content: dict, subshell: str | None = None) -> str:
        msg = self.client.session.msg(msg_type, content)
        if subshell is not None:
            msg["header"]["subshell_id"] = subshell
        self.client.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def control(self, msg_type: str, timeout: float = 30) -> dict:
        """Send ``msg_type`` on the control channel (answered while a cell runs); its reply."""
        msg = self.client.session.msg(msg_type, {})
        self.client.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = self.client.control_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]

    def create_subshell(self) -> str:
        reply = self.control("create_subshell_request")
        if reply.get("status") != "ok":
            raise RuntimeError(f"the kernel refused a subshell: {reply}")
        return reply["subshell_id"]

    def close(self) -> None:
        self._closed.set()
        self._reader.join(timeout=5)
        self.client.stop_channels()


class Notebook:
    """Runs cells on its own connection (the notebook's) and returns what they printed."""

    def __init__(self, km: Any) -> None:
        self.connection = Connection(km)
        self._out: dict[str, list[str]] = {}
        self._idle: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.connection.listeners.append(self._collect)

    def _collect(self, msg: dict, _at: float) -> None:
        parent = msg["parent_header"].get("msg_id")
        with self._lock:
            if parent not in self._idle:
                return
            if msg["msg_type"] == "stream":
                self._out[parent].append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                self._out[parent].append("\n".join(msg["content"]["traceback"]))
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                self._idle[parent].set()

    def start(self, code: str, expressions: dict | None = None) -> str:
        """Send a cell without waiting for it; its message id."""
        client = self.connection.client
        msg = client.session.msg("execute_request", {
            "code": code, "silent": False, "store_history": False,
            "user_expressions": expressions or {}, "allow_stdin": False, "stop_on_error": False})
        with self._lock:
            self._out[msg["header"]["msg_id"]] = []
            self._idle[msg["header"]["msg_id"]] = threading.Event()
        client.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def evaluate(self, code: str, expression: str, timeout: float = 600) -> str:
        """Run ``code``, then the value of ``expression`` as text (from the reply itself, so no
        output of another thread can stand in its place)."""
        self.wait(self.start(code, {"value": expression}), timeout)
        value = self._last_reply["user_expressions"]["value"]
        if value.get("status") != "ok":
            raise RuntimeError(f"{expression} failed: {value}")
        return value["data"]["text/plain"]

    def wait(self, msg_id: str, timeout: float = 600) -> str:
        """What cell ``msg_id`` printed, once it is done; raises if it failed."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self.connection.client.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        if not self._idle[msg_id].wait(timeout=max(1.0, deadline - time.monotonic())):
            raise TimeoutError("the cell's output did not end")
        with self._lock:
            text = "".join(self._out.pop(msg_id))
            del self._idle[msg_id]
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the cell failed:\n{text}\n{reply['content']}")
        self._last_reply = reply["content"]
        return text

    def run(self, code: str, timeout: float = 600) -> str:
        return self.wait(self.start(code), timeout)

    def close(self) -> None:
        self.connection.close()


class PanelClient:
    """The phalanx panel's side of the comm, on its own connection and kernel subshell."""

    def __init__(self, km: Any) -> None:
        self.connection = Connection(km, busy_kernel=True)
        self.comm_id: str | None = None
        self.rows_ms: list[float] = []   # engine log() to this client, per row
        self._answered = threading.Event()
        self.connection.listeners.append(self._on_iopub)

    def _on_iopub(self, msg: dict, _at: float) -> None:
        content = msg["content"]
        if msg["msg_type"] != "comm_msg" or content.get("comm_id") != self.comm_id:
            return
        data = content.get("data") or {}
        if data.get("type") == "snapshot":
            self._answered.set()
        elif data.get("type") == "metrics":
            now = time.time()  # rows carry the engine's wall time of their log() call
            self.rows_ms.extend((now - row["t"]) * 1e3 for row in data.get("rows", []))

    def attach(self) -> float:
        """What a page (re)load does: a new subshell, a comm opened on it with a snapshot
        request; returns the ms until the snapshot arrived."""
        subshell = self.connection.create_subshell()
        self.comm_id, self._subshell = uuid.uuid4().hex, subshell
        return self._timed(lambda: self.connection.send_shell(
            "comm_open", {"comm_id": self.comm_id, "target_name": "phalanx",
                          "data": {"v": 1, "type": "request_snapshot"}}, subshell))

    def request_ms(self) -> float:
        """One request_snapshot on the open comm answered, in ms."""
        return self._timed(lambda: self.connection.send_shell(
            "comm_msg", {"comm_id": self.comm_id,
                         "data": {"v": 1, "type": "request_snapshot"}}, self._subshell))

    def _timed(self, send: Callable[[], Any], timeout: float = 60) -> float:
        self._answered.clear()
        started = time.monotonic()
        send()
        if not self._answered.wait(timeout):
            raise TimeoutError(f"the panel's request was not answered within {timeout} s")
        return (time.monotonic() - started) * 1e3

    def unload(self) -> None:
        """What the page does as it unloads: close its comm (the kernel stops sending to it)."""
        if self.comm_id is not None:
            self.connection.send_shell("comm_close", {"comm_id": self.comm_id, "data": {}},
                                       self._subshell)

    def close(self) -> None:
        self.connection.close()


class ClusterKernel:
    """A real kernel with phalanx loaded and ``engines`` warm CPU engines: what a notebook that
    has run ``%cluster start`` is.  ``env``: variables the kernel (and so its engines) gets."""

    def __init__(self, engines: int = 2, env: dict[str, str] | None = None) -> None:
        before = {name: os.environ.get(name) for name in env or {}}
        os.environ.update(env or {})
        try:  # the kernel takes this process's environment, its engines the kernel's
            self.km = start_kernel()
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        self.notebook = Notebook(self.km)
        try:
            self.notebook.run(f"%load_ext phalanx\nimport phalanx\n"
                              f"%cluster start -n {engines} --gpus none", timeout=300)
        except BaseException:
            self.close(stop=False)
            raise

    @property
    def pid(self) -> int:
        return self.km.provisioner.pid

    def close(self, stop: bool = True) -> None:
        try:
            if stop:
                self.notebook.run("%cluster stop", timeout=120)
        finally:
            self.notebook.close()
            self.km.shutdown_kernel(now=False)  # its atexit removes its scratch folders
