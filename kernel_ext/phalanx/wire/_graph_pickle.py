"""The notebook's object graph, shipped name by name and rebuilt whole on the engines.

Each shipped notebook name is pickled on its own, so that an engine keeps the names it already
holds (by content hash) and a re-run sends only what changed.  Pickled one by one, though, two
names that share an object in the notebook would arrive as two copies: an optimizer built in an
earlier cell would step copies of the parameters, not the model's own, and the run would train
nothing without a word.  So the names are pickled in one order by one :class:`GraphPacker`, and an
object already written for an earlier name is written again only as a reference to it: *(that
name, its index in that name's pickle memo)*.  On the engine :func:`load_names` unpickles the
names in the same order and resolves each reference in the memo of the name that holds it; a
pickler and an unpickler number their memo alike (protocol 4 and up: one ``MEMOIZE`` per
object, in stream order), so whatever the names share in the kernel they share on the engine.

A name's bytes depend only on the names before it, so the per-name cache stays exact: a
name whose own bytes did not change refers to the same objects of the names before it.

Functions and classes defined in the notebook are pickled by value (cloudpickle); their
globals are the notebook's namespace.  Here they are written as a reference to *the run's
namespace*, so on the engine they read and write the cell's own globals, as in the notebook (a
``train()`` defined in an earlier cell sees the ``model`` the cell rebinds).  The globals such a
function reads are shipped with it, except names the run binds itself (other shipped names,
``--shard`` parts, ``rank``/``world_size``/``device``), which it finds there.  Their code keeps
the name of the cell it came from, and that cell's source travels with it into the engine's
line cache: an error raised in a notebook function shows its own lines in the remote traceback
(cloudpickle alone names every such frame ``<dynamic-code>``, with no source).

What comes back (``--return``) goes the other way: an object that came from the notebook is
written as a reference to the notebook's own object, with its new state, and the kernel
applies that state in place (:func:`dumps_returns`, :func:`loads_returns`).  So a returned model
is the notebook's model, trained: the optimizer, scheduler or dict that held its parameters in
the notebook still holds them, as after a loop run in the notebook itself.

Example::

    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> packer = GraphPacker(user_ns={})
    >>> blobs = {name: packer.pack(name, value) for name, value in [("model", model), ("opt", opt)]}
    >>> ns = {}
    >>> memos = load_names(["model", "opt"], blobs, ns)
    >>> ns["opt"].param_groups[0]["params"][0] is ns["model"].weight
    True
"""

from __future__ import annotations

import contextlib
import io
import linecache
import pickle
import sys
import threading
import types
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping

import cloudpickle.cloudpickle as _cloudpickle

from ._tensor_pickle import _Pickler, frame, storages_out_of_band, unframe

if TYPE_CHECKING:
    import numpy as np
    import torch

# Objects whose identity means nothing (immutable, or pickled by name): never written as a
# reference to another name, so a name does not come to depend on another for, say, a string.
_NO_IDENTITY = (str, bytes, int, float, complex, bool, type(None), tuple, frozenset, type,
                types.FunctionType, types.BuiltinFunctionType, types.ModuleType, types.CodeType,
                types.MethodType, type(Ellipsis))
_NAMESPACE = "ns"
_REFERENCE = "ref"


class GraphPacker:
    """Pickles notebook names one by one, each object once across all of them.

    ``user_ns`` is the notebook's namespace (its functions' globals); ``bound`` are the names
    the run binds on the engine itself, which a shipped function's globals leave out."""

    def __init__(self, user_ns: Mapping[str, object], bound: Iterable[str] = ()) -> None:
        self.user_ns = user_ns
        self.bound = frozenset(bound)
        self.owners: dict[int, tuple[str, int, object]] = {}  # id -> (name, memo index, object)
        self.storages: dict = {}  # tensor storages, shared by every name's pickle
        self.depends: dict[str, set[str]] = {}  # name -> the earlier names it refers to
        self.memos: dict[str, dict[int, object]] = {}  # name -> {memo index: object}, for returns

    def pack(self, name: str, value: object) -> bytes:
        """``value`` pickled as notebook name ``name`` (names must be packed in load order)."""
        buffer, buffers = io.BytesIO(), list[pickle.PickleBuffer]()
        pickler = _GraphPickler(buffer, self, name, storages_out_of_band(buffers.append))
        pickler.dump(value)
        self.depends[name] = pickler.refers_to
        memo = self.memos[name] = {}
        for key, (index, obj) in pickler.memo.copy().items():
            memo[index] = obj
            if not isinstance(obj, _NO_IDENTITY):
                self.owners.setdefault(key, (name, index, obj))
        return frame(buffer.getbuffer(), buffers)  # tensors' bytes out of band: _tensor_pickle


class _GraphPickler(_Pickler):
    def __init__(self, file: io.BytesIO, packer: GraphPacker, name: str,
                 buffer_callback: Callable[[pickle.PickleBuffer], object] | None = None) -> None:
        # Read once by the C pickler when it starts: set before that, flat (see flat_table)
        self._sources: dict[str, str | None] = {}  # a cell's source, written once per name
        self.dispatch_table = {**_cloudpickle.Pickler.dispatch_table,  # a ChainMap, unpacked
                               types.CodeType: self._code_reduce}
        super().__init__(file, storages=packer.storages, buffer_callback=buffer_callback)
        self._packer, self._name = packer, name
        self.refers_to: set[str] = set()
        # cloudpickle rebuilds a function's globals from ``globals_ref``: the notebook's own
        # namespace becomes a marker that unpickles as the run's namespace
        self._namespace_marker: dict = {}
        self.globals_ref[id(packer.user_ns)] = self._namespace_marker

    def persistent_id(self, obj: object) -> tuple[str] | tuple[str, str, int] | None:
        if obj is self._namespace_marker:
            return (_NAMESPACE,)
        entry = self._packer.owners.get(id(obj))
        if entry is None or entry[2] is not obj or entry[0] == self._name:
            return None
        self.refers_to.add(entry[0])
        return (_REFERENCE, entry[0], entry[1])

    def _code_reduce(self, code: types.CodeType
                     ) -> tuple[Callable[..., types.CodeType], tuple[object, ...]]:
        """cloudpickle's reduction of a code object, with its real file name and, where the
        kernel holds the cell's lines, the source to put in the engine's line cache."""
        rebuild, args = _cloudpickle._code_reduce(code)
        filename = code.co_filename
        if filename not in self._sources:
            lines = linecache.getlines(filename)
            self._sources[filename] = "".join(lines) if lines else None
        source = self._sources[filename]
        if source is None:
            return rebuild, args
        args = tuple(filename if arg == _DYNAMIC_CODE else arg for arg in args)
        return _code_with_source, (rebuild, args, filename, source)

    def _dynamic_function_reduce(self, func: types.FunctionType) -> tuple[object, ...]:
        reduced = super()._dynamic_function_reduce(func)
        if func.__globals__ is self._packer.user_ns and self._packer.bound:
            _state, slotstate = reduced[2]
            slotstate["__globals__"] = {k: v for k, v in slotstate["__globals__"].items()
                                        if k not in self._packer.bound}
        return reduced


_DYNAMIC_CODE = "<dynamic-code>"  # the file name cloudpickle gives every code object


def _code_with_source(rebuild: Callable[..., types.CodeType], args: tuple[object, ...], filename: str, source: str) -> types.CodeType:
    """On the engine: the code object, its cell's lines in the line cache (no file behind them:
    no modification time, so the cache never drops them)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return rebuild(*args)


class _GraphUnpickler(pickle.Unpickler):
    def __init__(self, blob: bytes, namespace: dict, memos: Mapping[str, dict]) -> None:
        data, buffers = unframe(blob)  # the tensors' bytes: views on the blob, copied once
        super().__init__(io.BytesIO(data), buffers=buffers)
        self._namespace, self._memos = namespace, memos

    def persistent_load(self, pid: tuple) -> object:
        if pid[0] == _NAMESPACE:
            return self._namespace
        if pid[0] == _REFERENCE:
            _kind, name, index = pid
            try:
                return self._memos[name][index]
            except KeyError:
                raise pickle.UnpicklingError(
                    f"a shipped object refers to {name!r}, which was not loaded before it; "
                    "re-run the cell") from None
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def load_names(names: Iterable[str], blobs: Mapping[str, bytes],
               namespace: dict) -> dict[str, dict[int, object]]:
    """Unpickle ``names`` (in the order they were packed) into ``namespace``; references
    between them resolve to the very objects loaded before.  Returns each name's memo
    ``{index: object}``: where each object came from (see :func:`origins`)."""
    memos: dict[str, dict[int, object]] = {}
    for name in names:
        unpickler = _GraphUnpickler(blobs[name], namespace, memos)
        value = unpickler.load()
        memos[name] = dict(unpickler.memo.copy())   # index -> object (typeshed: a pickler's)
        namespace[name] = value
    return memos


# --- the way back: returned objects applied to the notebook's own ------------------------------

Origins = dict[int, tuple[tuple[str, int], object]]  # id(object) -> ((name, memo index), object)


def origins(memos: Mapping[str, Mapping[int, object]]) -> Origins:
    """Where each object the notebook sent (and that has an identity) sits in its pickle."""
    out: Origins = {}
    for name, memo in memos.items():
        for index, obj in memo.items():
            if not isinstance(obj, _NO_IDENTITY):
                out.setdefault(id(obj), ((name, index), obj))
    return out


def dumps_returns(values: dict[str, object], sent: Origins) -> bytes:
    """Pickle ``values`` for the kernel: what came from the notebook (``sent``) as references to
    the notebook's objects with their new state (see :func:`loads_returns`)."""
    buffer = io.BytesIO()
    _ReturnPickler(buffer, sent).dump(values)
    return buffer.getvalue()


class _ReturnPickler(_Pickler):
    def __init__(self, file: io.BytesIO, sent: Origins) -> None:
        super().__init__(file)
        self._sent = sent

    def reducer_override(self, obj: object) -> object:
        entry = self._sent.get(id(obj))
        if entry is None or entry[1] is not obj:
            return super().reducer_override(obj)
        key = entry[0]
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return _restore_tensor, (key, obj.detach())
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, np.ndarray):
            return _restore_array, (key, np.array(obj, copy=True))
        # emptied, then refilled by pickle's own item opcodes (a container may hold itself)
        if type(obj) is dict:
            return _emptied, (key,), None, None, iter(obj.items())
        if type(obj) is list:
            return _emptied, (key,), None, iter(obj), None
        kind = type(obj)
        if kind.__reduce_ex__ is not object.__reduce_ex__ or kind.__reduce__ is not object.__reduce__:
            return super().reducer_override(obj)  # its own reduction: comes back as a new object
        try:
            state = obj.__getstate__()
        except Exception:
            return super().reducer_override(obj)
        return _original, (key,), state


_RESTORING = threading.local()


@contextlib.contextmanager
def _restoring(memos: Mapping[str, Mapping[int, object]]) -> Iterator[None]:
    _RESTORING.memos = memos
    try:
        yield
    finally:
        _RESTORING.memos = None


def loads_returns(blob: bytes, memos: Mapping[str, Mapping[int, object]]
                  ) -> dict[str, object]:
    """Unpickle what :func:`dumps_returns` wrote, in the kernel that packed the names
    (``memos``: :attr:`GraphPacker.memos`): the notebook's objects get their new state; the
    notebook's classes keep their own definition (see :mod:`phalanx.wire._same_classes`)."""
    from ._same_classes import loads_with_same_classes

    with _restoring(memos):
        return loads_with_same_classes(blob)


def _original(key: tuple[str, int]) -> object:
    memos: Mapping[str, Mapping[int, object]] = getattr(_RESTORING, "memos", None) or {}
    try:
        return memos[key[0]][key[1]]
    except KeyError:
        raise pickle.UnpicklingError(f"a returned object refers to notebook object {key}, which "
                                     "this kernel did not send") from None


def _emptied(key: tuple[str, int]) -> dict | list:
    obj = _original(key)
    assert isinstance(obj, (dict, list))   # only those are written emptied
    obj.clear()
    return obj


def _restore_tensor(key: tuple[str, int], value: torch.Tensor) -> torch.Tensor:
    import torch

    from ._lazy_params import is_lazy, materialise_like

    obj = _original(key)
    assert isinstance(obj, torch.Tensor)   # only tensors are written for this
    if is_lazy(obj):  # a lazy module's, first run on the engines: it has no shape here yet
        materialise_like(obj, value)
    with torch.no_grad():
        if obj.shape == value.shape and obj.dtype == value.dtype and obj.device == value.device:
            obj.copy_(value)
        else:
            obj.data = value
    return obj


def _restore_array(key: tuple[str, int], value: np.ndarray) -> np.ndarray:
    import numpy as np

    obj = _original(key)
    assert isinstance(obj, np.ndarray)   # only arrays are written for this
    if obj.shape == value.shape and obj.dtype == value.dtype and obj.flags.writeable:
        obj[...] = value
        return obj
    return value
