"""Run a ``%%distributed_fit`` cell on the engines and bring the result back.

One :class:`FitRunner` per session.  What makes re-running a cell cheap lives in the objects it
is composed of: its :class:`~._rendezvous.Rendezvous` (the metric receiver, the rendezvous store)
and its :class:`~._engine_cache.EngineSetCache` (the group each engine holds, which shipped
objects it already has, its package versions).  A run is one or more *attempts*: the first,
then - with ``--max-restarts`` - one more after each failure (the failing rank's engine is
restarted and the run resumes from its last commit), and with elastic scaling one more after
each resize; its :class:`~._recovery.Recovery` does what happens between them.  Each attempt's
faults become one clear error (see :mod:`._waiter` and :mod:`._errors`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import sys
import time
import uuid
from typing import Any, Callable, Sequence

from ... import events
from ...wire._seam import CheckpointSpec, GroupSpec, RankResult, ResumePlan, RunSpec
from ...runtime import run_cell
from ._bring_back import bring_back
from ._checkpoints import Lineage, choose_lineage, warn_if_unused
from ._control import RunControl
from ._dispatch import Prepared, choose_backend, prepare
from ._engine_cache import EngineSetCache
from ._engine_calls import Undelivered, call_each, dispatch
from ._errors import DistributedFitError, failure, restart_advice
from ..exports._run_shape import option_params
from ..exports._live import open_live
from ._kept_on_engines import KeptNames
from ..analysis._manifest import build_manifest, check_versions, engine_versions
from ._fit_options import FitOptions, FitUsageError
from ..debug._post_mortem import attach_post_mortem
from ..telemetry._profile import ProfileReport
from ._recovery import Job, Recovery
from ..telemetry._record import RunRecord
from ._rendezvous import Rendezvous
from ..telemetry._run_log import RunLog
from ..telemetry._tracker import PUBLISH_INTERVAL_S, RunTracker
from ._waiter import Waiter
from ._xgboost_tracker import xgboost_tracker

log = logging.getLogger("phalanx")


class FitRunner:
    """Runs cells on a :class:`~phalanx.cluster.ClusterManager`; emits events on ``emit``."""

    def __init__(self, cluster: Any, emit: Callable[[dict], None]) -> None:
        self.cluster = cluster
        self._emit = emit
        self._id = uuid.uuid4().hex[:8]
        self._counter = itertools.count(1)
        # The notebook's runs on disk (set by the session): run numbers continue from it, and
        # a run's history is written into it unless --keep-history says where.
        self.run_log: RunLog | None = None
        self._numbered_from_log = False
        self.engines = EngineSetCache(f"phx-{self._id}")
        self.rendezvous = Rendezvous()
        self.recovery = Recovery(cluster, self.rendezvous, self._slots_for, self._engine_versions)
        self._lineage: Lineage | None = None          # the last run's checkpoints (for --resume)
        self.active: RunTracker | None = None
        self.active_name: str | None = None
        self.last: RunRecord | None = None
        self.last_memory: dict[int, dict] = {}   # the engines' last samples of the last run
        self.control = RunControl()  # stop requests and the wait loop's message pump
        self.memory_interval_s = 1.0  # engines sample their memory this often during a run (0: off)
        self.kept = KeptNames()  # what --keep left live on the engines
        self._held_by: tuple[tuple[str, ...], dict] = ((), {})  # last run's engines, shares

    # --- public -----------------------------------------------------------------------------

    def run(self, body: str, opts: FitOptions, user_ns: dict, on_start: Callable | None = None) -> RunRecord:
        """Run ``body`` on the engines; returns the record or raises DistributedFitError."""
        if self.active is not None:
            raise FitUsageError(f"run {self.active_name!r} is still running in this kernel; "
                                "wait for it or interrupt it first")
        self.control.begin()
        slots = self._slots_for(opts)
        prepared = prepare(body, opts, user_ns, len(slots), self._kept_for(slots))
        backend = choose_backend(opts, slots, self.cluster.launcher)
        versions = self._engine_versions(slots)
        run_id = f"{self._id}-{self._next_number()}"
        lineage = choose_lineage(opts, self._lineage, f"ckpt-{run_id}", len(slots))
        name = opts.name or f"run-{run_id.split('-')[1]}"
        tracker = RunTracker(run_id, len(slots), opts.steps, self._emit,
                             history_dir=self._history_dir(opts, run_id, name))
        job = Job(run_id, name, body, opts, user_ns, backend, lineage, tracker)
        export = open_live(opts, tracker, name)  # --tensorboard, --mlflow (a missing package: here)
        self.rendezvous.receiver_for(slots).register(run_id, tracker.on_batch)
        self.recovery.run_started(job)  # before the run shows as active: a resize can find it
        self.active, self.active_name = tracker, job.name
        try:
            self._emit(events.run_started(run_id, len(slots), opts.steps, opts.train.sync, name=job.name))
            if on_start is not None:
                on_start(tracker, job.name)
            self.control.call_soon(tracker.start, PUBLISH_INTERVAL_S)  # a warm re-run: no thread
            if export is not None:
                export.start()
            return self._attempts(job, slots, prepared, versions)
        except BaseException as exc:  # ended between attempts (a restart or resize that raised)
            if self.last is None or self.last.run_id != run_id:  # unrecorded: views still wait
                said = str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__
                self._emit(events.run_ended(
                    run_id, "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed",
                    time.monotonic() - job.started, said))
            raise
        finally:
            tracker.stop()
            if export is not None:  # every row is in: the rest, the summary, the manifest
                export.finish(self.last if self.last and self.last.run_id == run_id else None)
            self.last_memory = tracker.memory.latest()  # each rank's figures as the run ended
            self.rendezvous.receiver_for(slots).unregister(run_id)
            self.active = self.active_name = None
            self._lineage = job.lineage or self._lineage
            self.recovery.run_over()

    def _next_number(self) -> int:
        """The next run's number: after this kernel's last and, the first time, after every
        run the notebook's log holds, so a name is not given twice across kernel restarts."""
        if self.run_log is not None and not self._numbered_from_log:
            self._numbered_from_log = True
            self._counter = itertools.count(max(next(self._counter), self.run_log.next_number()))
        return next(self._counter)

    def _history_dir(self, opts: FitOptions, run_id: str, name: str) -> str:
        """Where the run's metric history is written: ``--keep-history DIR/<name>-<id>``, else
        in the notebook's run log, else under the session's temporary directory (removed with
        it when the kernel closes)."""
        if opts.keep_history:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            return os.path.join(opts.keep_history, f"{safe}-{run_id}")
        if self.run_log is not None:
            return self.run_log.history_dir(run_id)
        return os.path.join(self.rendezvous.directory, "history", run_id)

    def request_resize(self, n: int) -> None:
        """Change the running (checkpointed) run's world size to ``n`` at its next commit."""
        self.recovery.request_resize(n)

    def queue_resize(self, n: int) -> str:
        """Scale to ``n`` engines once the running (fixed-size) run is over; says so."""
        return self.recovery.queue_resize(n)

    def pending_notice(self) -> str | None:
        """What a resize asked for during the run waits for, in words (None: nothing waits)."""
        return self.recovery.pending_notice()

    def forget(self, names: list[str] | None = None) -> tuple[str, ...]:
        """Release kept objects (``%cluster forget NAMES``; all with None) on the engines that
        hold them; returns the names released."""
        gone = self.kept.forget(names)
        if gone and self.cluster.running:
            self._forget_on_engines(list(gone) if names is not None else None)
        return gone

    def kept_description(self) -> str:
        """The names kept live on this cluster's engines, each with its memory ('' if none)."""
        held = {s.slot_id for s in self.cluster.slots()} if self.cluster.running else set()
        return self.kept.describe() if self.kept.engines and set(self.kept.engines) <= held else ""

    def shares(self) -> dict[int, dict[str, int]]:
        """Each rank's bytes of parameters, gradients and optimizer state at the end of the last
        run, while the cluster still has that run's engines (else {})."""
        engines, held = self._held_by
        running = _engine_set(self.cluster.slots()) if self.cluster.running else ()
        return held if engines and engines == running else {}

    def _kept_for(self, slots: list) -> tuple[str, ...]:
        """The kept names a run on ``slots`` reads live; kept objects of another engine set
        (a restart, a scale, -n) are released first, said in the cell."""
        engines = _engine_set(slots)
        stale = self.kept.stale_for(engines)
        if stale:
            self.kept.forget()
            self._forget_on_engines(None)
            print(f"phalanx: {', '.join(stale)} (--keep) released: they were kept by other "
                  "engines than this run's (a restart, a scale or -n); the notebook's values "
                  "are used where it has them", file=sys.stderr)
        return self.kept.names_for(engines)

    def _forget_on_engines(self, names: list[str] | None) -> None:
        from ...runtime import forget_kept

        live = [s for s in self.cluster.slots() if s.state == "idle"]
        try:
            call_each(self.cluster, live, forget_kept, names, what="release kept objects",
                      timeout=30.0)
        except DistributedFitError as exc:  # an engine that went holds nothing any more
            log.warning("phalanx: releasing kept objects: %s", exc)

    def release_listeners(self) -> None:
        """Close the sockets opened for the engines (metric stream, TCP rendezvous): a stopped
        cluster's network needs none, and the next run opens what its cluster needs."""
        self.rendezvous.release_listeners()

    def close(self) -> None:
        self.rendezvous.close()

    # --- attempts ---------------------------------------------------------------------------

    def _attempts(self, job: Job, slots: list, prepared: Prepared, versions: list[dict]) -> RunRecord:
        resume, restarts, first_error = job.opts.resume, 0, None
        while True:
            plan = self.recovery.plan(job, slots) if resume and job.lineage is not None else None
            began = time.monotonic()
            status, results = self._attempt(job, slots, prepared, plan)
            if status == "resized":
                slots, prepared, versions = self.recovery.resize(job, slots, results)
                resume = True
                continue
            if status == "done":
                warn_if_unused(job.lineage, results)
                self.kept.record(_engine_set(slots), job.opts.train.keep,
                                 [results[r].kept for r in range(len(slots))])
                return self._record(job, slots, results, status, versions, prepared)
            error = failure(status, results, slots, job.opts, time.monotonic() - began,
                            _exact_steps(job.tracker, results))
            if status == "interrupted" and self.control.stopped_by:
                error.args = (f"{job.name} was stopped ({self.control.stopped_by}): {error.args[0]}",)
            first_error = first_error or error
            if (status != "failed" or error.status == "quit" or error.rank is None
                    or restarts >= job.opts.max_restarts):
                final = _final(first_error, error, restarts)
                self._record(job, slots, results, status, versions, prepared,
                             final.args[0]).failed_rank = error.rank
                if job.opts.train.returns:
                    final.args = (final.args[0] + _what_came_back(status, results,
                                                                  job.opts.train.returns),
                                  *final.args[1:])
                if final.status == "failed":  # a rank that raised keeps its frames for %debug
                    attach_post_mortem(final, job.run_id, slots, results)
                raise final
            restarts += 1
            slots = self.recovery.restart(job, slots, results, error, restarts)
            versions = self._engine_versions(slots)
            resume = True

    def _attempt(self, job: Job, slots: list, prepared: Prepared,
                 plan: ResumePlan | None) -> tuple[str, dict[int, RankResult]]:
        specs = self._specs(job, slots, prepared, plan)
        key = specs[0].group.key
        # What an engine lacks of the shipped objects travels with its run: no message of its own
        objects = [prepared.objects_for(rank) for rank in range(len(slots))]
        stashes = self.engines.stashes(slots, objects)  # the shards too: unchanged, none is sent
        results: dict[int, RankResult] = {}
        try:  # a rank whose engine left before its task was sent fails like one that died in it
            with xgboost_tracker(job.body, job.user_ns, slots, job.opts.collective_timeout) as xgb:
                specs = [dataclasses.replace(s, adapter_data=(("xgboost", xgb),)) for s in specs] \
                    if xgb else specs
                ars = [dispatch(self.cluster, s, run_cell, spec, stash)
                       for s, spec, stash in zip(slots, specs, stashes)]
                delivered = [r for r, ar in enumerate(ars) if not isinstance(ar, Undelivered)]
                self.engines.shipped([slots[r] for r in delivered], [objects[r] for r in delivered])
                status = Waiter(self.cluster, slots, ars, job.tracker, job.opts,
                                self.control.pump).wait(results)
        except BaseException:
            self.engines.group_torn_down(slots)
            raise
        # A rank whose process was killed or replaced sends no final batch: waiting for one
        # would add the whole quiet deadline to the error's arrival.
        job.tracker.wait_final([r for r, res in results.items() if not res.outcome.kernel_made],
                               2.0)
        # Failed ranks tore their group down, and a resize changes it: everyone re-forms next time.
        if status == "done":
            self.engines.group_formed(slots, key)
        else:
            self.engines.group_torn_down(slots)
        return status, results

    def _record(self, job: Job, slots: list, results: dict[int, RankResult], status: str,
                versions: list[dict], prepared: Prepared, error: str | None = None) -> RunRecord:
        wall = time.monotonic() - job.started
        tracker = job.tracker
        tracker.drain()  # every row that arrived is in the digest the summary and manifest use
        record = RunRecord(job.run_id, job.name, status, len(slots), wall,
                           _exact_steps(tracker, results), tracker.history, changes=list(job.changes),
                           digest=tracker.digest, parts_series=tracker.parts_series,
                           memory=tracker.memory.peaks(),
                           timing=tracker.timing.totals(), total_steps=tracker.total_steps,
                           held={r: res.held for r, res in results.items() if res.held})
        record.manifest = build_manifest(job.opts, slots, job.backend, prepared, versions, record)
        record.manifest["history"] = record.history_manifest()
        record.manifest["checkpoint"] = _checkpoint_manifest(job.lineage, results)
        record.manifest["changes"] = list(job.changes)
        record.manifest["options"] = option_params(job.opts)
        if job.opts.train.profile and status == "done":
            record.profile = ProfileReport.from_results(results, job.name, slots)
            record.manifest["profile"] = os.path.basename(record.profile.path) if record.profile else None
        self.last = record
        self._held_by = (_engine_set(slots), record.held)
        # the line the cell's error starts with (rank, exception, step), for the panel
        record.error = error.splitlines()[0].rstrip(":") if error else None
        self._emit(events.run_ended(job.run_id, status, wall, record.error))
        bring_back(job.user_ns, status, results, prepared.memos)
        return record

    # --- preparation ------------------------------------------------------------------------

    def _slots_for(self, opts: FitOptions) -> list:
        if not self.cluster.running:
            raise FitUsageError("no cluster is running: start one with %cluster start -n 2")
        slots = self.cluster.slots()
        world = opts.n or len(slots)
        if world > len(slots):
            raise FitUsageError(f"-n {world} asks for more ranks than the {len(slots)} engine(s) "
                                f"of the cluster: %cluster scale {world} first")
        slots = slots[:world]
        dead = [r for r, s in enumerate(slots) if s.state != "idle"]  # dead, or being replaced
        if dead:
            alone = getattr(slots[dead[0]], "restarts_alone", True)
            raise FitUsageError(f"rank(s) {', '.join(map(str, dead))} are dead: bring them back "
                                f"with {restart_advice(dead[0], slots[dead[0]])}"
                                + (" (or %cluster restart for all)" if alone else ""))
        return slots

    def _engine_versions(self, slots: list) -> list[dict]:
        """The engines' package versions, checked to agree (asked once per cluster layout)."""
        def ask() -> list[dict]:
            versions = call_each(self.cluster, slots, engine_versions,
                                 what="the run was starting (checking package versions)")
            check_versions(versions, slots)  # raises before anything is cached or run
            return versions

        return self.engines.versions((self.cluster.topology(), len(slots)), ask)

    def _specs(self, job: Job, slots: list, prepared: Prepared,
               plan: ResumePlan | None) -> list[RunSpec]:
        """Each rank's spec: the same run, its own rank (in the spec and in its group's)."""
        key = self.engines.group_key(slots, job.opts.collective_timeout)
        store = self.rendezvous.store_for(slots, key)
        receiver = self.rendezvous.receiver_for(slots)
        opts = job.opts
        checkpoint = None
        if job.lineage is not None:
            checkpoint = CheckpointSpec(job.lineage.key, job.lineage.every, job.lineage.directory,
                                        resume=plan, control=self.recovery.control_path(job),
                                        scratch=self.recovery.commit_scratch(job))
        return [RunSpec(run_id=job.run_id, rank=r, world_size=len(slots), body=job.body,
                        names=tuple(sorted(prepared.blobs)),
                        group=GroupSpec(key=key, rank=r, world_size=len(slots), store=store,
                                        backend=job.backend, timeout_s=opts.collective_timeout,
                                        hosts=tuple(s.host for s in slots),
                                        pids=tuple(s.pid for s in slots)),
                        metrics_address=receiver.address, metrics_token=receiver.token,
                        metrics_keys=receiver.keys,
                        # a notebook strategy travels as the name of its shipped class
                        train=dataclasses.replace(opts.train, sync=prepared.strategy)
                        if prepared.strategy else opts.train,
                        sync_from_notebook=prepared.strategy is not None, checkpoint=checkpoint,
                        kept=prepared.kept,
                        memory_interval_s=self.memory_interval_s)
                for r in range(len(slots))]


def _engine_set(slots: list) -> tuple[str, ...]:
    """The identity of a set of engines, by rank (slot ids: a restarted engine is a new slot)."""
    return tuple(s.slot_id for s in slots)


def _exact_steps(tracker: RunTracker, results: dict[int, RankResult]) -> dict[int, int]:
    steps = dict(tracker.steps)
    for rank, res in results.items():  # the engines' own counts are exact
        steps[rank] = max(steps.get(rank, 0), res.steps)
    return steps


def _checkpoint_manifest(lineage: Lineage | None, results: dict[int, RankResult]) -> dict | None:
    if lineage is None:
        return None
    commits = [r.last_commit for r in results.values() if r.last_commit is not None]
    return {"lineage": lineage.key, "every": lineage.every, "dir": lineage.directory,
            "last_commit": min(commits) if commits else None}


def _final(first: DistributedFitError, last: DistributedFitError, restarts: int) -> DistributedFitError:
    """After restarts ran out: the first failure (its traceback), and what the last one was."""
    if restarts == 0:
        return last
    failing = last.results.get(last.rank) if last.rank is not None else None
    text = (f"{first.args[0]}\nphalanx restarted the failing rank and resumed {restarts} time(s) "
            f"(--max-restarts {restarts}); the last attempt failed too, on rank {last.rank} "
            f"({failing.error if failing is not None else None}).")
    return DistributedFitError(text, last.status, first.rank, last.results)


def _what_came_back(status: str, results: dict[int, RankResult], names: Sequence[str]) -> str:
    """What a run that did not finish did to the notebook's ``--return`` names, in words."""
    listed = ", ".join(names)
    rank0 = results.get(0)
    if status == "interrupted" and rank0 is not None and rank0.returns is not None:
        return (f"\n--return {listed}: brought back from rank 0 as of its step {rank0.steps} "
                "(the training until the stop)")
    return f"\n--return {listed}: nothing came back; the notebook's {listed} are as before the run"
