"""How a run survives its faults and changes size: resume plans, restarts, elastic resizes.

:class:`Recovery` is the collaborator of :class:`~phalanx.fit.run._run.FitRunner` that acts *between*
attempts of one run: it asks the engines which commits they hold and picks where to resume
(:func:`~._checkpoints.plan_resume`), restarts a failing rank's engine (``--max-restarts``), and
carries out a resize requested while a checkpointed run goes (``Session.scale`` during the run):
every rank stops at the same commit, the cluster is scaled, the data re-sharded, and the run
resumes from that commit on the new world size.  A resize request reaches the engines as a file
they check at each commit (local engines only: it lives in the kernel's private rendezvous dir).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..._cell_line import say
from ...cluster._locality import is_local
from ...wire._seam import Outcome, RankResult, ResumePlan
from ...runtime import held_commits
from ._checkpoints import Lineage, plan_resume
from ._dispatch import Prepared, prepare
from ._engine_calls import call_each
from ._errors import DistributedFitError, cause_of, restart_advice
from ._fit_options import FitOptions, FitUsageError
from ._rendezvous import Rendezvous
from ..telemetry._tracker import RunTracker

log = logging.getLogger("phalanx")


@dataclass
class Job:
    """What stays the same across the attempts of one run."""

    run_id: str
    name: str
    body: str
    opts: FitOptions
    user_ns: dict
    backend: str
    lineage: Lineage | None
    tracker: RunTracker
    started: float = field(default_factory=time.monotonic)
    changes: list[dict] = field(default_factory=list)


class Recovery:
    """The runner's resumes, restarts and resizes, and the resize asked for during a run.

    ``slots_for`` gives the engines a run's options use (refusing dead ones), ``engine_versions``
    checks theirs; the resize signal lives in ``rendezvous``'s private directory.
    """

    def __init__(self, cluster: Any, rendezvous: Rendezvous,
                 slots_for: Callable[[FitOptions], list],
                 engine_versions: Callable[[list], list[dict]]) -> None:
        self.cluster = cluster
        self._rendezvous = rendezvous
        self._slots_for = slots_for
        self._engine_versions = engine_versions
        self._job: Job | None = None         # the run going, if any
        self._resize_to: int | None = None   # the size asked for during it

    def run_started(self, job: Job) -> None:
        """``job`` runs now: resizes asked for from here on are its."""
        self._job = job

    def run_over(self) -> None:
        """The run ended: a resize asked for after its last commit is applied now."""
        self._job = None
        self._apply_late_resize()

    def request_resize(self, n: int) -> None:
        """Change the running (checkpointed) run's world size to ``n`` at its next commit.

        Example::

            session.fits.request_resize(3)   # what Session.scale does while such a run goes
        """
        job = self._job
        if job is None or job.lineage is None:
            raise FitUsageError("only a run with --checkpoint-every K can change its size while "
                                "it runs; wait for this one or interrupt it")
        if job.opts.n is not None:
            raise FitUsageError(f"run {job.name!r} was started with -n {job.opts.n}: it keeps that "
                                "many ranks; wait for it or interrupt it")
        control = self.control_path(job)
        if control is None:
            raise FitUsageError("elastic scaling needs every engine on this host (the resize "
                                "signal is a file the engines watch)")
        self.cluster.check_limit(n)
        self._resize_to = n
        open(control, "w").close()

    def queue_resize(self, n: int) -> str:
        """Scale to ``n`` engines once the running (fixed-size) run is over; says so.

        Example::

            session.fits.queue_resize(3)   # 'scale to 3 after run-4' (the panel's + mid-run)
        """
        job = self._job
        if job is None:
            raise FitUsageError("no run is going: scale now")
        self.cluster.check_limit(n)
        if n == self.cluster.size and self._resize_to is None:
            raise FitUsageError(f"the cluster already has {n} engine(s)")
        self._resize_to = n
        return self.pending_notice() or ""

    def pending_notice(self) -> str | None:
        """What a resize asked for during the run waits for, in words (None: nothing waits)."""
        job, n = self._job, self._resize_to
        if job is None or n is None:
            return None
        if job.lineage is not None and self.control_path(job) is not None:
            return f"resizing {job.name} to {n} at its next commit"
        return f"scale to {n} after {job.name}"

    # --- resume, restart, resize ------------------------------------------------------------

    def plan(self, job: Job, slots: list) -> ResumePlan | None:
        """Where this attempt resumes: the newest commit every rank can load."""
        lineage = job.lineage
        assert lineage is not None
        held = call_each(self.cluster, slots, held_commits, lineage.key, lineage.directory,
                         self.commit_scratch(job), what="resuming (asking which commits it holds)", timeout=30,
                         with_rank=True)
        plan = plan_resume(held)
        step = plan.step if plan else 0
        job.tracker.rewind(step, len(slots))
        job.changes.append({"kind": "resume", "step": step, "world_size": len(slots), "t": time.time(),
                            "sources": list(plan.sources) if plan else []})
        say(f"phalanx: resuming {job.name} at step {step}" + (
            f" ({_describe_sources(plan)})" if plan else ": no commit to resume from"))
        return plan

    def restart(self, job: Job, slots: list, results: dict[int, RankResult],
                 error: DistributedFitError, attempt: int) -> list:
        """Restart the failing rank's engine (and any dead one) before the next attempt."""
        assert error.rank is not None  # only a failure that names its rank is restarted
        failing = results[error.rank]
        ranks = sorted({error.rank} | {r for r, res in results.items()
                                       if res.outcome is Outcome.DIED or res.stopped})
        where = "resuming from the last commit" if job.lineage else "running again from step 0"
        say(f"phalanx: rank(s) {', '.join(map(str, ranks))} failed "
              f"({failing.error}); restarting and {where} "
              f"(restart {attempt} of {job.opts.max_restarts})")
        for rank in ranks:
            try:
                self.cluster.restart(rank)
            except Exception as exc:  # the slot is left dead; the run ends with both causes
                raise DistributedFitError(
                    f"{error.args[0]}\nphalanx tried to restart rank {rank}'s engine "
                    f"(--max-restarts), which failed: {cause_of(exc)}. Bring it back with "
                    f"{restart_advice(rank, slots[rank])}.", "failed", error.rank, results) from None
        job.changes.append({"kind": "restart", "attempt": attempt, "ranks": ranks, "t": time.time(),
                            "error": failing.error, "step": failing.steps})
        slots = self._slots_for(job.opts)
        if job.lineage is None:  # nothing to resume from: progress starts over
            job.tracker.rewind(0, len(slots))
        return slots

    def resize(self, job: Job, slots: list,
                results: dict[int, RankResult]) -> tuple[list, Prepared, list[dict]]:
        """Every rank stopped at the same commit: scale the cluster and continue from there."""
        n, self._resize_to = self._resize_to, None
        self._clear_control(job)
        step = max(r.last_commit or 0 for r in results.values())
        if n is not None and n != self.cluster.size:
            self.cluster.scale(n)
        slots = self._slots_for(job.opts)
        prepared = prepare(job.body, job.opts, job.user_ns, len(slots))  # shards for the new size
        versions = self._engine_versions(slots)
        job.changes.append({"kind": "resize", "from": len(results), "to": len(slots), "step": step,
                            "t": time.time()})
        say(f"phalanx: {job.name} continues on {len(slots)} rank(s) from step {step}")
        job.lineage = replace(job.lineage, world_size=len(slots)) if job.lineage else None
        return slots, prepared, versions

    def _apply_late_resize(self) -> None:
        """A resize asked for after the last commit: apply it now that the run is over."""
        n, self._resize_to = self._resize_to, None
        if n is not None and self.cluster.running and n != self.cluster.size:
            try:
                self.cluster.scale(n)
            except Exception as exc:
                log.warning("phalanx: scaling to %s after the run failed: %s", n, exc)

    def control_path(self, job: Job) -> str | None:
        """The file whose appearance asks ``job``'s ranks to stop at their next commit for a
        resize; None when the run keeps no commits or an engine is on another host."""
        slots = self.cluster.slots()
        if job.lineage is None or not all(is_local(s) for s in slots):
            return None
        return os.path.join(self._rendezvous.directory, f"{job.lineage.key}.resize")

    def commit_scratch(self, job: Job) -> str | None:
        """Where ``job``'s sharded commits go without ``--checkpoint-dir``: a folder of the
        kernel's private rendezvous directory, which engines on its host share; None when an
        engine is on another host (it could not read the other ranks' shards there)."""
        if job.lineage is None or not all(is_local(s) for s in self.cluster.slots()):
            return None
        return os.path.join(self._rendezvous.directory, "commits")

    def _clear_control(self, job: Job) -> None:
        path = self.control_path(job)
        if path and os.path.exists(path):
            os.remove(path)


def _describe_sources(plan: ResumePlan) -> str:
    if set(plan.sources) == {"sharded"}:
        return f"{len(plan.sources)} rank(s) from the sharded commit"
    parts = []
    for rank, source in enumerate(plan.sources):
        parts.append(f"rank {rank} from rank {plan.src}'s memory" if source == "peer"
                     else f"rank {rank} from its {source}")
    return ", ".join(parts)
