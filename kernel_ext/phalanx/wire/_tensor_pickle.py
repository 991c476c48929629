"""cloudpickle with a fast path for dense CPU tensors: what goes between the kernel and engines.

torch pickles each tensor storage through a nested ``torch.save`` (and loads it through
``torch.load``), which costs about 0.1 ms per storage however small it is. A warm re-run
unpickles every shipped model and shard on every engine, so for a small model that overhead is
most of the engine's set-up. Here a storage is written as its raw bytes (a protocol-5 buffer)
and a tensor as a view on it. Pickled and unpickled, a small MLP takes about 0.4x
cloudpickle's time and a 100 MB layer about 0.5x (measured in ``benchmarks/bench_latency.py``).

What torch's own pickling keeps is kept: dtype, shape, strides, storage offset,
``requires_grad``, ``nn.Parameter``, and storage sharing between tensors of the same pickle (a
view and its base stay one storage). Anything else takes torch's path: tensor subclasses other
than ``Parameter``, tensors with Python attributes, non-leaf tensors, CUDA and other devices,
sparse, quantized, nested, conjugate or negated views. The bytes are in this machine's byte
order, like every host of one cluster.

The storages' bytes travel out of band (pickle protocol 5): :func:`dumps` frames the pickle and
the buffers it names into one blob, which :func:`loads` reads back.  Neither side copies a
storage more than once: the kernel writes it straight into the blob (pickling it in band went
through a growing ``BytesIO``, 0.6 s a GB), and an engine copies it from the blob it keeps
straight into a tensor (in band, the unpickler first made a ``bytearray`` of it, 0.5 s a GB).
An unframed blob (plain pickle data) loads too.

Example::

    >>> import torch
    >>> base = torch.arange(6.0)
    >>> a, b = loads(dumps([base, base[2:4]]))  # a view and its base
    >>> b[0] = 100.0; a.tolist()
    [0.0, 1.0, 100.0, 3.0, 4.0, 5.0]
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import threading
from typing import Any, Callable, Mapping

import cloudpickle

# A framed blob starts with this (a pickle starts with its protocol's PROTO opcode, b"\x80"):
# then the count of buffers and the pickle's length and each buffer's, as little-endian u64
_FRAMED = b"\x00phalanx-oob\x00"


def dumps(value: Any) -> bytes:
    """``cloudpickle.dumps(value)``, with dense CPU tensors written as raw bytes."""
    buffer, buffers = io.BytesIO(), list[pickle.PickleBuffer]()
    _Pickler(buffer, buffer_callback=storages_out_of_band(buffers.append)).dump(value)
    return frame(buffer.getbuffer(), buffers)


_LATEST = threading.local()  # the buffer a storage's reduction made last, in this thread


def storages_out_of_band(collect: Callable[[pickle.PickleBuffer], Any]
                         ) -> Callable[[pickle.PickleBuffer], bool]:
    """A ``buffer_callback`` that takes the tensor storages' buffers out of band (``collect``)
    and leaves every other one in band: a numpy array pickled out of band would load as a
    read-only view on the blob, and the cell may write to it."""
    def callback(buffer: pickle.PickleBuffer) -> bool:
        if getattr(_LATEST, "buffer", None) is buffer:
            _LATEST.buffer = None
            collect(buffer)
            return False  # out of band
        return True
    return callback


def frame(data: Any, buffers: list[pickle.PickleBuffer]) -> bytes:
    """One blob: the pickle ``data`` and the out-of-band ``buffers`` it names, in order."""
    if not buffers:
        return bytes(data)
    views = [b.raw() for b in buffers]
    header = struct.pack(f"<{len(views) + 2}Q", len(views), len(data), *(v.nbytes for v in views))
    return b"".join([_FRAMED, header, data, *views])


def unframe(blob: bytes) -> tuple[memoryview, list[memoryview]]:
    """The pickle and its buffers, as views on ``blob`` (nothing copied)."""
    view = memoryview(blob)
    if view[:len(_FRAMED)] != _FRAMED:  # plain pickle data
        return view, []
    at = len(_FRAMED)
    (count,) = struct.unpack_from("<Q", view, at)
    sizes = struct.unpack_from(f"<{count + 1}Q", view, at + 8)
    at += 8 * (count + 2)
    parts = []
    for size in sizes:
        parts.append(view[at:at + size])
        at += size
    return parts[0], parts[1:]


def loads(blob: bytes) -> Any:
    """What :func:`dumps` wrote (or plain pickle data)."""
    data, buffers = unframe(blob)
    return pickle.Unpickler(io.BytesIO(data), buffers=buffers).load()


def flat_table(table: Mapping) -> dict:
    """``table`` as one dict.  cloudpickle's dispatch table is a ChainMap over copyreg's; the C
    pickler looks up the type of every object it has no fast path for there, and a ChainMap
    answers in Python, with a KeyError for each miss (a warm re-run's packing of the
    benchmarks' MLP and data: 1.20 ms of CPU with it, 1.05 ms flat, measured).  Flattened per
    pickler, so a reducer registered meanwhile still counts.  A ChainMap's own lookup gives
    each key its first map's value, nested ChainMaps included."""
    return dict(table)


class _Pickler(cloudpickle.Pickler):
    dispatch_table: Mapping  # cloudpickle's (a class attribute), or a subclass's on the instance

    def __init__(self, file: io.BytesIO, storages: dict | None = None,
                 buffer_callback: Callable[[pickle.PickleBuffer], Any] | None = None) -> None:
        # Read once by the C pickler when it starts: set before that (a subclass may set a
        # flat table of its own on the instance first)
        if type(self.dispatch_table) is not dict:
            self.dispatch_table = flat_table(self.dispatch_table)
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        # one _Storage per storage of this pickle, so the pickle memo writes it once and every
        # tensor on it is rebuilt on the same storage (``storages``: shared with the pickles of
        # other names, see ``_graph_pickle``)
        self._storages: dict[tuple[int, int], _Storage] = {} if storages is None else storages

    def dump(self, obj: Any) -> None:
        try:
            super().dump(obj)
        finally:  # a pickler without storages_out_of_band left its last buffer (and storage) there
            _LATEST.buffer = None

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")  # no torch imported: no tensor to look at
        if torch is not None and _plain_cpu_tensor(torch, obj):
            storage = obj.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            wrapper = self._storages.get(key) if key[1] else None  # empty storages never merge
            if wrapper is None:
                wrapper = self._storages[key] = _Storage(storage)
            return _rebuild_tensor, (wrapper, obj.dtype, tuple(obj.shape), obj.stride(),
                                     obj.storage_offset(), obj.requires_grad,
                                     type(obj) is torch.nn.Parameter)
        return super().reducer_override(obj)


def _plain_cpu_tensor(torch: Any, obj: Any) -> bool:
    """A tensor whose whole state is its storage, dtype, geometry and ``requires_grad``."""
    kind = type(obj)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        return False
    return (obj.layout == torch.strided and obj.device.type == "cpu" and obj.grad_fn is None
            and not obj.is_quantized and not obj.is_nested and not obj.is_conj()
            and not obj.is_neg() and not obj.__dict__)


class _Storage:
    """A storage as its bytes; pickled once however many tensors of the pickle use it."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def __reduce__(self) -> tuple:
        import torch

        as_bytes = torch.empty(0, dtype=torch.uint8).set_(self.storage)
        buffer = _LATEST.buffer = pickle.PickleBuffer(as_bytes.numpy())  # saved right after this
        return _rebuild_storage, (buffer,)


def _rebuild_storage(data: Any) -> Any:
    """A storage of its bytes (a view on the blob, or a ``bytearray`` when in band), copied into
    memory torch allocates: a storage on the blob's memory could not be resized (``resize_``,
    ``out=``), is less aligned than torch's kernels expect, and the blob is read-only."""
    import ctypes

    import numpy as np
    import torch

    source = np.frombuffer(data, dtype=np.uint8)
    storage = torch.empty(len(source), dtype=torch.uint8)
    if len(source):  # one memcpy: a numpy view on the storage would make it not resizable
        ctypes.memmove(storage.data_ptr(), source.ctypes.data, len(source))
    return storage


def _rebuild_tensor(storage_bytes: Any, dtype: Any, size: tuple, stride: tuple, offset: int,
                    requires_grad: bool, parameter: bool) -> Any:
    import torch

    tensor = torch.empty(0, dtype=dtype).set_(storage_bytes.untyped_storage(), offset, size, stride)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_() if requires_grad else tensor
