"""Estimators created inside the cell: the hook that patches scikit-learn's classes with
``partial_fit``, loaded now or later, and the one-shot import watch behind it."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from .._import_watch import ImportWatch
from ._patch import _LOCK, _MISSING, _patch_class


class _CreationHook:
    """Patches every scikit-learn class with ``partial_fit``: those loaded now, and those
    defined later (``BaseEstimator.__init_subclass__``), while some run wants it.

    Not ``BaseEstimator.__new__``: CPython 3.11 cannot take a ``__new__`` back (after ``del``,
    every subclass keeps calling ``object.__new__`` with the constructor's arguments, which
    raises), and instance attributes would not survive pickling or ``copy.deepcopy``.
    When scikit-learn is installed but not imported yet (importing it costs seconds), a
    one-shot import watcher does it once ``sklearn.base`` has loaded.
    """

    def __init__(self) -> None:
        self.users = 0
        self.base: Any = None
        self.own: Any = _MISSING
        self.installed: Any = None
        self.watch: ImportWatch | None = None

    def start(self) -> None:
        if "sklearn.base" in sys.modules:
            self.on_sklearn()
        elif _sklearn_installed():
            self.watch = ImportWatch("sklearn.base", self.on_sklearn)
            sys.meta_path.insert(0, self.watch)

    def on_sklearn(self) -> None:
        with _LOCK:
            if not self.users or self.base is not None:
                return
            base = self.base = sys.modules["sklearn.base"].BaseEstimator
            own = self.own = vars(base).get("__init_subclass__", _MISSING)

            def init_subclass(cls: Any, **kwargs: Any) -> None:
                if own is not _MISSING:
                    own.__get__(None, cls)(**kwargs)
                else:
                    super(base, cls).__init_subclass__(**kwargs)
                if hasattr(cls, "partial_fit"):
                    _patch_class(cls)

            base.__init_subclass__ = self.installed = classmethod(init_subclass)
            for cls in _subclasses(base):
                if hasattr(cls, "partial_fit"):
                    _patch_class(cls)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.remove()
            self.watch = None
        if self.base is not None:
            if vars(self.base).get("__init_subclass__") is self.installed:  # not someone else's
                if self.own is _MISSING:
                    del self.base.__init_subclass__
                else:
                    self.base.__init_subclass__ = self.own
            self.base, self.own, self.installed = None, _MISSING, None


def _subclasses(base: type) -> list[type]:
    out: dict[type, None] = {}  # ordered, and diamonds counted once
    todo: list[type] = [base]
    while todo:
        found: list[type] = todo.pop().__subclasses__()
        for cls in found:
            if cls not in out:
                out[cls] = None
                todo.append(cls)
    return list(out)


_HOOK = _CreationHook()


_found_sklearn: list[bool] = []


def _sklearn_installed() -> bool:
    """Whether scikit-learn can be imported here.  Found once: looking costs a scan of the
    import path, about 1 ms of every run's start (measured); a miss is looked up again, as
    the person may install it later in the session."""
    if not _found_sklearn and importlib.util.find_spec("sklearn") is not None:
        _found_sklearn.append(True)
    return bool(_found_sklearn)

