"""Run a ``%%distributed_fit`` cell on the engines and bring the result back.

One :class:`FitRunner` per session.  It keeps what makes re-running a cell cheap: the metric
receiver, the rendezvous store, and which shipped objects each engine already holds.  Its wait
loop is where faults become one clear error: the first rank that fails, dies or passes the
timeout is reported by rank, host and step, and every other rank is interrupted at once (through
ipyparallel's control channel, which a busy engine still answers) so none stays in a collective.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import tempfile
import time
import uuid
from typing import Any, Callable, Mapping

from .. import events
from ..runtime._entry import run_cell, stash_objects
from ._dispatch import Prepared, choose_backend, prepare, reachable_ip
from ._errors import DistributedFitError, describe_failure
from ._manifest import build_manifest, check_versions, engine_versions
from ._options import FitOptions, FitUsageError
from ._output import OutputStreamer
from ._receiver import MetricsReceiver
from ._record import RunRecord
from ._tracker import RunTracker

RELEASE_GRACE_S = 10.0   # after interrupting, how long ranks get to come back before we say so
SECONDARY_GRACE_S = 3.0  # how long a rank's own error may take to arrive after a peer's abort
POLL_S = 0.005


class FitRunner:
    """Runs cells on a :class:`~phalanx.cluster.ClusterManager`; emits events on ``emit``."""

    def __init__(self, cluster: Any, emit: Callable[[dict], None]) -> None:
        self.cluster = cluster
        self._emit = emit
        self._id = uuid.uuid4().hex[:8]
        self._counter = itertools.count(1)
        self._formations = itertools.count(1)
        self._groups: dict[int, str] = {}             # engine id -> key of the group it holds
        self._members: dict[str, tuple[int, ...]] = {}  # group key -> engine ids in rank order
        self._sent: dict[int, dict[str, str]] = {}
        self._versions: dict[tuple, list[dict]] = {}
        self._receiver: MetricsReceiver | None = None
        self._store_dir = tempfile.mkdtemp(prefix="phalanx-rdzv-")  # 0700: owner only
        self._tcp_store: Any = None
        self.active: RunTracker | None = None
        self.active_name: str | None = None
        self.last: RunRecord | None = None

    # --- public -----------------------------------------------------------------------------

    def run(self, body: str, opts: FitOptions, user_ns: dict, on_start: Callable | None = None) -> RunRecord:
        """Run ``body`` on the engines; returns the record or raises DistributedFitError."""
        if self.active is not None:
            raise FitUsageError(f"run {self.active_name!r} is still running in this kernel; "
                                "wait for it or interrupt it first")
        slots = self._slots_for(opts)
        prepared = prepare(body, opts, user_ns, len(slots))
        backend = choose_backend(opts, slots, self.cluster.launcher)
        versions = self._engine_versions(slots)
        run_id = f"{self._id}-{next(self._counter)}"
        name = opts.name or f"run-{run_id.split('-')[1]}"
        specs = self._specs(run_id, body, opts, slots, prepared, backend)
        tracker = RunTracker(run_id, len(slots), opts.steps, self._emit)
        self._receiver_for(slots).register(run_id, tracker.on_batch)
        self.active, self.active_name = tracker, name
        try:
            self._emit(events.run_started(run_id, len(slots), opts.steps, opts.sync))
            if on_start is not None:
                on_start(tracker, name)
            tracker.start()
            self._stash(slots, prepared)
            return self._execute(run_id, name, opts, slots, specs, prepared, tracker, user_ns,
                                 backend, versions)
        finally:
            tracker.stop()
            self._receiver_for(slots).unregister(run_id)
            self.active = self.active_name = None

    def close(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
        self._tcp_store = None
        shutil.rmtree(self._store_dir, ignore_errors=True)

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
        dead = [r for r, s in enumerate(slots) if s.state == "dead"]
        if dead:
            raise FitUsageError(f"rank(s) {', '.join(map(str, dead))} are dead: bring them back "
                                f"with %cluster restart {dead[0]} (or %cluster restart for all)")
        return slots

    def _engine_versions(self, slots: list) -> list[dict]:
        key = (self.cluster.topology(), len(slots))
        if key not in self._versions:
            view = self.cluster.client[[s.engine_id for s in slots]]
            self._versions[key] = view.apply_sync(engine_versions)
            check_versions(self._versions[key], slots)
        return self._versions[key]

    def _group_key(self, slots: list) -> str:
        """The warm group's key when exactly these engines hold it, else a new one (re-form)."""
        members = tuple(s.engine_id for s in slots)
        held = {self._groups.get(eid) for eid in members}
        if len(held) == 1 and None not in held:
            key = held.pop()
            if self._members.get(key) == members:
                return key
        key = f"phx-{self._id}-{next(self._formations)}-w{len(members)}"
        self._members[key] = members
        return key

    def _group_settled(self, slots: list, key: str, ok: bool) -> None:
        """Remember which engines hold a working group (failed ranks tear theirs down)."""
        for slot in slots:
            if ok:
                self._groups[slot.engine_id] = key
            else:
                self._groups.pop(slot.engine_id, None)

    def _store_for(self, slots: list, key: str) -> tuple:
        hosts = {s.host for s in slots}
        if len(hosts) == 1 and all(s.address.startswith("127.") or s.host == os.uname().nodename
                                   for s in slots):
            return ("file", os.path.join(self._store_dir, key))
        import datetime

        import torch.distributed as dist

        if self._tcp_store is None:
            self._tcp_store = dist.TCPStore("0.0.0.0", 0, None, True, wait_for_workers=False,
                                            timeout=datetime.timedelta(seconds=300))
        return ("tcp", reachable_ip(slots[0].address), self._tcp_store.port)

    def _receiver_for(self, slots: list) -> MetricsReceiver:
        local = all(s.address.startswith("127.") or s.host == os.uname().nodename for s in slots)
        if self._receiver is None or (not local and self._receiver.address.startswith("tcp://127.")):
            if self._receiver is not None:
                self._receiver.close()
            self._receiver = (MetricsReceiver("127.0.0.1") if local else
                              MetricsReceiver("0.0.0.0", reachable_ip(slots[0].address)))
        return self._receiver

    def _specs(self, run_id: str, body: str, opts: FitOptions, slots: list, prepared: Prepared,
               backend: str) -> list[dict]:
        key = self._group_key(slots)
        store = self._store_for(slots, key)
        receiver = self._receiver_for(slots)
        group = {"key": key, "world_size": len(slots), "store": store, "backend": backend,
                 "timeout_s": opts.collective_timeout, "hosts": tuple(s.host for s in slots),
                 "pids": tuple(s.pid for s in slots)}
        return [{"run_id": run_id, "rank": r, "world_size": len(slots), "body": body,
                 "names": sorted(prepared.blobs), "group": {**group, "rank": r},
                 "metrics_address": receiver.address, "sync": opts.sync, "every": opts.every,
                 "alpha": opts.alpha, "seed": opts.seed, "returns": list(opts.returns),
                 "return_all": False}
                for r in range(len(slots))]

    def _stash(self, slots: list, prepared: Prepared) -> None:
        """Send each engine the shipped objects it does not hold yet (by content hash)."""
        need: dict[str, tuple[str, bytes]] = {}
        targets = []
        for slot in slots:
            held = self._sent.get(slot.engine_id, {})
            missing = {n: (h, prepared.blobs[n]) for n, h in prepared.hashes.items() if held.get(n) != h}
            if missing or set(held) - set(prepared.hashes):
                need.update(missing)
                targets.append(slot.engine_id)
        if targets:
            self.cluster.client[targets].apply_async(stash_objects, need, sorted(prepared.hashes))
            for eid in targets:
                self._sent[eid] = dict(prepared.hashes)

    # --- execution --------------------------------------------------------------------------

    def _execute(self, run_id: str, name: str, opts: FitOptions, slots: list, specs: list[dict],
                 prepared: Prepared, tracker: RunTracker, user_ns: dict, backend: str,
                 versions: list[dict]) -> RunRecord:
        started = time.monotonic()
        client = self.cluster.client
        results: dict[int, dict] = {}
        try:
            ars = [client[s.engine_id].apply_async(run_cell, spec, blob)
                   for s, spec, blob in zip(slots, specs, prepared.shard_blobs)]
            status = _Waiter(self, slots, ars, tracker, opts).wait(results)
        except BaseException:
            self._group_settled(slots, specs[0]["group"]["key"], ok=False)
            raise
        wall = time.monotonic() - started
        tracker.wait_final([r for r, res in results.items() if res.get("error") != "EngineDied"], 2.0)
        record = RunRecord(run_id, name, status, len(slots), wall, dict(tracker.steps),
                           tracker.history)
        for rank, res in results.items():  # the engines' own counts are exact
            record.steps[rank] = max(record.steps.get(rank, 0), int(res.get("steps", 0)))
        record.manifest = build_manifest(opts, slots, backend, prepared, versions, record)
        self.last = record
        # Failed ranks tore their group down: everyone re-forms next time.
        self._group_settled(slots, specs[0]["group"]["key"], ok=status == "done")
        self._emit(events.run_ended(run_id, status, wall, None if status == "done" else status))
        if status == "done":
            blob = results[0].get("returns")
            if blob is not None:
                import cloudpickle

                user_ns.update(cloudpickle.loads(blob))
            return record
        raise _failure(status, results, slots, opts, wall, record)


class _Waiter:
    """Poll the ranks' results; on the first fault interrupt everyone else."""

    def __init__(self, runner: FitRunner, slots: list, ars: list, tracker: RunTracker,
                 opts: FitOptions) -> None:
        self.runner, self.slots, self.ars, self.tracker, self.opts = runner, slots, ars, tracker, opts
        self.output = OutputStreamer(ars)
        self.released_at: float | None = None

    def wait(self, results: dict[int, dict]) -> str:
        status = "done"
        start = failed_at = time.monotonic()
        pending = set(range(len(self.ars)))
        interrupted = False
        while pending:
            try:
                self._collect(pending, results)
                failed = [r for r in results.values() if not r.get("ok")]
                if status == "done" and failed:
                    status, failed_at = "failed", time.monotonic()
                # A rank released by a peer's failure reports a collective error; the peer that
                # failed first is usually finishing on its own, so give it a moment to report
                # its real error before interrupting it.
                if status == "failed" and self.released_at is None and (
                        any(r.get("error") not in _SECONDARY for r in failed)
                        or time.monotonic() - failed_at > SECONDARY_GRACE_S):
                    self._release(pending)
                if self.opts.timeout and status == "done" and time.monotonic() - start > self.opts.timeout:
                    status = "timeout"
                    self._release(pending)
                if self.released_at and time.monotonic() - self.released_at > RELEASE_GRACE_S:
                    self._abandon(pending, results)
                self.output.flush()
                time.sleep(POLL_S)
            except KeyboardInterrupt:
                if interrupted:
                    raise
                interrupted, status = True, "interrupted"
                self._release(pending)
        self.output.flush()
        return status

    def _collect(self, pending: set[int], results: dict[int, dict]) -> None:
        for rank in sorted(pending):
            ar, slot = self.ars[rank], self.slots[rank]
            if ar.ready():
                pending.discard(rank)
                try:
                    results[rank] = ar.get()
                except Exception as exc:
                    results[rank] = self._lost(rank, slot, exc)
            elif slot.state == "dead":
                pending.discard(rank)
                results[rank] = _died(slot, self.tracker, rank)

    def _lost(self, rank: int, slot: Any, exc: Exception) -> dict:
        """A task that ended without our result: its engine died, or ipyparallel failed it."""
        engine_gone = slot.state == "dead" or slot.engine_id not in self.runner.cluster.client.ids
        if engine_gone:
            return _died(slot, self.tracker, rank, str(exc))
        return {"ok": False, "error": type(exc).__name__, "message": str(exc),
                "traceback": f"{type(exc).__name__}: {exc}", "steps": self.tracker.steps.get(rank, 0)}

    def _release(self, pending: set[int]) -> None:
        if self.released_at is not None or not pending:
            self.released_at = self.released_at or time.monotonic()
            return
        self.released_at = time.monotonic()
        targets = [self.slots[r].engine_id for r in pending if self.slots[r].state != "dead"]
        if targets:
            self.runner.cluster.client.send_signal(signal.SIGINT, targets=targets, block=False)

    def _abandon(self, pending: set[int], results: dict[int, dict]) -> None:
        for rank in list(pending):
            slot = self.slots[rank]
            results[rank] = {"ok": False, "error": "Unresponsive", "steps": self.tracker.steps.get(rank, 0),
                             "message": f"did not stop within {RELEASE_GRACE_S:g} s of an interrupt"}
            pending.discard(rank)
            try:
                self.runner.cluster.restart(rank)
            except Exception:
                pass


def _died(slot: Any, tracker: RunTracker, rank: int, detail: str = "") -> dict:
    return {"ok": False, "error": "EngineDied", "exit_code": slot.exit_code,
            "steps": tracker.steps.get(rank, 0), "message": detail}


# Errors a rank raises because *another* rank failed: reported only when nothing else explains it.
_SECONDARY = ("CollectiveAborted", "PeerDied", "CollectiveTimeout", "CollectiveError", "Unresponsive")


def _root_cause(results: Mapping[int, dict]) -> int | None:
    """The rank whose fault ended the run: a dead engine, else a rank's own error."""
    failed = [r for r, res in sorted(results.items()) if not res.get("ok") and not res.get("interrupted")]
    for wanted in (lambda e: e == "EngineDied", lambda e: e not in _SECONDARY, lambda e: True):
        for rank in failed:
            if wanted(results[rank].get("error")):
                return rank
    return None


def _failure(status: str, results: Mapping[int, dict], slots: list, opts: FitOptions,
             wall: float, record: RunRecord) -> DistributedFitError:
    steps = ", ".join(f"rank {r}: {record.steps.get(r, 0)}" for r in range(len(slots)))
    if status == "timeout":
        return DistributedFitError(f"the run passed --timeout {opts.timeout:g} s and was stopped "
                                   f"after {wall:.1f} s; last steps: {steps}", status)
    if status == "interrupted":
        return DistributedFitError(f"interrupted after {wall:.1f} s; every rank stopped "
                                   f"(last steps: {steps}); the engines are ready for the next run",
                                   status)
    rank = _root_cause(results)
    if rank is None:
        return DistributedFitError(f"the run failed after {wall:.1f} s (steps: {steps})", status)
    others = [r for r in range(len(slots)) if r != rank]
    text = describe_failure(rank, results[rank], slots[rank])
    if others:
        text += (f"\nThe other rank(s) {', '.join(map(str, others))} were released; the run "
                 f"ended {wall:.1f} s after it started.")
    return DistributedFitError(text, status, rank)
