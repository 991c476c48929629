"""Errors raised by learning networks.

Kept dependency-free because engines unpickle them when a task fails remotely.
"""

from __future__ import annotations


class NetworkError(ValueError):
    """A learning network was built or called wrongly (the message names the node).

    Example::

        >>> raise NetworkError("machine 'pca' (PCA) has no method 'predict'")
        Traceback (most recent call last):
        ...
        phalanx.network._errors.NetworkError: machine 'pca' (PCA) has no method 'predict'
    """


class MachineFitError(RuntimeError):
    """One or more machines failed to fit; ``.log`` holds the :class:`FitLog` of the attempt.

    Failed machines keep their previous state, and machines that did not depend on them keep
    their new results, so the next ``fit`` retries only what failed and what lies downstream.

    Example::

        >>> err = MachineFitError({"tree": ValueError("boom")}, cancelled=["blend"])
        >>> err.machines
        ['tree']
        >>> "machine 'tree'" in str(err)
        True
    """

    def __init__(self, failed: dict, cancelled: list | tuple = (), log=None) -> None:
        self.failed = dict(failed)
        self.machines = list(self.failed)
        self.cancelled = list(cancelled)
        self.log = log
        lines = [f"machine {name!r} failed to fit: {type(exc).__name__}: {exc}"
                 for name, exc in self.failed.items()]
        if self.cancelled:
            names = ", ".join(repr(n) for n in self.cancelled)
            lines.append(f"not fitted because something upstream failed: {names}")
        super().__init__("; ".join(lines))
