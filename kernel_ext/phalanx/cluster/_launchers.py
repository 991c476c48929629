"""Launcher names phalanx accepts, mapped onto ipyparallel's own engine launchers."""

from __future__ import annotations

# phalanx name -> ipyparallel engine launcher abbreviation (its entry-point names)
LAUNCHERS = {
    "local": "local",
    "mpi": "mpi",
    "ssh": "ssh",
    "slurm": "slurm",
    "pbs": "pbs",
    "lsf": "lsf",
}


class ClusterError(RuntimeError):
    """A cluster request that cannot be carried out; the message says what to do instead."""


def resolve_launcher(name: str) -> str:
    """Check a ``--launcher`` value and return ipyparallel's name for it.

    Example::

        >>> resolve_launcher("mpi")
        'mpi'
    """
    key = (name or "").strip().lower()
    if key not in LAUNCHERS:
        raise ClusterError(f"unknown launcher {name!r}: choose one of {', '.join(LAUNCHERS)}")
    return LAUNCHERS[key]


def log_tail(text: str, lines: int = 20) -> str:
    """The last ``lines`` lines of an engine log, indented for an error message."""
    tail = (text or "").strip().splitlines()[-lines:]
    return "\n".join("    " + line for line in tail) if tail else "    (the engine wrote no output)"
