"""The pure functions that run where the work happens: in the kernel or on a dask worker.

Each machine fit is ``(unfitted clone, inputs) -> FitResult``; nothing here touches kernel
state, so a task can run anywhere its arguments can be shipped.

Example::

    >>> from sklearn.linear_model import LinearRegression
    >>> res = fit_task(LinearRegression(), [[0.0], [1.0]], [0.0, 2.0])
    >>> round(float(apply_task(res, "predict", [[2.0]])[0]), 6)
    4.0
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any, NamedTuple


class FitResult(NamedTuple):
    """A fitted estimator with when and where its fit ran."""

    estimator: Any
    started: float
    ended: float
    worker: str


def fit_task(estimator: Any, *inputs: Any) -> FitResult:
    """Fit ``estimator`` (an unfitted clone the task owns) on ``inputs``."""
    started = time.time()
    estimator.fit(*inputs)
    return FitResult(estimator, started, time.time(), _where())


def update_task(estimator: Any, params: dict, *inputs: Any) -> FitResult:
    """Continue training ``estimator`` (a copy of the previous fit) with new ``params``."""
    started = time.time()
    estimator.set_params(**params)
    estimator.fit(*inputs)
    return FitResult(estimator, started, time.time(), _where())


def runner_task(runner: Callable, estimator: Any, cluster: Any, *inputs: Any) -> FitResult:
    """Fit through a machine's ``fit_runner`` (runs in the kernel)."""
    started = time.time()
    fitted = runner(estimator, *inputs, cluster=cluster)
    return FitResult(fitted, started, time.time(), "kernel")


def apply_task(fitted: Any, method: str, *args: Any) -> Any:
    """``fitted.<method>(*args)``; ``fitted`` may be a :class:`FitResult`."""
    estimator = fitted.estimator if isinstance(fitted, FitResult) else fitted
    return getattr(estimator, method)(*args)


def call_task(fn: Callable, *args: Any) -> Any:
    """A static node's function applied to its arguments."""
    return fn(*args)


def raise_task(exc: BaseException) -> Any:
    """Re-raise ``exc`` where it is needed (a failed kernel-side fit, seen by dask)."""
    raise exc


def _where() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
