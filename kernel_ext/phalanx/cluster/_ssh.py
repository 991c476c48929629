"""Engines on hosts reached over SSH (ipyparallel's SSHEngineSetLauncher).

``--hosts a:2,b:2`` (or the profile's ``c.SSHEngineSetLauncher.engines``) says how many engines
run where.  Before anything starts every host is tried with the same SSH options, so an
unreachable host or a refused key fails the start naming that host, instead of an engine
that never registers.  Engines receive the controller's address and keys in their environment
($IPP_CONNECTION_INFO, sent through the SSH session), so no key file is copied around.

Nothing is left on the hosts: ipyparallel creates the engines' profile on each host (``IPython
profile create``, which writes default config files and says so on stderr, into the cell) and
logs there.  phalanx points it at a private folder per cluster instead (made, with those config
files already in place so nothing is generated, by the login check) and removes that folder at
``%cluster stop``; a ``remote_profile_dir`` set in the profile is used as it is.

One rank restarts alone: its engine is asked to exit, phalanx waits on its host until the
process (and its nanny) is gone (:mod:`._ssh_exit`), and a one-engine set starts on that host.

Example::

    >>> parse_hosts("gpu1:2,alice@gpu2:1")
    {'gpu1': 2, 'alice@gpu2': 1}
"""

from __future__ import annotations

import logging
import secrets
import shutil
import subprocess
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from ._errors import ClusterError
from ._launcher_base import LaunchOptions, RemoteLauncher
from ._ssh_exit import end_on_hosts
from ._ssh_waits import end as end_ssh_waits
from ._ssh_waits import install as killable_ssh_waits

if TYPE_CHECKING:
    from ipyparallel.cluster.launcher import BaseLauncher

    from ._ranks import EngineSlot

log = logging.getLogger("phalanx")

# never prompt in a kernel nobody watches; give up on a dead host in seconds
SSH_DEFAULTS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
USAGE = "--hosts HOST:N[,HOST:N...] (e.g. --hosts gpu1:2,gpu2:2)"
# ipyparallel's `IPython profile create` on each host generates these unless they exist
PROFILE_FILES = ("ipython_config.py", "ipython_kernel_config.py")
LAUNCH_HOST = "launch_host"  # slot.info key: the --hosts entry an engine was started on


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
    restarts_one_engine = True

    def __init__(self, options: LaunchOptions) -> None:
        super().__init__(options)
        killable_ssh_waits()  # so that a stop leaves no ipyparallel wait session running
        self._hosts: dict[str, int] | None = None
        # on each host's own temporary folder; the name is not guessable by other users
        self._private = f"/tmp/phalanx-engines-{secrets.token_hex(8)}"
        self._prepared: set[str] = set()  # hosts where the private folder was made

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

    def remote_profile_dir(self) -> str | None:
        """The engines' profile folder on the hosts: the profile's, else phalanx's private one."""
        return None if self._configured("remote_profile_dir") else self._private

    def _try(self, host: str) -> None:
        """Log in once with the options the engines will use (making the private folder);
        name the host that fails."""
        folder = self.remote_profile_dir()
        command = "true" if folder is None else (
            f"umask 077 && mkdir -p {folder} && cd {folder} && touch {' '.join(PROFILE_FILES)}")
        try:
            done = subprocess.run(["ssh", *self.ssh_args(), host, command], capture_output=True,
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
        if folder is not None:
            self._prepared.add(host)

    def engine_kwargs(self, set_id: str, count: int, environment: dict[str, str],
                      hosts: dict[str, int] | None = None) -> dict:
        kwargs = super().engine_kwargs(set_id, count, environment)
        kwargs["environment"] = {**dict(self._configured("environment") or {}),
                                 **kwargs["environment"]}  # the profile's, plus phalanx's
        kwargs["engines"] = dict(hosts or self.hosts())
        kwargs["ssh_args"] = self.ssh_args()
        if self.remote_profile_dir() is not None:
            kwargs["remote_profile_dir"] = self.remote_profile_dir()
        if not self._configured("remote_python"):
            kwargs["remote_python"] = sys.executable  # the same environment on every host
        if self.profile_config is not None and "to_send" not in self.profile_config.get(
                "SSHEngineLauncher", {}):
            # the keys travel in $IPP_CONNECTION_INFO: copying files over a shared home could
            # truncate the very file being copied
            self.profile_config.SSHEngineLauncher.to_send = []
        return kwargs

    def python(self) -> str:
        return str(self._configured("remote_python") or sys.executable)

    def note_started(self, engine_set: BaseLauncher, slots: list[EngineSlot]) -> None:
        """Remember the --hosts entry each new engine runs on (its pid is the one ipyparallel
        started over SSH there), so that a restart starts its replacement on the same host."""
        started = {launcher.pid: key.rsplit("/", 1)[0]
                   for key, launcher in dict(getattr(engine_set, "launchers", {})).items()}
        for slot in slots:
            host = started.get(slot.pid)
            if host is not None:
                slot.info[LAUNCH_HOST] = host

    def hosts_of(self, slots: list) -> dict[str, int] | None:
        hosts = [s.info.get(LAUNCH_HOST) for s in slots]
        return dict(Counter(hosts)) if None not in hosts else None

    def end_engines(self, engine_sets: list, slots: list, ask: Callable[[], bool]) -> tuple[bool, list[str]]:
        """Ask the engines to exit and return once their processes are gone on every host."""
        plan: dict[str, tuple[list[str], list[int]]] = {}
        for slot in slots:
            host = slot.info.get(LAUNCH_HOST)
            if host is not None and slot.pid:
                command = ["ssh", *self.ssh_args(), host, self.python(), "-"]
                plan.setdefault(host, (command, []))[1].append(slot.pid)
        answer: list[bool] = []
        left = end_on_hosts(plan, lambda: answer.append(ask()))
        self._let_go(engine_sets, {s.pid for s in slots})
        return bool(answer and answer[0]), [f"{what} on host {host}" for host, what in left.items()]

    def _let_go(self, engine_sets: list, pids: set) -> None:
        """End ipyparallel's watcher threads of engines that exited on request: they need no
        SSH kill (ipyparallel's would signal a pid that is gone and wait on it), and no copy of
        their log (fetched over scp, on the cluster's event loop)."""
        for engine_set in engine_sets:
            for launcher in list(getattr(engine_set, "launchers", {}).values()):
                if launcher.pid in pids:
                    launcher._output = ""
                    waiting = getattr(launcher, "_stop_waiting", None)
                    if waiting is not None:
                        waiting.set()
                    end_ssh_waits(launcher)  # the wait session already under way, too

    def forget(self, engine_set: BaseLauncher) -> None:
        self._let_go([engine_set], {launcher.pid for launcher in
                                    getattr(engine_set, "launchers", {}).values()})

    def cleanup(self) -> None:
        """Remove the private folder from every host it was made on (after the engines)."""
        hosts, self._prepared = sorted(self._prepared), set()
        calls = [subprocess.Popen(["ssh", *self.ssh_args(), host, f"rm -rf {self._private}"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for host in hosts]
        for host, call in zip(hosts, calls):
            try:
                call.wait(timeout=30)
            except subprocess.TimeoutExpired:
                call.kill()
                call.wait()
                log.warning("phalanx: removing %s on host %s did not finish", self._private, host)

    def set_name(self, engine_set: BaseLauncher) -> str:
        return f"engine(s) on {', '.join(self.hosts())}"
