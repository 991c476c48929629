"""Engines on hosts reached over SSH (ipyparallel's SSHEngineSetLauncher).

``--hosts a:2,b:2`` (or the profile's ``c.SSHEngineSetLauncher.engines``) says how many engines
run where.  Before anything starts every host is tried with the same SSH options, so an
unreachable host or a refused key fails the start naming that host, instead of an engine
that never registers.  Engines receive the controller's address and keys in their environment
($IPP_CONNECTION_INFO, sent through the SSH session), so no key file is copied around.

Example::

    >>> parse_hosts("gpu1:2,alice@gpu2:1")
    {'gpu1': 2, 'alice@gpu2': 1}
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

from ._errors import ClusterError
from ._launcher_base import LaunchOptions, RemoteLauncher

# never prompt in a kernel nobody watches; give up on a dead host in seconds
SSH_DEFAULTS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
USAGE = "--hosts HOST:N[,HOST:N...] (e.g. --hosts gpu1:2,gpu2:2)"


def parse_hosts(text: str) -> dict[str, int]:
    """``"a:2,b"`` -> ``{"a": 2, "b": 1}``; a clear error for anything else."""
    hosts: dict[str, int] = {}
    for item in [part.strip() for part in (text or "").split(",") if part.strip()]:
        host, _, count = item.partition(":")
        if not host or (count and not count.isdigit()) or count == "0":
            raise ClusterError(f"cannot read {item!r} in --hosts: use {USAGE}")
        hosts[host] = hosts.get(host, 0) + (int(count) if count else 1)
    if not hosts:
        raise ClusterError(f"the ssh launcher needs hosts: {USAGE}, or "
                           "c.SSHEngineSetLauncher.engines in the profile")
    return hosts


class SshLauncher(RemoteLauncher):
    """Engines started over SSH on the listed hosts."""

    name = "ssh"
    # ipyparallel stops SSH engines by signalling over SSH and polling every minute: engines
    # told to exit through the controller are gone in a moment instead
    ask_engines_to_exit = True

    def __init__(self, options: LaunchOptions) -> None:
        super().__init__(options)
        self._hosts: dict[str, int] | None = None

    def hosts(self) -> dict[str, int]:
        """Host -> engine count, from ``--hosts`` or else the profile."""
        if self._hosts is None:
            configured = self._configured("engines")
            if self.options.hosts or not configured:
                self._hosts = parse_hosts(self.options.hosts or "")
            else:
                self._hosts = {h: (n if isinstance(n, int) else int(n.get("n", 1)))
                               for h, n in dict(configured).items()}
        return self._hosts

    def _configured(self, trait: str) -> Any:
        section = getattr(self.profile_config, "SSHEngineSetLauncher", None) if self.profile_config else None
        return section.get(trait) if section is not None and trait in section else None

    def ssh_args(self) -> list[str]:
        return SSH_DEFAULTS + list(self._configured("ssh_args") or [])

    def default_count(self) -> int | None:
        return sum(parse_hosts(self.options.hosts).values()) if self.options.hosts else None

    def engines_toward(self) -> str | None:
        host = next(iter(self.hosts()))
        return host.rsplit("@", 1)[-1]

    def check(self) -> None:
        if shutil.which("ssh") is None:
            raise ClusterError("the ssh launcher needs the ssh client, which is not on PATH")
        for host in self.hosts():
            self._try(host)

    def _try(self, host: str) -> None:
        """Log in once with the options the engines will use; name the host that fails."""
        try:
            done = subprocess.run(["ssh", *self.ssh_args(), host, "true"], capture_output=True,
                                  text=True, timeout=30, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"ssh to host {host!r} did not answer within 30 s: "
                               "check the name and that sshd runs there") from None
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()[-1:] or ["(no message)"]
            raise ClusterError(f"cannot start engines on host {host!r}: ssh failed "
                               f"(exit code {done.returncode}): {said[0]}\n"
                               "Check that the host is reachable and accepts your key "
                               "without a password (ssh-copy-id).")

    def engine_kwargs(self, set_id: str, count: int, environment: dict[str, str]) -> dict:
        kwargs = super().engine_kwargs(set_id, count, environment)
        kwargs["environment"] = {**dict(self._configured("environment") or {}),
                                 **kwargs["environment"]}  # the profile's, plus phalanx's
        kwargs["engines"] = dict(self.hosts())
        kwargs["ssh_args"] = self.ssh_args()
        if not self._configured("remote_python"):
            kwargs["remote_python"] = sys.executable  # the same environment on every host
        if self.profile_config is not None and "to_send" not in self.profile_config.get(
                "SSHEngineLauncher", {}):
            # the keys travel in $IPP_CONNECTION_INFO: copying files over a shared home could
            # truncate the very file being copied
            self.profile_config.SSHEngineLauncher.to_send = []
        return kwargs

    def forget(self, engine_set: Any) -> None:
        # Engines that exited on request need no SSH kill (ipyparallel's would signal a pid
        # that is gone and then wait on it); only end its per-engine watcher threads.
        for launcher in getattr(engine_set, "launchers", {}).values():
            waiting = getattr(launcher, "_stop_waiting", None)
            if waiting is not None:
                waiting.set()

    def set_name(self, engine_set: Any) -> str:
        return f"engine(s) on {', '.join(self.hosts())}"
