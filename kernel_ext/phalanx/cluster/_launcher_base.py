"""What every launcher shares: the options of ``%cluster start`` and the base classes.

:class:`Launcher` is the local launcher and the base of all others (the cluster manager speaks
only to its methods); :class:`RemoteLauncher` is the base of launchers whose engines run on other
hosts (SSH, batch systems).  The concrete launchers subclass these in their own modules and
:mod:`._launchers` names them; this module imports none of them.

Example::

    >>> Launcher(LaunchOptions()).listen_address(configured=None)
    '127.0.0.1'
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ._errors import ClusterError
from ._locality import is_loopback, route_address

if TYPE_CHECKING:
    import subprocess

    from ipyparallel.cluster.launcher import BaseLauncher
    from traitlets.config import Config

    from ._ranks import EngineSlot


# Any address outside this host's networks: asking the routing table for it yields the address
# on the default route (documentation range: no packet is ever sent there).
_OUTSIDE = "198.51.100.1"
CURVE_ARG = "--IPController.enable_curve=True"


@dataclass(frozen=True)
class LaunchOptions:
    """What ``%cluster start`` says about where engines run (``None``: the profile's or default)."""

    ip: str | None = None            # --ip: the controller's listening address
    hosts: str | None = None         # --hosts a:2,b:2 (ssh)
    submit_args: str | None = None   # --slurm-args / --pbs-args / --lsf-args: extra submit flags
    encrypt: bool = True             # --no-encryption turns CurveZMQ off beyond loopback
    profile: str | None = None


class Launcher:
    """Engines on this host, one engine set per engine (so any rank restarts alone)."""

    name = "local"            # --launcher NAME; ipyparallel names its engine-set launcher alike
    engines_here = True       # engines certainly run on the kernel's host
    one_set_per_engine = True
    restarts_one_engine = False  # one engine of a group can be replaced alone (on its host)
    ask_engines_to_exit = False  # before stopping them through the launcher (slow for SSH)
    ends_engines_by_pid = True   # its engines are processes here that phalanx may signal itself
    forks_engines = True         # CPU engines may be forked from a zygote (cluster/_zygote.py)

    def __init__(self, options: LaunchOptions) -> None:
        self.options = options
        self.profile_config: Config | None = None  # the ipyparallel profile's config, once loaded
        self.profile_dir: str | None = None     # ... and its folder

    @property
    def ipyparallel_engines(self) -> str:
        """The name of ipyparallel's engine-set launcher this one drives: phalanx's own share
        their names with ipyparallel's; one another package adds (a subclass) drives its
        nearest phalanx base's."""
        own = next(c for c in type(self).__mro__ if c.__module__.startswith("phalanx.cluster."))
        return str(own.__dict__.get("name", "local"))

    def default_count(self) -> int | None:
        """How many engines ``%cluster start`` without ``-n`` means (``None``: the usual)."""
        return None

    def check(self) -> None:
        """Refuse early, before any process starts, what cannot work (a missing tool...)."""

    def listen_address(self, configured: str | None) -> str:
        """Where the controller listens: ``--ip``, the profile's address, else the default."""
        return self.options.ip or configured or "127.0.0.1"

    def controller_args(self, address: str) -> list[str]:
        """Beyond loopback the controller's sockets are CurveZMQ-encrypted unless turned off."""
        return [CURVE_ARG] if self.options.encrypt and not is_loopback(address) else []

    def engine_kwargs(self, set_id: str, count: int, environment: dict[str, str],
                      hosts: dict[str, int] | None = None) -> dict:
        """Keyword arguments of ``Cluster.start_engines`` for one engine set (``hosts``: where
        its engines go, for launchers that place them; ``None``: where the options say)."""
        from ._supervise import command as supervised, parent_env

        # on this host engines can watch the kernel and stop when it is gone
        return {"engine_cmd": supervised("ipyparallel.engine"),
                "environment": {**environment, **parent_env()}}

    def set_failure(self, engine_set: BaseLauncher, waited_out: bool) -> str | None:
        """Why an engine set that has not registered will not (``None``: keep waiting).

        ``waited_out`` is true once the start timeout has passed."""
        return None

    def set_name(self, engine_set: BaseLauncher) -> str:
        """How an engine set is named in messages."""
        return "engine(s)"

    def submit_error(self, exc: subprocess.CalledProcessError) -> ClusterError:
        """A command that starts engines failed (batch launchers show the system's message)."""
        return ClusterError(f"the {self.name} launcher could not start engines: {exc}")

    def forget(self, engine_set: BaseLauncher) -> None:
        """Let go of an engine set whose engines have all exited on request."""

    def note_started(self, engine_set: BaseLauncher, slots: list[EngineSlot]) -> None:
        """Remember, for each newly registered slot, what a restart needs to replace it."""

    def hosts_of(self, slots: list) -> dict[str, int] | None:
        """Where replacements of ``slots`` go (``None``: where the options say)."""
        return None

    def replaces_alone(self, slot: EngineSlot) -> bool:
        """Whether ``slot``'s engine, one of a group, can be replaced alone: its launcher ends
        one engine of a set and knows where to start its successor."""
        return self.restarts_one_engine and self.hosts_of([slot]) is not None

    def await_exited(self, slots: list, timeout: float = 30.0) -> list[str]:
        """Wait until ``slots``' engines, asked to exit alone (their engine set stays), have
        exited; the ones still running, described.  This host's are watched by pid."""
        from ._procs import local_pids, wait_gone

        alive = {p.pid for p in wait_gone(local_pids(slots), timeout)}
        return [f"engine {s.engine_id} (pid {s.pid})" for s in slots if s.pid in alive]

    def end_engines(self, engine_sets: list, slots: list,
                    ask: Callable[[], bool]) -> tuple[bool, list[str]]:
        """Have ``slots``' engines exit: ``ask`` asks them through the controller (True once
        they all left it).  Returns that answer and the processes still running (described
        for a message); a launcher whose engines run elsewhere waits there until they exit."""
        return ask(), []

    def cleanup(self) -> None:
        """After a stop: remove what the launcher made outside the kernel's profile."""

    def after_stop(self, engine_set: BaseLauncher, timeout: float = 30.0) -> None:
        """Wait, after ipyparallel stopped an engine set, until it is really gone."""


class RemoteLauncher(Launcher):
    """Engines on other hosts: the controller listens where they can reach it."""

    engines_here = False
    one_set_per_engine = False
    ends_engines_by_pid = False
    forks_engines = False

    def listen_address(self, configured: str | None) -> str:
        if self.options.ip or configured:
            return self.options.ip or configured  # type: ignore[return-value]
        toward = self.engines_toward()
        try:
            return route_address(toward or _OUTSIDE)
        except OSError:
            return default_address()

    def engines_toward(self) -> str | None:
        """A host the engines run on, or next to (its route picks the interface)."""
        return None

    def engine_kwargs(self, set_id: str, count: int, environment: dict[str, str],
                      hosts: dict[str, int] | None = None) -> dict:
        return {"environment": dict(environment)}


def default_address() -> str:
    """This host's first non-loopback IPv4 address (loopback when it has none)."""
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not is_loopback(address.address):
                return address.address
    return "127.0.0.1"
