"""``log(**metrics)`` on an engine: a local buffer and a background sender to the kernel.

The training loop only appends to a list; a daemon thread ships batches every 50 ms (every 250 ms
when a batch would hold only the step count) over a ZeroMQ PUSH socket to the kernel's PULL
socket, so training never waits for the notebook.  With nothing but the step count to send, the
thread sleeps until the next progress batch is due, and the loop's next row wakes it: waking
every 50 ms, the thread cost a 1-worker run 1.8 us of its 640 us step; napping, 1.1 us, most of
it the four batches a second themselves (measured).  The final flush (at the end of a cell, or
when it fails) is synchronous and marked ``final`` so the kernel knows it holds the complete
history.

The socket and the thread outlive the run: one of each per engine process (a socket per kernel
address and keys), the thread asleep between runs.  Starting and stopping them for every run cost about
1.4 ms of a warm re-run's 10 ms on the engine (measured).

Wire format (JSON): ``{"run", "rank", "rows": [[step, t, {name: value}]], "step", "warnings",
"final"}``, plus ``"memory": [samples]`` when the engine's memory was sampled since the last batch
(about once a second, by the same thread: see ``_memory.py``) and ``"memory_peak"`` on the final
batch, and ``"total"`` once, when a framework said how many optimizer steps the run will take
(see ``adapters/framework_logs.py``).  JSON rather than pickle: the kernel never unpickles what arrives
on a socket.

Across hosts the kernel's receiver is a CurveZMQ server: the run's spec brings its public key and
the one client key pair it admits (``metrics_keys``), and the socket is a CURVE client with them
(``_curve.py``), so the batches and their token cross the network encrypted.  On one host the
keys are empty and the socket is plain (loopback: see ``fit/telemetry/_receiver.py``).

The socket never holds training up: the loop only appends, the flusher thread sends.  A kernel
that is unreachable (or refuses the handshake) leaves batches queued on the socket, up to
ZeroMQ's send high-water mark (1,000 batches, about 50 s of flushes); a closed socket gives
what it still holds 2 s (LINGER) to go out, then drops it.
"""

from __future__ import annotations

import numbers
import threading
import time
from typing import Any

_FLUSH_INTERVAL_S = 0.05
# A batch with only the step count and the step-time breakdown (a loop that calls no log():
# a framework's with its logging off) goes at most this often.  At 20 such batches a second
# from every rank a Trainer's steps ran about 3% slower than at 4 (measured: 2 ranks on 2
# cores, paired runs in the same engines); a progress bar needs no more than 4 updates a second.
_PROGRESS_INTERVAL_S = 0.25


class _Flusher:
    """The engine's one flushing thread: every 50 ms it sends the running run's batch; it
    sleeps while no run is on the engine.  Started on first use (engines are forked from a
    server that must not hold threads).

    Between progress batches, with no row waiting, it naps until the next is due (``napping``);
    a row recorded meanwhile wakes it, and the row goes out 50 ms later, as it would have."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: MetricsSender | None = None
        self._active = threading.Event()
        self._thread: threading.Thread | None = None
        self._woken = threading.Event()
        self.napping = False  # read without the lock by the training thread: see MetricsSender.record

    def wake(self) -> None:
        """A row waits: end the nap (the batch then waits the usual 50 ms to fill)."""
        self.napping = False
        self._woken.set()

    def attach(self, sender: MetricsSender) -> None:
        with self._lock:
            self._current = sender
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="phalanx-metrics",
                                                daemon=True)
                self._thread.start()
        self._active.set()
        self.wake()  # a nap left from the run before would hold this run's first batch back

    def detach(self, sender: MetricsSender) -> None:
        with self._lock:
            if self._current is sender:
                self._current = None
                self._active.clear()

    def _loop(self) -> None:
        nap = 0.0
        while True:
            self._active.wait()
            if nap > _FLUSH_INTERVAL_S and self._woken.wait(nap - _FLUSH_INTERVAL_S):
                self._woken.clear()
            time.sleep(_FLUSH_INTERVAL_S)
            with self._lock:
                sender = self._current
            nap = 0.0
            if sender is not None:
                sender.flush_periodic()
                nap = self._nap_for(sender)

    def _nap_for(self, sender: MetricsSender) -> float:
        """Seconds until ``sender`` has a batch due of its own (0: flush at the usual pace).
        ``napping`` is set before the sender's queue is looked at: a row appended after that
        look sees it set and wakes the thread (see ``record``)."""
        self.napping = True
        self._woken.clear()
        nap = sender.idle_for()
        if nap <= _FLUSH_INTERVAL_S:
            self.napping = False
            return 0.0
        return nap


_FLUSHER = _Flusher()
# (kernel address, CURVE keys or ()) -> this engine's PUSH socket to that receiver
_SOCKETS: dict[tuple[str, tuple[str, ...]], Any] = {}
_SOCKETS_LOCK = threading.Lock()


def _socket_to(address: str, keys: tuple[str, ...] = ()) -> Any:
    """This engine's PUSH socket to ``address`` (a CURVE client when ``keys`` are given); one
    to a receiver no longer used is closed (a kernel that adopted the cluster, or one whose
    receiver moved to another network, listens elsewhere with other keys)."""
    import zmq

    with _SOCKETS_LOCK:
        socket = _SOCKETS.get((address, keys))
        if socket is None:
            for old in _SOCKETS.values():
                old.close()  # its LINGER lets what it still holds go out first
            _SOCKETS.clear()
            socket = zmq.Context.instance().socket(zmq.PUSH)
            socket.setsockopt(zmq.LINGER, 2000)
            if keys:
                from ...wire._curve import connect_client

                server_public, client_public, client_secret = keys
                connect_client(socket, address, (server_public, client_public, client_secret))
            else:
                socket.connect(address)
            _SOCKETS[(address, keys)] = socket
        return socket


def to_number(value: Any) -> float | None:
    """A metric value as a float, or ``None`` when it is not a single number."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    try:
        count = numel() if callable(numel) else numel
    except Exception:
        return None
    if count == 1 and hasattr(value, "item"):
        try:
            item = value.item()
        except Exception:
            return None
        return float(item) if isinstance(item, numbers.Real) else None
    return None


class MetricsSender:
    """Batch metric rows and step counts of one rank to the kernel."""

    def __init__(self, address: str, run_id: str, rank: int, token: str = "",
                 memory_interval_s: float = 1.0, keys: tuple[str, ...] = ()) -> None:
        from ._memory import MemoryTracker
        from ._timing import StepClock

        self._socket = _socket_to(address, tuple(keys))
        self._run_id, self._rank, self._token = run_id, rank, token
        self._rows: list[list] = []
        self._warnings: list[str] = []
        self._warned: set[str] = set()
        self._step = 0
        self.memory = MemoryTracker(memory_interval_s)
        self._samples: list[dict] = []
        self.clock = StepClock()  # collective calls and log() time, shipped with the batches
        self.latest: dict[str, float] = {}  # last value per metric, read by sync strategies
        self.total: int | None = None       # the run's optimizer steps, where a framework knows
        self._total_sent = True
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # the flusher's batches and the final one, in order
        self._sent_at = float("-inf")        # monotonic time of the last batch sent
        self._closed = False
        _FLUSHER.attach(self)

    def record(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one row; values that are not single numbers are dropped with a warning."""
        clean: dict[str, float] = {}
        for name, value in metrics.items():
            number = to_number(value)
            if number is None:
                self._warn_once(name, value)
                continue
            clean[name] = number
        self.latest.update(clean)
        with self._lock:
            self._rows.append([step, time.time(), clean])
        if _FLUSHER.napping:  # after the append: the flusher sets this before it looks
            _FLUSHER.wake()

    def set_step(self, step: int) -> None:
        self._step = step

    def set_total(self, steps: int) -> None:
        """The optimizer steps the run will take (told by the framework that trains), sent with
        the next batch: the views then show progress against it and an ETA."""
        self.total, self._total_sent = int(steps), False
        if _FLUSHER.napping:
            _FLUSHER.wake()

    def _queued(self) -> bool:
        """Rows, warnings or memory samples wait to be sent (the caller holds ``_lock``)."""
        return bool(self._rows or self._warnings or self._samples)

    def idle_for(self) -> float:
        """Seconds until a batch is due with nothing queued: the next progress batch or memory
        sample; 0 when something waits to be sent."""
        with self._lock:
            if self._queued() or not self._total_sent:
                return 0.0
        now = time.monotonic()
        due = self._sent_at + _PROGRESS_INTERVAL_S
        if self.memory.interval_s > 0:
            due = min(due, self.memory.next_at())
        return max(0.0, due - now)

    def _warn_once(self, name: str, value: Any) -> None:
        if name in self._warned:
            return
        self._warned.add(name)
        shape = getattr(value, "shape", None)
        what = f"{type(value).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "")
        with self._lock:
            self._warnings.append(f"metric {name!r} on rank {self._rank} is a {what}, not a single "
                                  "number: it was left out of the row (log a scalar, e.g. "
                                  "loss.item())")

    def flush_periodic(self) -> None:
        """The flusher's call: a memory sample when one is due, then the batch so far."""
        with self._send_lock:
            if self._closed:  # the final batch went out: nothing may follow it
                return
            if self.memory.due():
                sample = self.memory.take()
                with self._lock:
                    self._samples.append(sample)
            self._send(final=False)

    def _send(self, final: bool) -> None:
        with self._lock:
            progress_only = not self._queued()
        if (progress_only and not final and self._total_sent
                and time.monotonic() - self._sent_at < _PROGRESS_INTERVAL_S):
            return  # the step-time breakdown waits in the clock for the next batch
        self._sent_at = time.monotonic()
        with self._lock:
            rows, self._rows = self._rows, []
            warnings, self._warnings = self._warnings, []
            samples, self._samples = self._samples, []
        timing = self.clock.drain()
        if (not rows and not warnings and not samples and not timing and not final
                and self._total_sent and getattr(self, "_sent_step", -1) == self._step):
            return
        self._sent_step = self._step
        message = {"run": self._run_id, "token": self._token, "rank": self._rank, "rows": rows,
                   "step": self._step, "warnings": warnings, "final": final}
        if not self._total_sent:
            message["total"], self._total_sent = self.total, True
        if samples:
            message["memory"] = samples
        if timing:
            message["timing"] = timing
        if final and self.memory.peak:
            message["memory_peak"] = dict(self.memory.peak)
        self._socket.send_json(message)

    def close(self) -> None:
        """Send everything left, marked final; the flusher sends nothing more for this run."""
        _FLUSHER.detach(self)
        with self._send_lock:
            if self._closed:
                return
            if self.memory.interval_s > 0:  # the run's last figures (a short run may have none yet)
                self._samples.append(self.memory.take())
            self._send(final=True)
            self._closed = True  # after the send: a close retried after an interrupt sends it
