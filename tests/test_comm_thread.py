"""The gradient communication thread's hand-over (pure, one process): whatever moment an interrupt
hits the training thread, a later wait neither hangs nor returns before its work has run.

The kernel's interrupt (SIGINT on the engine) is raised in the training thread between any two
bytecodes; a cell that catches it and trains on must find the thread's bookkeeping intact.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import pytest

from phalanx.runtime.sync._overlap import CommThread
from deadlines import hang_limit


def wait_within(worker: CommThread, seconds: float = hang_limit(5.0)) -> None:
    """``worker.wait()`` on a helper thread: a hang fails the test instead of stalling it."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    helper = threading.Thread(target=run, daemon=True)
    helper.start()
    helper.join(seconds)
    assert not helper.is_alive(), f"wait() still blocked after {seconds:g} s"
    if errors:
        raise errors[0]


class InterruptedOnce(queue.SimpleQueue):
    """A queue whose first put is interrupted before it happens (as SIGINT would)."""

    def __init__(self) -> None:
        self.hit = False

    def put(self, item, block=True, timeout=None):
        if not self.hit and callable(item):
            self.hit = True
            raise KeyboardInterrupt
        super().put(item, block, timeout)


def test_work_runs_in_order_and_the_first_error_reaches_the_waiter():
    worker, done = CommThread(), []
    try:
        for i in range(50):
            worker.submit(lambda i=i: (time.sleep(0.001), done.append(i)))
        worker.wait()
        assert done == list(range(50))
        worker.submit(lambda: 1 / 0)
        worker.submit(lambda: done.append("after the error"))  # dropped: the group is broken
        with pytest.raises(ZeroDivisionError):
            worker.wait()
        assert done[-1] == 49
    finally:
        worker.close()


def test_an_interrupt_between_counting_and_handing_over_does_not_hang_the_next_wait():
    worker, done = CommThread(), []
    worker._queue = InterruptedOnce()
    try:
        with pytest.raises(KeyboardInterrupt):
            worker.submit(lambda: done.append("lost"))
        wait_within(worker)
        worker.submit(lambda: done.append("next"))
        wait_within(worker)
        assert done == ["next"]
    finally:
        worker.close()


def test_an_interrupt_during_a_wait_leaves_the_next_wait_exact():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGINT is delivered to the main thread")
    # Python's own handler, as in a kernel: a test runner's worker may ignore SIGINT
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    worker, done, release = CommThread(), [], threading.Event()
    interrupt = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    try:
        worker.submit(lambda: (release.wait(10), done.append("slow")))
        interrupt.start()
        with pytest.raises(KeyboardInterrupt):
            worker.wait()  # interrupted while the slow item still runs
        worker.submit(lambda: done.append("next"))
        release.set()
        wait_within(worker)
        assert done == ["slow", "next"]  # the wait returned only after both had run
    finally:
        interrupt.cancel()  # never delivered once the handler is restored
        interrupt.join()
        release.set()
        worker.close()
        signal.signal(signal.SIGINT, previous)
