"""Torch's CPU threads per engine: the host's cores shared among the ranks running there.

Every engine is its own process, and torch sizes its intra-op thread pool to all of the
machine's cores.  With several engines on one host the pools then oversubscribe the cores, and
their threads spin against each other: a warm one-step cell on 2 engines of a 2-core machine took
75 ms with torch's default and 39 ms with one thread per engine (median of 20 interleaved pairs).
torchrun makes the same choice (``OMP_NUM_THREADS=1`` per process unless set).  A person who set
``OMP_NUM_THREADS`` keeps it, and a cell may still call ``torch.set_num_threads`` itself.

    >>> threads_for(["a", "a", "b"], rank=0, cores=8, environ={})
    4
    >>> threads_for(["a", "a", "a"], rank=2, cores=2, environ={})
    1
    >>> threads_for(["a", "a"], rank=0, cores=8, environ={"OMP_NUM_THREADS": "3"}) is None
    True
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence


def threads_for(hosts: Sequence[str], rank: int, cores: int | None,
                environ: Mapping[str, str] = os.environ) -> int | None:
    """Torch threads for ``rank`` (None: leave torch's own choice, the person made one)."""
    if environ.get("OMP_NUM_THREADS") or not hosts or not cores:
        return None
    here = hosts[rank]
    return max(1, cores // sum(1 for h in hosts if h == here))


def share_cores(hosts: Sequence[str], rank: int) -> None:
    """Size this engine's torch thread pool for the run (where torch is already imported)."""
    import sys

    torch = sys.modules.get("torch")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    wanted = threads_for(hosts, rank, cores)
    if torch is not None and wanted is not None and torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
