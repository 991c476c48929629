"""What one commit of a run's training state holds, and the commits an engine keeps in memory.

A leaf of the runtime: the engine state (:mod:`phalanx.runtime.run._engine_state`) owns a :class:`CommitStore` that lives
between cells, and :mod:`._checkpoint` builds, writes and reads the :class:`Commit` s in it.

Example::

    >>> c = Commit(step=10, opt_steps=10, world_size=2, state=b"", rng=[b"", b""])
    >>> store = CommitStore(); store.add("k", c); store.steps("k")
    [10]
"""

from __future__ import annotations

from dataclasses import dataclass

KEEP = 2  # commits kept per lineage: the last one may be incomplete on some rank when a run dies


@dataclass
class Commit:
    """One rank's view of one commit."""

    step: int               # loop iterations completed: the resumed loop starts at this index
    opt_steps: int          # optimizer steps counted by the hooks (metrics continue from here)
    world_size: int
    state: bytes            # torch.save({name: state_dict})
    rng: list[bytes]        # torch.save(RNG states) of every rank, by rank


class CommitStore:
    """The commits an engine holds in memory (one lineage at a time, the last :data:`KEEP`)."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._commits: list[Commit] = []

    def add(self, key: str, commit: Commit) -> None:
        if key != self._key:  # a new lineage replaces the old one: memory stays bounded
            self._key, self._commits = key, []
        self._commits = [c for c in self._commits if c.step < commit.step] + [commit]
        del self._commits[:-KEEP]

    def steps(self, key: str) -> list[int]:
        return [c.step for c in self._commits] if key == self._key else []

    def get(self, key: str, step: int) -> Commit | None:
        if key != self._key:
            return None
        return next((c for c in self._commits if c.step == step), None)

    def prune_after(self, key: str, step: int) -> None:
        """Forget commits past ``step``: they belong to a timeline that was abandoned."""
        if key == self._key:
            self._commits = [c for c in self._commits if c.step <= step]
