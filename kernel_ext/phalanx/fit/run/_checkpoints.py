"""Kernel side of checkpoints: lineages, and where a resumed run starts (pure planning + IO).

A *lineage* is the chain of commits one training run leaves: a run with ``--checkpoint-every K``
starts one; ``--resume``, a restart under ``--max-restarts`` and an elastic resize continue it.
To resume, the kernel asks every rank which commits it holds (in memory, on disk) and picks the
newest step every rank can load: from its own memory, from its own file, or from a surviving
rank's memory by broadcast (a rank whose engine was replaced has neither).

Example::

    >>> plan_resume([{"memory": [10, 15], "disk": []}, {"memory": [], "disk": [10]}])
    ResumePlan(step=15, sources=('memory', 'peer'), src=0)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Mapping

from ...wire._seam import RankResult, ResumePlan
from ._fit_options import FitUsageError

LINEAGE_FILE = "lineage.json"


class CheckpointWarning(UserWarning):
    """Checkpointing was asked for but could not happen as asked."""


def warn_if_unused(lineage: "Lineage | None", results: Mapping[int, RankResult]) -> None:
    """--checkpoint-every on a loop that does not go through phalanx.steps() commits nothing."""
    from ..analysis._cell_warning import warn_at_cell

    if lineage is not None and results and not any(r.steps_loop for r in results.values()):
        warn_at_cell("--checkpoint-every committed nothing: write the loop as "
                      "`for step in steps(N):` (from phalanx.runtime import steps) so phalanx "
                      "knows where iterations end", CheckpointWarning)


@dataclass(frozen=True)
class Lineage:
    """One chain of commits."""

    key: str
    every: int
    directory: str | None
    world_size: int

    def save(self) -> None:
        """Record the lineage in its directory so a fresh kernel can ``--resume`` it."""
        if not self.directory:
            return
        folder = os.path.expanduser(self.directory)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, LINEAGE_FILE), "w") as f:
            json.dump(asdict(self), f)

    @classmethod
    def load(cls, directory: str) -> "Lineage":
        path = os.path.join(os.path.expanduser(directory), LINEAGE_FILE)
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise FitUsageError(f"--resume: {directory} holds no phalanx checkpoints "
                                f"({LINEAGE_FILE} is missing)") from None
        return cls(data["key"], int(data["every"]), directory, int(data["world_size"]))


def choose_lineage(opts, last: Lineage | None, new_key: str, world_size: int) -> Lineage | None:
    """The lineage a run commits to: none, a new one, or the one it resumes."""
    if opts.resume:
        lineage = last
        if opts.checkpoint_dir and (last is None or last.directory != opts.checkpoint_dir):
            lineage = Lineage.load(opts.checkpoint_dir)
        if lineage is None:
            raise FitUsageError("--resume: no run with --checkpoint-every K in this kernel to "
                                "resume; pass --checkpoint-dir DIR to resume from a directory")
        every = opts.checkpoint_every or lineage.every
        return Lineage(lineage.key, every, lineage.directory, world_size)
    if opts.checkpoint_every:
        lineage = Lineage(new_key, opts.checkpoint_every, opts.checkpoint_dir, world_size)
        lineage.save()
        return lineage
    return None


def plan_resume(held: list[dict]) -> ResumePlan | None:
    """The newest step every rank can load, and from where; ``None`` when there is none.

    ``held[r]`` is ``{"memory": [steps], "disk": [steps], "sharded": [steps]}`` as rank ``r``
    reported it.  A sharded commit is one folder every rank reads: usable when every rank sees
    it complete.

    >>> plan_resume([{"memory": [], "disk": [], "sharded": [4, 6]}] * 3)
    ResumePlan(step=6, sources=('sharded', 'sharded', 'sharded'), src=None)
    """
    anywhere = {s for h in held for s in h["memory"] + h["disk"] + h.get("sharded", [])}
    for step in sorted(anywhere, reverse=True):
        if all(step in h.get("sharded", ()) for h in held):
            return ResumePlan(step, ("sharded",) * len(held))
        if not any(step in h["memory"] + h["disk"] for h in held):
            continue  # a sharded commit some rank cannot read
        sources = [_source(step, h) for h in held]
        if "peer" in sources:  # a rank holding it sends it: from memory if any has it
            src = next((r for r, h in enumerate(held) if step in h["memory"]), None)
            if src is None:
                src = next(r for r, h in enumerate(held) if step in h["disk"])
            return ResumePlan(step, tuple(sources), src)
        return ResumePlan(step, tuple(sources))
    return None


def _source(step: int, held: dict) -> str:
    if step in held["memory"]:
        return "memory"
    if step in held["disk"]:
        return "disk"
    return "peer"
