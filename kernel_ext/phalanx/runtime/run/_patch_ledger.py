"""The one owner of what a run changes in other libraries, and of taking it all back.

A run on an engine patches torch (``Optimizer.__init__``, ``autograd.backward``, module hooks),
scikit-learn's estimators, LightGBM's and XGBoost's ``train``, framework classes' logging
methods, ...  The engine process lives on after the run, so every one of those changes must be
undone however the run ended, and one undo that fails must not leave the others in place: an
``Optimizer.__init__`` still patched would attach every optimizer the engine builds later to a
run that is over.

So each change is written in the run's :class:`PatchLedger` as it is made: an attribute set
through :meth:`PatchLedger.set` (the ledger keeps the original and puts it back itself), or an
undo of an adapter's own (:meth:`PatchLedger.on_undo`: hook handles, a world's take-back).
:meth:`PatchLedger.undo_all` runs them in reverse order, each on its own; then it checks every
attribute it set against its original and puts back any that is not (an adapter's undo may
have failed half way), and returns what went wrong, one line each, for the run to say.

Example::

    ledger = PatchLedger()
    ledger.set(torch.optim.Optimizer, "__init__", init_and_sync, "optimizer attach")
    ledger.on_undo(handle.remove, "forward hook")
    ...
    for line in ledger.undo_all():
        print(line, file=sys.stderr)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

_ABSENT = object()  # the attribute was not in the owner's own __dict__ before the patch


@dataclass
class _Patched:
    """An attribute the ledger set, and what was there before."""

    owner: object
    name: str
    replacement: object
    original: object
    what: str

    def undo(self) -> None:
        if self.original is _ABSENT:
            if self.name in vars(self.owner):
                delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.original)

    def restored(self) -> bool:
        now = vars(self.owner).get(self.name, _ABSENT)
        return now is self.original


@dataclass
class _Undo:
    """An adapter's own undo."""

    undo: Callable[[], object]
    what: str


class PatchLedger:
    """What one run changed outside phalanx, in the order it was changed."""

    def __init__(self) -> None:
        self._entries: list[_Patched | _Undo] = []

    def set(self, owner: object, name: str, replacement: object, what: str) -> Any:
        """``setattr(owner, name, replacement)`` for the run; returns what was there (the
        attribute as looked up, so a class's inherited method too)."""
        before = getattr(owner, name, None)
        original = vars(owner).get(name, _ABSENT)
        setattr(owner, name, replacement)
        self._entries.append(_Patched(owner, name, replacement, original, what))
        return before

    def on_undo(self, undo: Callable[[], object] | None, what: str) -> None:
        """Run ``undo`` when the run ends (nothing when ``undo`` is None)."""
        if undo is not None:
            self._entries.append(_Undo(undo, what))

    def __len__(self) -> int:
        return len(self._entries)

    def describe(self) -> list[str]:
        """What the ledger holds, in the order it was written (for ``%cluster`` and tests)."""
        return [entry.what for entry in self._entries]

    def undo_all(self) -> list[str]:
        """Take every change back, last first, each on its own; returns one line for each undo
        that failed and each attribute that was not its original again (and was put back)."""
        entries, self._entries = self._entries, []
        failures = []
        for entry in reversed(entries):
            try:
                entry.undo()
            except Exception as exc:  # noqa: BLE001 - the others must still be undone
                failures.append(f"undoing {entry.what} failed: {type(exc).__name__}: {exc}")
        for entry in entries:
            if isinstance(entry, _Patched) and not entry.restored():
                failures.append(f"{_where(entry)} was not {entry.what}'s original after the run; "
                                "put back")
                try:
                    _Patched.undo(entry)  # the ledger's own put-back, whatever replaced it
                except Exception as exc:  # noqa: BLE001
                    failures.append(f"putting back {_where(entry)} failed: {exc}")
        return failures


def _where(entry: _Patched) -> str:
    owner = entry.owner
    name = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", type(owner).__name__)
    module = getattr(owner, "__module__", None)  # a class's module (a module has none)
    return f"{module}.{name}.{entry.name}" if module and module != name else f"{name}.{entry.name}"
