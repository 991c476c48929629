"""Class patching: the :class:`_Patched` descriptor that routes ``partial_fit``/``fit``
through the active run, and the registry of active runs and patched classes it reads."""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time a cycle: the state undoes the class patching this module does
    from ._install import _RunSync

_LOCK = threading.RLock()
_STATES: dict[int, _RunSync] = {}      # id(run) -> its state (one run per engine; tests: more)
_BY_THREAD: dict[int, _RunSync] = {}   # the thread that installed it -> state
_PATCHED: dict[type, dict[str, object]] = {}  # class -> the entries it had before patching
_MISSING = object()
_PATCHED_ATTRS = ("partial_fit", "fit")


def _current_state() -> _RunSync | None:
    state = _BY_THREAD.get(threading.get_ident())
    if state is None and len(_STATES) == 1:  # a worker thread of the run (joblib)
        state = next(iter(_STATES.values()), None)
    return state


class _Patched:
    """Class attribute standing in for ``partial_fit``/``fit`` while runs are active.

    Looked up on an instance during a run it gives a bound method that goes through the run
    (:meth:`_RunSync.call`); on the class, or outside a run, the original method itself.
    ``available_if`` descriptors keep deciding whether the method exists.
    """

    def __init__(self, attr: str, inner: object) -> None:
        self.attr, self.inner = attr, inner

    def __get__(self, obj: object, owner: type | None = None) -> object:
        get = getattr(self.inner, "__get__", None)
        method = get(obj, owner) if get is not None else self.inner
        if obj is None:
            return method
        state = _current_state()
        if state is None or state.closed or not callable(method):
            return method
        return _routed(state, self.attr, obj, method)


def _routed(state: _RunSync, attr: str, obj: object, method: Callable[..., object]
            ) -> types.MethodType:
    @functools.wraps(getattr(method, "__func__", method))  # signature() shows the original
    def routed(self: object, *args: object, **kwargs: object) -> object:
        return state.call(attr, self, method, args, kwargs)

    return types.MethodType(routed, obj)


def _lookup(cls: type, attr: str) -> object:
    for klass in cls.__mro__:
        if attr in vars(klass):
            return vars(klass)[attr]
    return _MISSING


def _from_sklearn(raw: object) -> bool:
    """Whether a ``fit`` is scikit-learn's own.  Those stay per rank (``StandardScaler.fit``
    calls ``partial_fit``: syncing it would make a fit on rank 0 alone, or one inside a
    cross-validation, wait for the other ranks); a ``fit`` written for the cell that loops over
    ``partial_fit`` keeps synchronising each call, as the user wrote it for every rank."""
    module = str(getattr(raw, "__module__", None) or type(raw).__module__)
    return module == "sklearn" or module.startswith("sklearn.")


def _patch_class(cls: type) -> bool:
    """Route ``partial_fit``/``fit`` of ``cls`` through the runs; False if the class refuses."""
    with _LOCK:
        if cls in _PATCHED:
            return True
        saved: dict[str, object] = {}
        for attr in _PATCHED_ATTRS:
            raw = _lookup(cls, attr)
            if raw is _MISSING or isinstance(raw, _Patched):  # a patched base routes it already
                continue
            if attr == "fit" and not _from_sklearn(raw):  # a fit of one's own: see _from_sklearn
                continue
            saved[attr] = vars(cls).get(attr, _MISSING)
            try:
                setattr(cls, attr, _Patched(attr, raw))
            except (TypeError, AttributeError):  # extension types
                _restore_class(cls, saved)
                return False
        _PATCHED[cls] = saved
        return True


def _restore_class(cls: type, saved: dict[str, object]) -> None:
    for attr, own in saved.items():
        if own is not _MISSING:
            setattr(cls, attr, own)
        elif isinstance(vars(cls).get(attr), _Patched):
            delattr(cls, attr)


def _unpatch_all() -> None:
    with _LOCK:
        for cls, saved in _PATCHED.items():
            _restore_class(cls, saved)
        _PATCHED.clear()
