"""The run's ``__main__`` module on an engine: the shipped names rebuilt in it as one object
graph, this rank's shards beside them, and the module standing as the process's ``__main__``
while the cell runs (as the notebook's does in the kernel).

Example (inside :func:`~phalanx.runtime.run._entry.run_cell`)::

    main, origins = build_namespace(spec)
    with as_main(main):
        exec(code, main.__dict__)
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from ...wire._seam import RunSpec, shard_key
from ._engine_state import engine_state


def build_namespace(spec: RunSpec) -> tuple[Any, dict]:
    """The run's ``__main__`` module (see :func:`as_main`): the shipped names rebuilt in its
    dict as one object graph (:mod:`phalanx.wire._graph_pickle`), then this rank's part of each
    ``--shard`` name (held in the engine's cache under :func:`shard_key`); and, on the rank
    that returns values, where each shipped object came from (elsewhere nothing: the map holds
    every shipped object, a model's first host copy too, for the whole run)."""
    import types

    from ...wire._graph_pickle import load_names, origins
    from ...wire._main_names import expose_notebook_definitions
    from ...wire._tensor_pickle import loads as tensor_loads

    cache = engine_state().cache
    shards = {name: shard_key(name) for name in spec.train.shard}
    missing = [name for name in (*spec.names, *shards.values()) if name not in cache]
    if missing:
        raise RuntimeError(f"shipped object {missing[0]!r} is missing on this engine; re-run the cell")
    module = types.ModuleType("__main__")
    namespace = module.__dict__
    namespace["__builtins__"] = __builtins__
    memos = load_names(spec.names, {name: cache[name][1] for name in spec.names}, namespace)
    expose_notebook_definitions(memos, namespace)  # found as __main__.Net by plain pickle
    _track_scheduled_steps(memos)
    for name, key in shards.items():  # this rank's part, kept from the run that sent it
        namespace[name] = tensor_loads(cache[key][1])
    return module, (origins(memos) if spec.train.returns and spec.rank == 0 else {})


def _track_scheduled_steps(memos: dict) -> None:
    """An optimizer's ``step`` as its LR scheduler wrapped it (torch counts the optimizer's
    steps there, and the wrapper does not survive pickling): without it every scheduler built
    in an earlier cell would warn that ``optimizer.step()`` was overridden."""
    import functools
    import weakref

    schedulers = sys.modules.get("torch.optim.lr_scheduler")
    if schedulers is None:
        return
    for memo in memos.values():
        for obj in memo.values():
            if not isinstance(obj, schedulers.LRScheduler):
                continue
            optimizer = obj.optimizer
            if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
                continue
            func, ref = optimizer.step.__func__, weakref.ref(optimizer)

            def counted(*args: Any, _func: Any = func, _ref: Any = ref, **kwargs: Any) -> Any:
                opt = _ref()
                opt._opt_called = True
                return _func.__get__(opt, type(opt))(*args, **kwargs)

            counted = functools.wraps(func)(counted)
            counted._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
            optimizer.step = counted


@contextlib.contextmanager
def as_main(module: Any) -> Iterator[None]:
    """While the cell runs, its module is the process's ``__main__``, as the notebook's is in
    the kernel: ``__name__ == "__main__"`` holds, and a class or function the notebook defined
    is found as ``__main__.Net`` by plain pickle (``torch.save(model)``, DataLoader workers)."""
    previous = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        yield
    finally:
        if previous is not None:
            sys.modules["__main__"] = previous
        else:
            sys.modules.pop("__main__", None)
