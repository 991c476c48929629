"""Whose fault a rank's exception is, decided on the engine where its classes are (the kernel
sees a type name only): the rank's own, a peer's, or a collective's deadline.

Example::

    >>> from phalanx.runtime.transport._comm_errors import CollectiveTimeout, PeerDied
    >>> fault_of(ValueError("bad shard")).name, fault_of(PeerDied("rank 1 died")).name
    ('OWN', 'PEER')
    >>> fault_of(CollectiveTimeout("waited 30 s for rank 1")).name
    'DEADLINE'
"""

from __future__ import annotations

import bdb
import sys

from ...wire._seam import Fault
from ..transport._comm_errors import CollectiveError, CollectiveMismatch, CollectiveTimeout


def fault_of(exc: BaseException) -> Fault:
    """The :class:`~phalanx.wire._seam.Fault` of ``exc``, raised by this rank's cell."""
    if isinstance(exc, bdb.BdbQuit):
        return Fault.QUIT
    if isinstance(exc, CollectiveTimeout):
        return Fault.DEADLINE
    # a mismatch is every rank's own report of the ranks' disagreement: not a peer's failure
    if isinstance(exc, CollectiveError) and not isinstance(exc, CollectiveMismatch):
        return Fault.PEER
    if _is_torch_distributed_error(exc):
        return Fault.PEER
    return Fault.OWN


def _is_torch_distributed_error(exc: BaseException) -> bool:
    """torch.distributed's own errors (a backend's broken or timed-out collective) are raised
    where a peer failed; torch is looked up, never imported for this."""
    dist = sys.modules.get("torch.distributed")
    dist_error = getattr(dist, "DistError", None) if dist is not None else None
    return isinstance(dist_error, type) and isinstance(exc, dist_error)
