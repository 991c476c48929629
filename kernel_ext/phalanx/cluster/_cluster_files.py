"""The files an ipyparallel cluster writes into the kernel's profile, and their removal.

The controller writes its connection files (with the cluster's keys) into the profile's
``security`` folder and removes them when it exits normally; it also writes a record of its
engines into ``log`` that nothing removes, and ipyparallel's ``Cluster`` keeps a cluster file
there that it rewrites (and so leaves behind) when engine sets are dropped in the order phalanx
stops them.  The manager removes them all at ``%cluster stop``; the watchdog
(:mod:`._warden`) removes them when the kernel is killed, since nothing else then would.

Example::

    >>> import os
    >>> sorted(os.path.basename(p) for p in cluster_files("/p", "abc"))
    ['cluster-abc.json', 'enginesabc.json', 'ipcontroller-abc-client.json', 'ipcontroller-abc-engine.json']
"""

from __future__ import annotations

import os
from typing import Any


def cluster_files(profile_dir: str, cluster_id: str) -> list[str]:
    """The paths ipyparallel uses for one cluster's files in ``profile_dir``."""
    security, log = os.path.join(profile_dir, "security"), os.path.join(profile_dir, "log")
    return [os.path.join(security, f"ipcontroller-{cluster_id}-client.json"),
            os.path.join(security, f"ipcontroller-{cluster_id}-engine.json"),
            os.path.join(security, f"cluster-{cluster_id}.json"),
            os.path.join(log, f"engines{cluster_id}.json")]


def files_of(cluster: Any) -> list[str]:
    """A running ``ipyparallel.Cluster``'s files, its controller's log included."""
    paths = cluster_files(cluster.profile_dir, cluster.cluster_id)
    output = getattr(cluster.controller, "output_file", None) if cluster.controller else None
    return paths + ([output] if output else [])


def remove_files(paths: list[str]) -> None:
    """Remove what exists of ``paths``."""
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError:  # someone else's, or a folder: not ours to force
            continue
