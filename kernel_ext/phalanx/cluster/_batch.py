"""Engines as batch jobs: Slurm (sbatch/squeue/scancel), PBS (qsub) and LSF (bsub).

ipyparallel writes the job script and submits it; phalanx adds what a person needs to see when
the job does not turn into engines: the submit command's own message (an unknown partition),
a job that stays pending with Slurm's reason (at once where waiting cannot help, such as a
--time over the partition's limit), a job that ended before its engines registered.

Example::

    >>> SlurmLauncher(LaunchOptions(submit_args="--partition=gpu --time=2:00:00")).submit_flags()
    ['--partition=gpu', '--time=2:00:00']
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from typing import TYPE_CHECKING

from ._errors import ClusterError
from ._launcher_base import LaunchOptions, RemoteLauncher

if TYPE_CHECKING:
    from ipyparallel.cluster.launcher import BaseLauncher

    from ._ranks import EngineSlot

# sh runs the submit command with its error output on stdout: ipyparallel keeps only stdout,
# and the batch system's own message ("invalid partition specified") is what to show.
_MERGED = 'exec "$0" "$@" 2>&1'
POLL_S = 2.0
JOB_ID = "batch_job"  # slot.info key: the job an engine runs in
# Slurm job states in which a job still holds (or waits for) its nodes
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
        "SIGNALING", "STAGE_OUT")
# Pending reasons that waiting does not cure: the job asks for more than the partition, account
# or QOS will ever allow, or it is held.  Reported at once instead of at the start timeout.
NEVER_BY_WAITING = {
    "PartitionTimeLimit": "its --time exceeds the partition's time limit",
    "PartitionNodeLimit": "its node count is outside the partition's limits",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "BadConstraints": "its constraints can never be satisfied",
    "InvalidAccount": "its account is not valid",
    "InvalidQOS": "its QOS is not valid",
    "DependencyNeverSatisfied": "its dependency can never be satisfied",
    "JobHeldUser": "it is held (scontrol release releases it)",
    "JobHeldAdmin": "it is held by an administrator",
    "AssocMaxWallDurationPerJobLimit": "its --time exceeds the association's limit",
    "QOSMaxWallDurationPerJobLimit": "its --time exceeds the QOS's limit",
    "AssocMaxNodesPerJobLimit": "its node count exceeds the association's limit",
    "QOSMaxNodePerJobLimit": "its node count exceeds the QOS's limit",
}


class BatchLauncher(RemoteLauncher):
    """Shared by the batch systems: a submit command on PATH and extra submit flags.

    One rank of a job of several engines restarts alone: its engine is asked to exit through
    the controller (the job goes on with the others) and its successor is a job of one engine,
    placed by the batch system.  The restart returns once the old engine has exited: watched by
    pid on this host, through the batch system where it can look (Slurm), else once it has
    left the controller.
    """

    submit = "qsub"
    system = "PBS"
    restarts_one_engine = True

    def replaces_alone(self, slot: EngineSlot) -> bool:
        return True  # the successor is a job of its own: the batch system places it

    def __init__(self, options: LaunchOptions) -> None:
        super().__init__(options)
        self.profile_dir = ""
        self._checked_at = 0.0

    def check(self) -> None:
        if shutil.which(self.submit) is None:
            raise ClusterError(
                f"the {self.name} launcher submits jobs with {self.submit}, which is not on PATH: "
                f"run JupyterLab where {self.system} commands work (a login node, or inside an "
                "allocation), or choose another --launcher")

    def submit_flags(self) -> list[str]:
        try:
            return shlex.split(self.options.submit_args or "")
        except ValueError as exc:
            raise ClusterError(f"--{self.name}-args {self.options.submit_args!r}: {exc}") from None

    def engine_kwargs(self, set_id: str, count: int, environment: dict[str, str],
                      hosts: dict[str, int] | None = None) -> dict:
        kwargs = super().engine_kwargs(set_id, count, environment)
        kwargs["submit_command"] = ["sh", "-c", _MERGED, self.submit, *self.submit_flags()]
        if self.profile_dir:  # the job script goes with the cluster's files, not the notebook's
            kwargs["batch_file_name"] = os.path.join(self.profile_dir, "log", f"{self.name}-{set_id}.sh")
        return kwargs

    def submit_error(self, exc: subprocess.CalledProcessError) -> ClusterError:
        """A rejected submission, with the batch system's own words."""
        said = (exc.output or b"").decode("utf8", "replace").strip() if isinstance(exc.output, bytes) \
            else str(exc.output or "").strip()
        return ClusterError(f"{self.submit} refused the engine job (exit code {exc.returncode}):\n"
                            f"    {said or '(no message)'}\n"
                            f"Check the flags given with --{self.name}-args or in the profile.")

    def set_name(self, engine_set: BaseLauncher) -> str:
        job = getattr(engine_set, "job_id", "")
        return f"{self.system} job {job}" if job else f"the {self.system} job"


class SlurmLauncher(BatchLauncher):
    """Engines as one Slurm job per engine set (ipyparallel's SlurmEngineSetLauncher)."""

    name = "slurm"
    submit = "sbatch"
    system = "Slurm"

    def engines_toward(self) -> str | None:
        """Slurm's controller host: compute nodes sit on its network."""
        try:
            out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                                 timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        match = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", out, re.M)
        if not match:
            return None
        return match.group(2) or match.group(1)

    def job_state(self, job_id: str) -> tuple[str, str] | None:
        """(state, reason) of a job Slurm still knows about, ``None`` once it has forgotten it."""
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
        if not out or "|" not in out:
            return None
        state, reason = out.splitlines()[0].split("|", 1)
        return state, reason

    def set_failure(self, engine_set: BaseLauncher, waited_out: bool) -> str | None:
        job = getattr(engine_set, "job_id", "")
        if not job or (not waited_out and time.monotonic() - self._checked_at < POLL_S):
            return None
        self._checked_at = time.monotonic()
        found = self.job_state(job)
        if found is None:
            return f"Slurm job {job} ended before its engines registered"
        state, reason = found
        if state == "PENDING" and reason in NEVER_BY_WAITING:
            return (f"Slurm job {job} cannot start as asked: Slurm's reason is {reason} "
                    f"({NEVER_BY_WAITING[reason]}). phalanx cancelled it: change --slurm-args or "
                    "the profile's options")
        if state == "PENDING" and waited_out:
            return (f"Slurm job {job} is still pending after the start timeout; Slurm's reason: "
                    f"{reason}. phalanx cancelled it: ask for what the cluster can give "
                    "(--slurm-args, -n) or wait longer (--timeout)")
        if state not in LIVE:
            return f"Slurm job {job} is {state} ({reason}) and its engines did not register"
        return None

    def await_exited(self, slots: list, timeout: float = 30.0) -> list[str]:
        """This host's engines by pid; the others by a look at their pid on their node, inside
        their job (``srun --overlap``: a step beside the engines', on that node only)."""
        from ._locality import is_local

        running = super().await_exited([s for s in slots if is_local(s)], timeout)
        for slot in (s for s in slots if not is_local(s)):
            if not self.gone_on_node(slot, timeout):
                running.append(f"engine {slot.engine_id} (pid {slot.pid} on {slot.host})")
        return running

    def gone_on_node(self, slot: EngineSlot, timeout: float) -> bool:
        """Whether ``slot``'s engine process has exited on its node, within ``timeout`` s."""
        job = slot.info.get(JOB_ID)
        if not job or not slot.pid or not slot.host:
            return True  # nothing to look with: it has left the controller, which is all we know
        watch = f"for _ in $(seq {int(timeout * 5)}); do kill -0 {int(slot.pid)} 2>/dev/null " \
                f"|| exit 0; sleep 0.2; done; exit 1"
        try:
            done = subprocess.run(["srun", f"--jobid={job}", "--overlap", f"--nodelist={slot.host}",
                                   "-N1", "-n1", "--quiet", "sh", "-c", watch],
                                  capture_output=True, text=True, timeout=timeout + 15)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def note_started(self, engine_set: BaseLauncher, slots: list[EngineSlot]) -> None:
        job = getattr(engine_set, "job_id", "")
        for slot in slots:  # what await_exited needs to look inside the job
            slot.info[JOB_ID] = job

    def after_stop(self, engine_set: BaseLauncher, timeout: float = 60.0) -> None:
        job = getattr(engine_set, "job_id", "")
        deadline = time.monotonic() + timeout
        while job and (self.job_state(job) or ("GONE",))[0] in LIVE:
            if time.monotonic() > deadline:
                raise ClusterError(f"Slurm job {job} is still in squeue {timeout:g} s after "
                                   f"scancel: check it with squeue -j {job}")
            time.sleep(0.2)


class PbsLauncher(BatchLauncher):
    """Engines as a PBS job array (ipyparallel's PBSEngineSetLauncher)."""

    name = "pbs"


class LsfLauncher(BatchLauncher):
    """Engines as an LSF job (ipyparallel's LSFEngineSetLauncher)."""

    name = "lsf"
    submit = "bsub"
    system = "LSF"

    def engine_kwargs(self, set_id: str, count: int, environment: dict[str, str],
                      hosts: dict[str, int] | None = None) -> dict:
        # ipyparallel pipes the script into a bare `bsub`: flags cannot ride on the command
        if self.submit_flags():
            raise ClusterError("LSF reads its options from the job script: put them in the "
                               "profile's c.LSFEngineSetLauncher.batch_template (#BSUB lines) "
                               "instead of --lsf-args")
        kwargs = RemoteLauncher.engine_kwargs(self, set_id, count, environment)
        if self.profile_dir:
            kwargs["batch_file_name"] = os.path.join(self.profile_dir, "log", f"lsf-{set_id}.sh")
        return kwargs
