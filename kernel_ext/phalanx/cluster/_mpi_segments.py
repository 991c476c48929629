"""MPICH's shared-memory segments of a cluster's engines, removed once the engines are gone.

Engines started under ``mpiexec`` (``--launcher mpi``) share a segment ``/dev/shm/mpich_shm_*``
on each host.  MPICH removes it in ``MPI_Finalize``, which an engine ended by a signal never
reaches, so every stopped MPI cluster left 2 MB behind in ``/dev/shm``.  The segment belongs to
that one MPI job, and every rank of the job on this host maps it, so the names read from the
engines' memory maps while they run are exactly what to remove after they are gone.

    >>> sorted(mpich_segments_in(["7f0 rw-s 00000000 00:1a 12 /dev/shm/mpich_shm_0a1b_0",
    ...                           "7f1 r-xp 00000000 08:01 34 /usr/lib/libc.so.6"]))
    ['/dev/shm/mpich_shm_0a1b_0']
"""

from __future__ import annotations

import logging
import os
from typing import Iterable

log = logging.getLogger(__name__)

PREFIX = "/dev/shm/mpich_shm_"


def mpich_segments_in(maps_lines: Iterable[str]) -> set[str]:
    """The MPICH segment paths named in lines of a ``/proc/<pid>/maps`` file."""
    paths = (line.split()[-1] for line in maps_lines if PREFIX in line)
    return {path for path in paths if path.startswith(PREFIX)}  # not "(deleted)" ones


def mpich_segments(pids: Iterable[int]) -> set[str]:
    """The MPICH segments that the live processes ``pids`` map (none for a process gone)."""
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                found |= mpich_segments_in(maps)
        except OSError:  # gone already, or no /proc here
            continue
    return found


def remove_segments(paths: Iterable[str]) -> None:
    """Remove ``paths`` (call once every process that mapped them is gone)."""
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:  # MPI_Finalize ran after all
            pass
        except OSError as exc:
            log.warning("phalanx: could not remove MPI's shared memory %s: %s", path, exc)
