"""``phalanx.steps(N)``: the loop's step indices, with commits at their boundaries and resume.

A loop written as ::

    for step in steps(1000):
        ...

runs steps ``0..999`` in a fresh run.  With ``--checkpoint-every K`` every rank commits its
training state (see :mod:`._checkpoint`) each time ``K`` iterations have completed: at the
boundary between two iterations, where everything the last iteration did (optimizer step,
scheduler step, logging, random draws) is finished.  With ``--resume`` (or after a restart under
``--max-restarts``) the first ``next()`` loads the commit the kernel chose into the cell's objects
and the generator continues from that step.  A commit is also where a pending resize (elastic
scaling) stops the loop on every rank at the same step.

The commit protocol uses the run's collectives, so every rank must run the same number of
iterations (it does: ``steps(N)`` gives every rank the same ``N``).
"""

from __future__ import annotations

import os
from typing import Any, Iterator

from . import _checkpoint as ck
from . import _sharded_commits as sharded_commits
from ._commits import Commit
from ..run._fit_mode import mode_for
from ...wire._seam import CheckpointSpec
from ..run._engine_state import RunContext, engine_state


class StopForResize(BaseException):
    """Raised at a commit on every rank when the kernel asked to change the world size.

    A BaseException so the user's ``except Exception`` does not swallow it.
    """

    def __init__(self, step: int) -> None:
        super().__init__(f"stopping at step {step} to change the world size")
        self.step = step


def steps(total: int) -> Iterator[int]:
    """The indices ``0..total-1`` of the training loop, starting where a resumed run left off.

    With ``--checkpoint-every K`` the training state is committed every ``K`` iterations; with
    ``--resume`` the loop skips the iterations the last commit covers.  Create the model and
    the optimizer (at the top level of the cell) before the loop: resuming loads their states.
    Outside ``%%distributed_fit`` it is simply ``range(total)``.

    Example (inside ``%%distributed_fit --checkpoint-every 50``)::

        for step in steps(1000):
            opt.zero_grad(); loss_fn(model(X[step % 10])).backward(); opt.step()
    """
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"steps() takes a whole number of steps, got {total!r}")
    run = engine_state().run
    keeper = run.checkpoints if run is not None else None
    if keeper is not None:
        keeper.used = True
    first = keeper.restore(run) if keeper is not None and run is not None else 0
    for index in range(first, total):
        yield index
        if keeper is not None and run is not None:
            keeper.after_iteration(run, index + 1)


class Checkpointer:
    """Commit and restore one run's training state (one per run, built from the spec)."""

    def __init__(self, spec: CheckpointSpec, rank: int, world_size: int) -> None:
        self.key = spec.key
        self.every = spec.every
        self.directory = spec.directory
        self.plan = spec.resume
        self.control = spec.control
        self.scratch = spec.scratch
        self.rank, self.world_size = rank, world_size
        self.restored = False
        self.used = False                  # whether the loop runs through steps() at all
        self.last_commit: int | None = None

    # --- commit ---------------------------------------------------------------------------------

    def after_iteration(self, run: RunContext, completed: int) -> None:
        if completed % self.every:
            return
        rng_all, stop = allgather_bytes(run.collectives, ck.capture_rng(), self.rank,
                                        self.world_size, flag=self._resize_requested())
        mode = mode_for(run.namespace, run.train.mode)
        objects = mode.checkpointed(run.namespace)
        if mode.commits_to_folder:
            sharded_commits.save(objects, self._folder(), self.key, self.rank,
                                 {"step": completed, "opt_steps": run.steps,
                                  "world_size": self.world_size, "rng": rng_all})
        else:
            commit = Commit(completed, run.steps, self.world_size, ck.save_state(objects), rng_all)
            engine_state().commits.add(self.key, commit)
            if self.directory:
                ck.write_commit(self.directory, self.key, self.rank, commit)
        self.last_commit = completed
        if stop:
            raise StopForResize(completed)

    def _folder(self) -> str:
        """Where this run's sharded commits go: a folder every rank writes its shards to."""
        folder = self.directory or self.scratch
        if folder is None:
            raise RuntimeError("a sharded model's commits are a folder every rank writes its "
                               "shards to, and these engines are on more than one host: pass "
                               "--checkpoint-dir DIR on a filesystem every host shares")
        return folder

    def _resize_requested(self) -> bool:
        return bool(self.control) and os.path.exists(self.control)  # type: ignore[arg-type]

    # --- restore --------------------------------------------------------------------------------

    def restore(self, run: RunContext) -> int:
        """Load the planned commit (once per run); returns the step the loop starts at."""
        if self.plan is None or self.restored:
            return 0
        self.restored = True
        step, sources = self.plan.step, self.plan.sources
        if sources[self.rank] == "sharded":  # every rank reads its new shards from the folder
            self._restore_sharded(run, step)
            return step
        from_peer = None
        if "peer" in sources:  # every rank takes part in the broadcast, whoever needs it
            src = self.plan.src  # the rank that sends: a plan with a peer source names it
            assert src is not None
            mine = self._held(step, sources[self.rank]) if self.rank == src else None
            blob = ck.to_bytes({"state": mine.state, "rng": mine.rng,
                                "opt_steps": mine.opt_steps}) if mine is not None else b""
            received = broadcast_bytes(run.collectives, blob, src, self.rank)
            if not received:  # every rank sees this, so none waits for the others
                raise RuntimeError(f"cannot resume from step {step}: rank {src} no longer holds "
                                   "that commit; restart the run without --resume")
            from_peer = ck.from_bytes(received)
        state, rng, opt_steps = self._source(sources[self.rank], step, from_peer)
        ck.load_state(mode_for(run.namespace, run.train.mode).checkpointed(run.namespace),
                      state, step)
        if rng is not None:
            ck.restore_rng(rng)
        run.steps = opt_steps
        if run.metrics is not None:
            run.metrics.set_step(opt_steps)
        engine_state().commits.prune_after(self.key, step)
        return step

    def _restore_sharded(self, run: RunContext, step: int) -> None:
        mode = mode_for(run.namespace, run.train.mode)
        meta = sharded_commits.load(mode.checkpointed(run.namespace), self._folder(), self.key,
                                    step)
        rng = _own(meta["rng"], self.rank)
        if rng is not None:
            ck.restore_rng(rng)
        run.steps = meta["opt_steps"]
        if run.metrics is not None:
            run.metrics.set_step(meta["opt_steps"])
        if self.rank == 0:  # the others write nothing before the next commit's collectives
            sharded_commits.prune_after(self._folder(), self.key, step)

    def _held(self, step: int, source: str) -> Commit | None:
        """This rank's copy of commit ``step`` to send to others (RNG of all ranks if in memory)."""
        if source == "memory":
            return engine_state().commits.get(self.key, step)
        if source == "disk" and self.directory:
            commit, rng = ck.read_commit(self.directory, self.key, self.rank, step)
            commit.rng = [b""] * self.rank + [rng]  # only its own RNG was written
            return commit
        return None

    def _source(self, source: str, step: int, from_peer: dict | None) -> tuple[bytes, Any, int]:
        if source == "memory":
            commit = engine_state().commits.get(self.key, step)
            if commit is None:
                raise RuntimeError(f"commit {step} of {self.key} vanished from this engine's memory")
            return commit.state, _own(commit.rng, self.rank), commit.opt_steps
        if source == "disk":
            assert self.directory is not None  # rank held it on disk: the lineage has a directory
            commit, rng = ck.read_commit(self.directory, self.key, self.rank, step)
            engine_state().commits.add(self.key, Commit(step, commit.opt_steps, commit.world_size,
                                                        commit.state, [b""] * self.rank + [rng]))
            return commit.state, rng, commit.opt_steps
        assert from_peer is not None
        engine_state().commits.add(self.key, Commit(step, from_peer["opt_steps"], self.world_size,
                                                    from_peer["state"], from_peer["rng"]))
        return from_peer["state"], _own(from_peer["rng"], self.rank), from_peer["opt_steps"]


def _own(rng_all: list[bytes], rank: int) -> bytes | None:
    """This rank's RNG states, when the commit has them (a rank added by scaling has none)."""
    return rng_all[rank] if rank < len(rng_all) and rng_all[rank] else None


# --- byte payloads over the run's collectives ----------------------------------------------------

def allgather_bytes(comm: Any, data: bytes, rank: int, world_size: int,
                    flag: bool = False) -> tuple[list[bytes], bool]:
    """Every rank's ``data``, by rank, and whether any rank raised ``flag`` (two collectives)."""
    import numpy as np

    header = np.zeros(world_size + 1, dtype=np.float64)
    header[rank], header[world_size] = len(data), float(flag)
    comm.allreduce([header], op="sum")
    lengths = [int(n) for n in header[:world_size]]
    table = np.zeros((world_size, max(lengths) or 1), dtype=np.int32)  # int32: summed exactly
    table[rank, :len(data)] = np.frombuffer(data, dtype=np.uint8)
    comm.allreduce([table], op="sum")
    rows = [table[r, :lengths[r]].astype(np.uint8).tobytes() for r in range(world_size)]
    return rows, header[world_size] > 0


def broadcast_bytes(comm: Any, data: bytes, src: int, rank: int) -> bytes:
    """Rank ``src``'s ``data`` on every rank (two collectives)."""
    import numpy as np

    length = np.array([len(data) if rank == src else 0], dtype=np.int64)
    comm.broadcast([length], src=src)
    buffer = np.zeros(int(length[0]), dtype=np.uint8)
    if rank == src:
        buffer[:] = np.frombuffer(data, dtype=np.uint8)
    comm.broadcast([buffer], src=src)
    return buffer.tobytes()


def held_commits(key: str, directory: str | None, scratch: str | None,
                 rank: int) -> dict[str, list[int]]:
    """Steps of ``key`` this engine holds in memory, this rank has on disk, and complete sharded
    commits it can read (in ``directory``, else ``scratch``) (runs on engines)."""
    return {"memory": engine_state().commits.steps(key),
            "disk": ck.disk_steps(directory, key, rank),
            "sharded": sharded_commits.complete_steps(directory or scratch, key)}


def make_checkpointer(spec: CheckpointSpec | None, rank: int,
                      world_size: int) -> Checkpointer | None:
    return Checkpointer(spec, rank, world_size) if spec is not None else None
