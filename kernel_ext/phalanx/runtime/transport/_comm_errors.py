"""The errors of collectives, in a module that imports nothing else of phalanx: every transport
raises them, and the module that picks a transport (``_comm``) imports the transports."""

from __future__ import annotations

from typing import Sequence


class CollectiveError(RuntimeError):
    """Base of every collective failure; ``ranks`` names the ranks at fault where known."""

    def __init__(self, message: str, ranks: Sequence[int] = (), op: str = "") -> None:
        super().__init__(message)
        self.ranks = list(ranks)
        self.op = op


class CollectiveTimeout(CollectiveError):
    """A collective passed its deadline; ``ranks`` are those that did not arrive (if known)."""


class PeerDied(CollectiveError):
    """A peer process was found dead; the message names its rank and pid."""


class CollectiveAborted(CollectiveError):
    """``abort()`` was called on this rank, or a peer gave up (its rank is in ``ranks``)."""


class CollectiveMismatch(CollectiveError):
    """Ranks entered different collectives (another op, size or dtype) at the same point."""
