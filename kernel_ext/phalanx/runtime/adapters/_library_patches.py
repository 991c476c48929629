"""Patches of a library's functions installed for one run, and taken back at its end.

A run's world (LightGBM's, XGBoost's: see :mod:`.lightgbm`, :mod:`.xgboost`) puts
a wrapper of ours in every module a cell may take the library's function from, for the length of
the run.  Each wrapper is marked (``_phalanx_world``) and keeps what it wraps in ``__wrapped__``
(``functools.wraps``), so that a patch of ours is never kept, nor restored, as if it were the
library's original: a module imported while a wrapper was in place took the wrapper, not the
original, and a new wrapper built over an old one would otherwise stack on it.

Example (a world's wrapper of ``train``, and its end)::

    undo = patch_everywhere(lightgbm.engine.train, (("lightgbm", "train"),), world.ours,
                            world.train)  # world.train(original, signature, args, kwargs)
    ...
    take_back_patches((("lightgbm", "train"),))   # lightgbm.train is LightGBM's own again
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Iterable

from ._import_watch import when_loaded

__all__ = ["unpatched", "install_patch", "take_back_patches", "patch_everywhere"]


def unpatched(fn: Any) -> Any:
    """``fn`` without phalanx's wrappers (a run that ended took its own back; this also takes
    back one a module imported while the wrapper was in place)."""
    while getattr(fn, "_phalanx_world", False):
        fn = fn.__wrapped__
    return fn


def install_patch(attribute: str, patch: Any, module: Any) -> None:
    """Set ``module.attribute`` to ``patch`` where the library already defines it (the argument
    order lets ``functools.partial(install_patch, attribute, patch)`` wait for the module)."""
    if callable(getattr(module, attribute, None)):  # absent while the library's __init__ runs
        setattr(module, attribute, patch)


def take_back_patches(references: Iterable[tuple[str, str]]) -> None:
    """Each ``(module name, attribute)`` of a loaded module back to the library's own."""
    for module_name, attribute in references:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attribute):
            setattr(module, attribute, unpatched(getattr(module, attribute)))


def patch_everywhere(original: Any, references: Iterable[tuple[str, str]],
                     ours: Callable[[], bool], handle: Callable[..., Any]) -> list:
    """Wrap ``original`` (a library's ``train``) and install the wrapper at each ``(module name,
    attribute)`` as the module loads; returns the hooks to undo.  A call the run takes
    (``ours()``) goes to ``handle(original, signature, args, kwargs)``; any other (another
    thread, a run that ended) to the library's own function."""
    original = unpatched(original)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not ours():
            return original(*args, **kwargs)
        return handle(original, signature, args, kwargs)

    wrapper._phalanx_world = True  # type: ignore[attr-defined]
    # modules loaded later (the library's own __init__, its sklearn API) import the wrapper
    return [when_loaded(name, functools.partial(install_patch, attribute, wrapper))
            for name, attribute in references]
