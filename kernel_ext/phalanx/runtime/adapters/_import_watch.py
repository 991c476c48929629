"""A one-shot import watch: run a callback once a given module has loaded.

Used where phalanx adapts a library the cell may import itself (scikit-learn's estimators, the
training frameworks' logging): a ``sys.meta_path`` finder consulted only for modules not imported
yet, that wraps the module's loader so the callback runs right after the module executed, then
steps out of the way.

Example::

    watch = ImportWatch("sklearn.base", on_sklearn)
    sys.meta_path.insert(0, watch)      # ... import sklearn  -> on_sklearn() once
    watch.remove()                      # no-op once it fired
"""

from __future__ import annotations

import importlib.abc
import sys
import types
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec


class ImportWatch(importlib.abc.MetaPathFinder):
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


def when_loaded(module: str, callback: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``callback(the module)`` now if ``module`` is loaded, else right after it loads;
    returns what withdraws a watch that has not fired (a no-op once it has)."""
    if module in sys.modules:
        callback(sys.modules[module])
        return lambda: None
    watch = ImportWatch(module, lambda: callback(sys.modules[module]))
    sys.meta_path.insert(0, watch)
    return watch.remove
