"""What a rank sends back for ``--return``: at the end of a run, or as far as it got when stopped.

The run's fit mode says whose copy goes back (replicated: rank 0's; sharded: a full state dict
every rank helps gather).  Objects the notebook sent go back as the notebook's own, with their
new state (see :mod:`phalanx.wire._graph_pickle`).

Example (the engine runtime, at the end of a run)::

    result = RankResult(Outcome.OK, returns=returned(spec, namespace, sent))
"""

from __future__ import annotations

import logging
from typing import Any

from ._fit_mode import Replicated, mode_for
from ...wire._seam import RunSpec

log = logging.getLogger("phalanx")


def returned(spec: RunSpec, namespace: dict, sent: Any) -> bytes | None:
    """This rank's ``--return`` values, pickled (None on ranks that send nothing)."""
    payload = mode_for(namespace, spec.train.mode).returned(spec.rank, namespace,
                                                             spec.train.returns)
    return _dumps(payload, sent) if payload is not None else None


def released_by_a_stop(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective released because a peer was interrupted: the kernel's
    Stop reached that rank first, and this one was waiting for it in the same step (gradients
    are averaged before any update), so it stops as of the same whole number of steps."""
    from ..transport._comm_errors import CollectiveAborted

    return isinstance(exc, CollectiveAborted) and "KeyboardInterrupt" in str(exc)


def returned_so_far(spec: RunSpec, namespace: dict, sent: Any) -> bytes | None:
    """This rank's ``--return`` names as they are now (those the cell has defined), or None.
    A sharded model is not among them: gathering it needs every rank, and the stop released
    them (it stays on the engines with ``--keep``)."""
    from ..sync._sharded import is_sharded

    names = [n for n in spec.train.returns if n in namespace and not is_sharded(namespace[n])]
    try:
        payload = Replicated().returned(spec.rank, namespace, names)
        return _dumps(payload, sent or {}) if payload else None
    except Exception as exc:  # the stop's own report matters more than a partial return
        log.warning("phalanx: --return after the stop failed: %s", exc)
        return None


def _dumps(payload: dict, sent: dict) -> bytes:
    from ...wire._graph_pickle import dumps_returns

    return dumps_returns(payload, sent)
