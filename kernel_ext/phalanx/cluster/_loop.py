"""One private asyncio loop thread per cluster manager.

ipyparallel's ``Cluster`` is async-first and its launchers schedule their exit callbacks on the
loop that started them.  Running every cluster coroutine on one long-lived loop of our own keeps
those callbacks alive whether we are called from a Jupyter kernel (which already runs a loop),
from plain Python or from pytest.

Example::

    >>> runner = LoopThread()
    >>> async def two(): return 2
    >>> runner.run(two())
    2
    >>> runner.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Awaitable


class LoopThread:
    """An asyncio event loop running in a daemon thread."""

    def __init__(self, name: str = "phalanx-cluster-loop") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def run(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait for its result (re-raising its exception)."""
        future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(
            coro, self._loop)  # type: ignore[arg-type]
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"cluster operation did not finish within {timeout} s") from None

    def close(self) -> None:
        """Stop the loop and join its thread."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
