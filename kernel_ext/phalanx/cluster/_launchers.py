"""One launcher object per kind of cluster: what differs between local, MPI, SSH and batch systems.

The cluster manager keeps the shared flow (start a controller, start engine sets, wait for them,
rank and pin them); a launcher owns the rest:

* where the controller listens: loopback for engines on this host, else the address that routes
  to the engines (or ``--ip``); beyond loopback ZeroMQ traffic is CurveZMQ-encrypted;
* how engines start: ipyparallel's own launcher, with the options the magic passed;
* how far one rank can be restarted alone (local engines are one engine set each);
* what a failed or stuck start looks like (a batch job that stays pending, an unreachable host).

Options come from the magic (``--ip``, ``--hosts``, ``--slurm-args``) or, where the magic leaves
them out, from the ipyparallel profile's configuration (``c.Cluster.controller_ip``,
``c.SSHEngineSetLauncher.engines``, ``c.SlurmEngineSetLauncher.queue`` ...).

This module names the launchers (``--launcher NAME`` -> class) and holds the MPI one; their base
classes live in :mod:`._launcher_base`, which the SSH and batch launchers subclass without
importing this registry.

Example::

    >>> launcher = make_launcher("local", LaunchOptions())
    >>> launcher.listen_address(configured=None)
    '127.0.0.1'
"""

from __future__ import annotations

from ._batch import LsfLauncher, PbsLauncher, SlurmLauncher
from ._errors import ClusterError
from ._launcher_base import CURVE_ARG, Launcher, LaunchOptions, RemoteLauncher, default_address
from ._ssh import SshLauncher

__all__ = ["CURVE_ARG", "LAUNCHERS", "Launcher", "LaunchOptions", "MpiLauncher", "RemoteLauncher",
           "default_address", "log_tail", "make_launcher"]


class MpiLauncher(Launcher):
    """Engines on this host started together under ``mpiexec`` (one group)."""

    name = "mpi"
    one_set_per_engine = False
    ends_engines_by_pid = False  # mpiexec owns its ranks: it is the one to stop them
    forks_engines = False        # mpiexec starts each rank itself

    def check(self) -> None:
        from ._procs import find_mpiexec

        find_mpiexec()

    def engine_kwargs(self, set_id: str, count: int, environment: dict[str, str],
                      hosts: dict[str, int] | None = None) -> dict:
        from ._procs import find_mpiexec

        return {**super().engine_kwargs(set_id, count, environment), "mpi_cmd": [find_mpiexec()]}


# --launcher NAME -> its class: phalanx's own; another package adds one with an entry point of
# the phalanx.launchers group naming its Launcher subclass (see wire/_plugins.py)
_KINDS: dict[str, type[Launcher]] = {
    kind.name: kind
    for kind in (Launcher, MpiLauncher, SshLauncher, SlurmLauncher, PbsLauncher, LsfLauncher)}
LAUNCHERS = tuple(_KINDS)


def make_launcher(name: str, options: LaunchOptions) -> Launcher:
    """The launcher object for a ``--launcher`` value.

    Example::

        >>> make_launcher("mpi", LaunchOptions()).name
        'mpi'
    """
    key = (name or "").strip().lower()
    if key in _KINDS:
        return _KINDS[key](options)
    from ..wire import _plugins

    installed = _plugins.installed(_plugins.LAUNCHERS)  # other packages' (entry points)
    if key not in installed:
        raise ClusterError(f"unknown launcher {name!r}: choose one of "
                           f"{', '.join([*LAUNCHERS, *installed])}")
    try:
        kind = _plugins.load(_plugins.LAUNCHERS, key, Launcher, as_class=True)
    except _plugins.PluginError as exc:
        raise ClusterError(f"launcher {name!r}: {exc}") from exc
    return kind(options)


def log_tail(text: str, lines: int = 20) -> str:
    """The last ``lines`` lines of an engine log, indented for an error message."""
    tail = (text or "").strip().splitlines()[-lines:]
    return "\n".join("    " + line for line in tail) if tail else "    (the engine wrote no output)"
