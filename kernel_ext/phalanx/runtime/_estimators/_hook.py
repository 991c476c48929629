"""Estimators created inside the cell: the hook that patches scikit-learn's classes with
``partial_fit``, loaded now or later, and the one-shot import watch behind it."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ._patch import _LOCK, _MISSING, _patch_class

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec


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
        self.watch: _ImportWatch | None = None

    def start(self) -> None:
        if "sklearn.base" in sys.modules:
            self.on_sklearn()
        elif importlib.util.find_spec("sklearn") is not None:
            self.watch = _ImportWatch("sklearn.base", self.on_sklearn)
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


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Calls ``callback`` once module ``name`` has executed; consulted only for modules not
    imported yet, and leaves ``sys.meta_path`` at its first use."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        self.remove()
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenLoader(spec.loader, self.callback)
                return spec
        return None


class _ThenLoader(importlib.abc.Loader):
    """A loader that runs ``callback`` after the module executed (and then looks like the real
    loader: ``__loader__`` and ``__spec__.loader`` are put back first)."""

    def __init__(self, loader: Any, callback: Callable[[], None]) -> None:
        self.loader, self.callback = loader, callback

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.callback()


_HOOK = _CreationHook()
