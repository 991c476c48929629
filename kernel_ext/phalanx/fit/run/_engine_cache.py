"""What the kernel knows the engines already hold, so that re-running a cell costs little.

An :class:`EngineSetCache` remembers, between runs, which process group each engine holds (and
with which members and collective deadline it was formed), which shipped objects each engine
holds (by content hash), and the package versions the engines reported for a cluster layout.
Groups and shipped objects are keyed by slot id, not engine id: a new cluster numbers its
engines from 0 again, and its engines hold neither the old group nor the old shipped objects.

An engine keeps the objects of its last run, and those of earlier runs too, most recently used
first, while they fit in :data:`KEEP_BYTES` (``PHALANX_ENGINE_CACHE_MB``): a notebook that
alternates a training cell and an evaluation cell sends neither's model or data again.  The
kernel decides what each engine keeps (the stash's keep list), so its record is the engine's.

Example::

    cache = EngineSetCache("phx-1a2b3c4d")
    key = cache.group_key(slots, timeout_s=300.0)   # warm key, or a new one (the group re-forms)
    objects = [prepared.objects_for(rank) for rank in range(len(slots))]
    stashes = cache.stashes(slots, objects)  # one per slot, or None
    cache.shipped(delivered_slots, delivered_objects)
    cache.group_formed(slots, key)                  # or group_torn_down(slots) after a failure
"""

from __future__ import annotations

import itertools
import os
from typing import Callable, Hashable, Mapping, Sequence

# Bytes of earlier runs' objects an engine keeps beside the current run's (which it always holds)
KEEP_BYTES = int(float(os.environ.get("PHALANX_ENGINE_CACHE_MB", "512")) * 2**20)


class EngineSetCache:
    """Per engine slot: the group it holds and the objects shipped to it; per layout: versions."""

    def __init__(self, key_prefix: str) -> None:
        self._key_prefix = key_prefix  # unique to this kernel's runner: keys never collide
        self._formations = itertools.count(1)
        self._groups: dict[str, str] = {}             # slot id -> key of the group it holds
        self._members: dict[str, tuple] = {}          # group key -> (slot ids by rank, deadline)
        self._shipped: dict[str, dict[str, str]] = {}  # slot id -> {shipped name: content hash}
        self._sizes: dict[str, dict[str, int]] = {}    # slot id -> {shipped name: bytes}
        self._last_used: dict[str, dict[str, int]] = {}  # slot id -> {name: run counter}
        self._uses = itertools.count(1)
        self._versions: dict[Hashable, list[dict]] = {}  # cluster layout -> engines' versions

    # --- process groups ---------------------------------------------------------------------

    def group_key(self, slots: list, timeout_s: float) -> str:
        """The warm group's key when exactly these engines hold it with this collective
        deadline (torch builds the deadline into the group), else a new one (re-form)."""
        members = tuple(s.slot_id for s in slots)
        held = {self._groups.get(slot_id) for slot_id in members}
        if len(held) == 1:
            warm = held.pop()
            if warm is not None and self._members.get(warm) == (members, timeout_s):
                return warm
        key = f"{self._key_prefix}-{next(self._formations)}-w{len(members)}"
        self._members[key] = (members, timeout_s)
        return key

    def group_formed(self, slots: list, key: str) -> None:
        """These engines hold a working group ``key``: the next run on them can reuse it."""
        for slot in slots:
            self._groups[slot.slot_id] = key

    def group_torn_down(self, slots: list) -> None:
        """These engines hold no working group (failed ranks tear theirs down; a resize changes
        it): the next run on them forms a new one."""
        for slot in slots:
            self._groups.pop(slot.slot_id, None)

    # --- shipped objects --------------------------------------------------------------------

    def stashes(self, slots: list, objects: Sequence[tuple[Mapping[str, str], Mapping[str, bytes]]]
                ) -> list[tuple[dict[str, tuple[str, bytes]], list[str]] | None]:
        """Per slot, what its engine must store before this run, sent with the run itself:
        (the objects it lacks or holds another version of, every name to keep), or ``None``
        when it holds exactly these objects.  ``objects``: per slot, the (hashes, blobs) its
        engine must hold (the shipped names and its part of the shards)."""
        stashes: list[tuple[dict[str, tuple[str, bytes]], list[str]] | None] = []
        for slot, (hashes, blobs) in zip(slots, objects):
            held = self._shipped.get(slot.slot_id, {})
            missing = {n: (h, blobs[n]) for n, h in hashes.items() if held.get(n) != h}
            keep = self._keep(slot.slot_id, hashes)
            stashes.append((missing, sorted(keep)) if missing or set(held) - keep else None)
        return stashes

    def shipped(self, slots: list, objects: Sequence[tuple[Mapping[str, str], Mapping[str, bytes]]]
                ) -> None:
        """These engines now hold the objects ``objects`` (per slot: hashes, blobs) names, and
        what they kept of earlier runs (see :meth:`stashes`)."""
        use = next(self._uses)
        for slot, (hashes, blobs) in zip(slots, objects):
            keep = self._keep(slot.slot_id, hashes)
            held, sizes = self._shipped.get(slot.slot_id, {}), self._sizes.get(slot.slot_id, {})
            used = self._last_used.setdefault(slot.slot_id, {})
            self._shipped[slot.slot_id] = {n: (hashes[n] if n in hashes else held[n]) for n in keep}
            self._sizes[slot.slot_id] = {n: (len(blobs[n]) if n in hashes else sizes[n])
                                         for n in keep}
            used.update({n: use for n in hashes})
            for gone in set(used) - keep:
                del used[gone]

    def _keep(self, slot_id: str, hashes: Mapping[str, str]) -> set[str]:
        """What the engine keeps after this run: the run's objects, then earlier ones, the most
        recently used first, while they fit in KEEP_BYTES (a name the run sends anew replaces
        its old version)."""
        keep, room = set(hashes), KEEP_BYTES
        sizes, used = self._sizes.get(slot_id, {}), self._last_used.get(slot_id, {})
        for name in sorted(set(self._shipped.get(slot_id, {})) - keep,
                           key=lambda n: used.get(n, 0), reverse=True):
            if sizes.get(name, 0) <= room:
                keep.add(name)
                room -= sizes.get(name, 0)
        return keep

    # --- package versions -------------------------------------------------------------------

    def versions(self, layout: Hashable, ask: Callable[[], list[dict]]) -> list[dict]:
        """The engines' package versions for this cluster layout, asked for (``ask``) only the
        first time; a report ``ask`` refuses by raising is not remembered."""
        if layout not in self._versions:
            self._versions[layout] = ask()
        return self._versions[layout]

    def forget_versions(self) -> None:
        """Ask the engines for their versions again at the next run."""
        self._versions.clear()
