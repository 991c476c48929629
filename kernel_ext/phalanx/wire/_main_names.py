"""Notebook classes and functions findable as ``__main__.Name`` on the engines.

Plain pickle stores a class or a function by reference: ``pickle.dumps(model)`` writes
``__main__.Net`` and checks that ``sys.modules["__main__"].Net`` is that very class.  skorch's
``__getstate__`` (``torch.save`` of its module), ``joblib.dump``, ``torch.save(model)`` and
DataLoader workers all pickle so.  While a run lasts, the run's module is the engine's
``__main__`` (``_entry``), holding the names the cell reads; but a notebook class reached only
through a shipped object is not among them: with ``net = NeuralNetClassifier(ClassifierModule)``
in an earlier cell, the cell reads ``net``, never ``ClassifierModule``.  Such definitions are
added to the run's module under their own names, as the notebook's ``__main__`` holds them.

Example::

    >>> import types
    >>> Net = type("Net", (), {"__module__": "__main__"})
    >>> Other = type("Other", (), {"__module__": "elsewhere"})
    >>> namespace = {"net": Net()}
    >>> expose_notebook_definitions({"net": {0: Net, 1: Other, 2: namespace["net"]}}, namespace)
    ['Net']
    >>> namespace["Net"] is Net
    True
"""

from __future__ import annotations

import builtins
import types
from typing import Any, Mapping


def expose_notebook_definitions(memos: Mapping[str, Mapping[int, Any]], namespace: dict) -> list[str]:
    """Bind each notebook class or function in the shipped objects' ``memos`` (every object
    unpickled, per name) to its own name in ``namespace``, where that name is free; returns the
    names bound."""
    bound = []
    for memo in memos.values():
        for obj in memo.values():
            if not isinstance(obj, (type, types.FunctionType)):
                continue
            if getattr(obj, "__module__", None) != "__main__":
                continue
            name = getattr(obj, "__qualname__", "")
            # a nested class (A.B), a lambda or a closure is not found by name in the notebook
            # either; a name the cell's module already binds stays its own
            if not name.isidentifier() or name in namespace or hasattr(builtins, name):
                continue
            namespace[name] = obj
            bound.append(name)
    return bound
