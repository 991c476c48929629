"""``--sync NAME``: a built-in strategy, a notebook class, or an installed class (kernel side).

A notebook name is looked up in the notebook's namespace before anything is sent: it must be
bound to a ``SyncStrategy`` subclass that the runtime can build as ``cls(comm, every=, alpha=)``.
The class then travels with the other shipped names (cloudpickle, by value, re-sent only when it
changed), and each engine builds the strategy from the copy it unpickled for the run.

Example::

    >>> from phalanx import SyncStrategy
    >>> class EveryThird(SyncStrategy):
    ...     pass
    >>> notebook_strategy("EveryThird", {"EveryThird": EveryThird})
    'EveryThird'
    >>> notebook_strategy("localsgd", {}) is None   # built-in names come first
    True
    >>> notebook_strategy("ten", {"ten": 10})
    Traceback (most recent call last):
    ...
    phalanx.fit.run._fit_options.FitUsageError: --sync ten: 'ten' is an int (10), not a SyncStrategy subclass; ...
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

from ...wire._options import default_sync_params
from ._fit_options import STRATEGIES, FitUsageError
from ..analysis._suggest import did_you_mean

_MAIN = "__main__."
_WHAT_TO_DO = ("pass the name of a class defined as `class MySync(SyncStrategy): ...` "
               "(from phalanx import SyncStrategy), a built-in or installed name ({builtins}) or the dotted "
               "name of an installed class (pkg.mod.Class)")


def notebook_strategy(sync: str, user_ns: Mapping[str, Any]) -> str | None:
    """The notebook name to ship for ``--sync sync``, or ``None`` when the engines resolve it
    themselves (a built-in name or an installed class); a clear ``FitUsageError`` otherwise."""
    if sync in STRATEGIES or sync in _installed():  # the engines build it by its name
        return None
    # `__main__.X` is how a notebook class names itself: it is the notebook's X.
    name = sync[len(_MAIN):] if sync.startswith(_MAIN) else sync
    if "." in name:
        return None
    if name not in user_ns:
        hint = did_you_mean(name, [*STRATEGIES, *_installed(), *_notebook_strategies(user_ns)])
        raise FitUsageError(f"unknown --sync {sync!r}" + (f" ({hint})" if hint else "")
                            + f": it is not a built-in strategy and the notebook defines no "
                            f"{name!r}; " + _todo())
    _check_strategy_class(sync, name, user_ns[name])
    return name


def _notebook_strategies(user_ns: Mapping[str, Any]) -> list[str]:
    """The notebook's own strategy classes: what a --sync typo may have meant (SyncStrategy
    itself, imported for them, never is)."""
    from ...runtime import SyncStrategy

    return [n for n, v in user_ns.items()
            if isinstance(v, type) and issubclass(v, SyncStrategy) and v is not SyncStrategy]


def _check_strategy_class(sync: str, name: str, value: Any) -> None:
    from ...runtime import SyncStrategy

    if not isinstance(value, type):
        raise FitUsageError(f"--sync {sync}: {name!r} is {_describe(value)}, not a SyncStrategy "
                            f"subclass; " + _todo())
    if not issubclass(value, SyncStrategy):
        bases = ", ".join(b.__name__ for b in value.__bases__)
        raise FitUsageError(f"--sync {sync}: class {name!r} (bases: {bases}) does not subclass "
                            f"phalanx.SyncStrategy; define it as `class {value.__name__}"
                            "(SyncStrategy): ...` and override its hooks (before_step, after_step)")
    params = default_sync_params()
    try:
        inspect.signature(value).bind(None, **params)
    except (TypeError, ValueError) as exc:
        given = ", ".join(f"{k}=..." for k in params)
        raise FitUsageError(f"--sync {sync}: the engines build the strategy as {name}(comm, "
                            f"{given}), which its __init__ does not accept ({exc}); keep "
                            "SyncStrategy's __init__(self, comm, every=1, alpha=0.5) signature and "
                            "call super().__init__ first") from None


def _describe(value: Any) -> str:
    if isinstance(value, (int, float, str, bool)) or value is None:
        return f"{_article(type(value).__name__)} ({value!r})"
    from ...runtime import SyncStrategy

    if isinstance(value, SyncStrategy):
        return f"a {type(value).__name__} instance (pass the class itself, not an instance)"
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return "a function"
    if inspect.ismodule(value):
        return "a module"
    return _article(type(value).__name__)


def _article(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _installed() -> list[str]:
    """The --sync names other packages installed (``phalanx.strategies`` entry points)."""
    from ...wire import _plugins

    return list(_plugins.installed(_plugins.STRATEGIES))


def _todo() -> str:
    return _WHAT_TO_DO.format(builtins=", ".join([*STRATEGIES, *_installed()]))
