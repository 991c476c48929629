"""Dense ranks over a changing set of engines (pure bookkeeping).

A *slot* is one engine position phalanx manages (started as its own ipyparallel engine set when
the launcher allows it, so it can be restarted alone).  Ranks are the slots' positions: 0..N-1,
stable when scaling up (new slots go to the end), re-densed after scaling down or a loss.

Example::

    >>> table = RankTable()
    >>> [table.append(slot) for slot in ("a", "b", "c")]    # each new slot's rank
    [0, 1, 2]
    >>> table.remove("b")
    >>> table.rank_of("c")
    1
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class EngineSlot:
    """One engine position managed by phalanx."""

    slot_id: str
    engine_set_id: str
    device: str | None = None
    engine_id: int | None = None
    host: str = ""
    address: str = ""
    pid: int | None = None
    state: str = "starting"
    exit_code: int | None = None
    info: dict = field(default_factory=dict)
    restarts_alone: bool = True  # %cluster restart RANK replaces it alone (else: all engines)


class RankTable:
    """Ordered slot ids; a slot's rank is its index."""

    def __init__(self) -> None:
        self._slots: list[str] = []

    def __len__(self) -> int:
        return len(self._slots)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._slots))

    def append(self, slot: str) -> int:
        """Add a slot at the end; returns its rank."""
        if slot in self._slots:
            raise ValueError(f"slot {slot!r} is already ranked")
        self._slots.append(slot)
        return len(self._slots) - 1

    def remove(self, slot: str) -> None:
        """Drop a slot; higher ranks move down by one."""
        self._slots.remove(slot)

    def replace(self, old: str, new: str) -> int:
        """Put ``new`` where ``old`` was (a restarted engine keeps its rank)."""
        rank = self._slots.index(old)
        self._slots[rank] = new
        return rank

    def rank_of(self, slot: str) -> int:
        return self._slots.index(slot)

    def slot_at(self, rank: int) -> str:
        if not 0 <= rank < len(self._slots):
            raise IndexError(f"rank {rank} does not exist: ranks are 0..{len(self._slots) - 1}")
        return self._slots[rank]

    def highest(self, count: int) -> list[str]:
        """The ``count`` highest-ranked slots, highest first (what scaling down stops)."""
        return list(reversed(self._slots[len(self._slots) - count:])) if count else []


def pair_by_host(old: list[EngineSlot], new: list[EngineSlot]) -> list[EngineSlot]:
    """``new`` reordered so that each replaces the ``old`` slot started on the same launch host
    (``info["launch_host"]``) where one is; the rest in their order.

    Example::

        >>> a, b = EngineSlot("a", "s", info={"launch_host": "h1"}), EngineSlot("b", "s", info={"launch_host": "h2"})
        >>> [s.slot_id for s in pair_by_host([b, a], [a, b])]
        ['b', 'a']
    """
    left = list(new)
    paired: list[EngineSlot | None] = []
    for slot in old:
        host = slot.info.get("launch_host")
        match = next((s for s in left if host is not None and s.info.get("launch_host") == host), None)
        if match is not None:
            left.remove(match)
        paired.append(match)
    return [s if s is not None else left.pop(0) for s in paired]
