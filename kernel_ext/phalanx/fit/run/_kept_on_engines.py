"""The kernel's account of what ``--keep`` left live on the engines.

Kept objects live in the engine processes of one set of engines (by slot: a restarted engine is
a new slot, and holds nothing).  :class:`KeptNames` remembers which names that set keeps and how
many bytes each takes on each rank.  A run on that same set gets the names (the cell reads the
live objects, shadowing the notebook's); a run on any other set (after a restart, a scale, ``-n``
fewer ranks) finds them released: the runner asks the engines to forget them, so no copy is left
holding memory where no cell can reach it.

Example::

    >>> kept = KeptNames()
    >>> kept.record(("s0", "s1"), ("model",), [{"model": 4096}, {"model": 4096}])
    >>> kept.names_for(("s0", "s1")), kept.names_for(("s0",))
    (('model',), ())
    >>> kept.describe()
    'model (up to 4.0 KB per rank, 2 ranks)'
"""

from __future__ import annotations

from typing import Iterable, Sequence


class KeptNames:
    """Which names one engine set keeps live, and each one's bytes per rank."""

    def __init__(self) -> None:
        self.engines: tuple[str, ...] = ()      # the slot ids, by rank, that keep them
        self.sizes: dict[str, list[int]] = {}   # name -> bytes on each rank

    def names_for(self, engines: Sequence[str]) -> tuple[str, ...]:
        """The kept names a run on ``engines`` (slot ids by rank) may read: all, or none when
        they were kept by another set of engines."""
        return tuple(sorted(self.sizes)) if tuple(engines) == self.engines else ()

    def stale_for(self, engines: Sequence[str]) -> tuple[str, ...]:
        """Names kept by another engine set than ``engines``: released before the run."""
        return () if tuple(engines) == self.engines else tuple(sorted(self.sizes))

    def record(self, engines: Sequence[str], names: Iterable[str],
               sizes: Sequence[dict | None]) -> None:
        """A run on ``engines`` ended well keeping ``names``; ``sizes``: each rank's report."""
        names = tuple(names)
        if not names:
            return
        if tuple(engines) != self.engines:
            self.engines, self.sizes = tuple(engines), {}
        for name in names:
            self.sizes[name] = [int((s or {}).get(name, 0)) for s in sizes]

    def forget(self, names: Iterable[str] | None = None) -> tuple[str, ...]:
        """Drop ``names`` (all with None) from the account; returns those that were kept."""
        gone = tuple(sorted(self.sizes)) if names is None else \
            tuple(n for n in names if n in self.sizes)
        for name in gone:
            del self.sizes[name]
        if not self.sizes:
            self.engines = ()
        return gone

    def describe(self) -> str:
        """One line: each kept name with its memory per rank."""
        return ", ".join(f"{name} (up to {human_size(max(sizes, default=0))} per rank, {len(sizes)} ranks)"
                         for name, sizes in sorted(self.sizes.items()))


def human_size(nbytes: int) -> str:
    """``nbytes`` in the largest unit it reaches (``4.0 KB``)."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
