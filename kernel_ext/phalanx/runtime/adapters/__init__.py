"""Adapters: what a run changes in other libraries and frameworks so that code written for
them trains right on the cluster; one module per library or framework.

- :mod:`.sklearn`: estimators' ``partial_fit`` averaged across ranks;
- :mod:`.xgboost`, :mod:`.lightgbm`: ``xgb.train`` and ``lgb.train`` over every rank's shard;
- :mod:`.framework_logs`: what Hugging Face, Lightning... log becomes the run's metric rows;
- :mod:`.double_split`: a framework splitting ``--shard`` data again is said;
- :mod:`.torchrun`: torchrun's environment and init calls fitted to the warm group (entered
  around the cell by the run itself, not installed like the others).

An adapter is an :class:`Adapter`: a name, what it changes (said if taking it back fails),
``install(run, namespace, shard)``, which makes its changes through ``run.patches`` (the run's
patch ledger, :mod:`phalanx.runtime.run._patch_ledger`) or returns one undo, and may contribute
metric rows (``phalanx.log`` from the code it wraps, or ``run.metrics``), and optionally
``wrap(obj, run)``, what ``phalanx.wrap()`` does with the library's own objects.  Every registered adapter is
installed as a run starts, in order, and the ledger takes their changes back, last first, when
the run ends however it ends.  phalanx's own are listed here; another package adds one with an
entry point in the ``phalanx.adapters`` group naming its ``Adapter`` (see :mod:`phalanx.wire._plugins`),
or by calling :func:`register` on the engines.

May import: the wire, the runtime's other rooms and its transport; nothing of the kernel's side.
The rest of the runtime reaches adapters only through this module (and :mod:`.torchrun`, the
world a run is entered in).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

Install = Callable[[Any, dict, Sequence[str]], "Callable[[], None] | None"]


@dataclass(frozen=True)
class Adapter:
    """One library's or framework's changes for a run (see the module docstring)."""

    name: str
    changes: str   # what it changes, as the cell says it when taking it back fails
    install: Install
    # ``wrap(obj)`` of an object of this library: the object made to train across ranks, or
    # None where it is not one of the library's (scikit-learn's partial_fit learners)
    wrap: Callable[[Any, Any], Any] | None = None


# phalanx's own, in the order they are installed: module, then its ADAPTER
_BUILTIN = (".sklearn", ".framework_logs", ".double_split", ".xgboost", ".lightgbm")
_added: list[Adapter] = []


def register(adapter: Adapter) -> None:
    """Install ``adapter`` in every run of this process from the next one on (one of the same
    name is replaced)."""
    if not isinstance(adapter, Adapter):
        raise TypeError(f"register() takes a phalanx Adapter, not {type(adapter).__name__}")
    _added[:] = [a for a in _added if a.name != adapter.name] + [adapter]


def registered() -> list[Adapter]:
    """Every adapter a run installs: phalanx's own, then entry points', then :func:`register`'s."""
    own = [importlib.import_module(m, __name__).ADAPTER for m in _BUILTIN]
    return own + _entry_point_adapters() + list(_added)


def install_adapters(run: Any, namespace: dict, shard: Sequence[str]) -> None:
    """Install every registered adapter for ``run``; each undo goes into its patch ledger."""
    for adapter in registered():
        try:
            undo = adapter.install(run, namespace, shard)
        except Exception as exc:
            raise AdapterError(f"the {adapter.name!r} adapter could not be installed: "
                               f"{type(exc).__name__}: {exc}; fix or uninstall the package that "
                               "provides it") from exc
        if undo is not None:
            run.patches.on_undo(undo, adapter.changes)


def wrap_estimator(obj: Any, run: Any) -> Any:
    """``wrap()`` of an object an adapter knows how to train across ranks (scikit-learn's
    ``partial_fit`` learners), or None where none does."""
    for adapter in registered():
        wrapped = adapter.wrap(obj, run) if adapter.wrap is not None else None
        if wrapped is not None:
            return wrapped
    return None


class AdapterError(RuntimeError):
    """An adapter's install raised: the run stops before the cell, naming it."""


def _entry_point_adapters() -> list[Adapter]:
    from ...wire import _plugins

    return [_plugins.load(_plugins.ADAPTERS, name, Adapter)
            for name in _plugins.installed(_plugins.ADAPTERS)]
