"""A real one-node Slurm cluster on this machine, for the Slurm launcher tests.

Debian's ``slurm-wlm`` and ``munge`` (installed here when missing and we are root): a private
munged (own key and socket), slurmctld and slurmd with a configuration in a temporary folder,
reached through ``$SLURM_CONF``.  Nothing of the machine's own Slurm or munge setup is touched.
The node claims 4 CPUs (``config_overrides``) so that two engines, one more from scaling and a
test's own job fit on a 2-core machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
from deadlines import hang_limit

PACKAGES = ("slurm-wlm", "munge")
CPUS = 4


def ensure_packages() -> str | None:
    """Install slurm-wlm and munge when missing; the reason they cannot be had, else None."""
    if all(shutil.which(tool) for tool in ("sbatch", "slurmctld", "slurmd", "munged")):
        return None
    if os.geteuid() != 0:
        return "needs root to install and run slurmctld, slurmd and munged"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "-o", "DPkg::Lock::Timeout=600", "update", "-qq"],
                    ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-qq", *PACKAGES]):
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            return f"cannot install {' '.join(PACKAGES)}: {done.stderr.strip()[-300:]}"
    return None


def _node_address() -> str:
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _config(folder: Path, node: str, address: str) -> str:
    return "\n".join([
        "ClusterName=phalanxtest", f"SlurmctldHost={node}({address})",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={folder}/munge.sock", f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool", f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd.pid", f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd.log", f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "ReturnToService=2", "SlurmdParameters=config_overrides",
        "MpiDefault=none", "JobCompType=jobcomp/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "SchedulerParameters=sched_interval=2",
        "MinJobAge=2",
        f"NodeName={node} NodeAddr={address} CPUs={CPUS} RealMemory=1000 State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP", ""])


class SlurmCluster:
    """slurmctld + slurmd + munged of one test module; :meth:`stop` leaves nothing running."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="phalanx-slurm-"))
        self.conf = self.folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(command), capture_output=True, text=True, env=self.env,
                              check=check, timeout=hang_limit(60))

    def start(self, timeout: float = hang_limit(90.0)) -> None:
        folder = self.folder
        for sub in ("state", "spool"):
            (folder / sub).mkdir()
        subprocess.run(["mungekey", "--create", f"--keyfile={folder}/munge.key"], check=True,
                       capture_output=True)
        self.run("munged", "--force", f"--socket={folder}/munge.sock", f"--key-file={folder}/munge.key",
                 f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                 f"--seed-file={folder}/munged.seed")
        node = socket.gethostname().split(".")[0]
        self.conf.write_text(_config(folder, node, _node_address()))
        self.run("slurmctld", "-i", "-f", str(self.conf))
        self.run("slurmd", "-f", str(self.conf))
        deadline = time.monotonic() + timeout
        while self.run("sinfo", "-h", "-o", "%t", check=False).stdout.strip() != "idle":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test Slurm node did not become idle:\n{self.logs()}")
            time.sleep(0.5)

    def queue(self) -> list[str]:
        """Job ids Slurm still lists (pending, running or completing)."""
        return self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()

    def logs(self) -> str:
        return "\n".join((self.folder / name).read_text()[-2000:] for name in ("slurmctld.log", "slurmd.log")
                         if (self.folder / name).exists())

    def _pid(self, name: str) -> int | None:
        try:
            return int((self.folder / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        self.run("scancel", "--partition=debug", check=False)
        self.run("scontrol", "shutdown", check=False)
        daemons = []
        for name in ("slurmctld", "slurmd", "munged"):
            pid = self._pid(name)
            try:
                daemons.append(psutil.Process(pid)) if pid else None
            except psutil.NoSuchProcess:
                continue
        for proc in daemons:
            if proc.name().startswith("munged"):
                proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(daemons, timeout=hang_limit(20))
        for proc in alive:
            proc.kill()
        shutil.rmtree(self.folder, ignore_errors=True)
