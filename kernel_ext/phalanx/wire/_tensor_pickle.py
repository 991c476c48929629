"""cloudpickle with a fast path for dense CPU tensors: what goes between the kernel and engines.

torch pickles each tensor storage through a nested ``torch.save`` (and loads it through
``torch.load``), which costs about 0.1 ms per storage however small it is. A warm re-run
unpickles every shipped model and shard on every engine, so for a small model that overhead is
most of the engine's set-up. Here a storage is written as its raw bytes (a protocol-5 buffer)
and a tensor as a view on it. Pickled and unpickled, a small MLP takes about 0.4x
cloudpickle's time and a 100 MB layer about 0.6x (measured in ``benchmarks/bench_latency.py``).

What torch's own pickling keeps is kept: dtype, shape, strides, storage offset,
``requires_grad``, ``nn.Parameter``, and storage sharing between tensors of the same pickle (a
view and its base stay one storage). Anything else takes torch's path: tensor subclasses other
than ``Parameter``, tensors with Python attributes, non-leaf tensors, CUDA and other devices,
sparse, quantized, nested, conjugate or negated views. The bytes are in this machine's byte
order, like every host of one cluster.

The result is ordinary pickle data: ``pickle.loads`` (or ``cloudpickle.loads``) reads it where
phalanx is importable, as on every engine.

Example::

    >>> import pickle, torch
    >>> base = torch.arange(6.0)
    >>> a, b = pickle.loads(dumps([base, base[2:4]]))  # a view and its base
    >>> b[0] = 100.0; a.tolist()
    [0.0, 1.0, 100.0, 3.0, 4.0, 5.0]
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

import cloudpickle


def dumps(value: Any) -> bytes:
    """``cloudpickle.dumps(value)``, with dense CPU tensors written as raw bytes."""
    buffer = io.BytesIO()
    _Pickler(buffer).dump(value)
    return buffer.getvalue()


class _Pickler(cloudpickle.Pickler):
    def __init__(self, file: io.BytesIO, storages: dict | None = None) -> None:
        super().__init__(file, protocol=5)
        # one _Storage per storage of this pickle, so the pickle memo writes it once and every
        # tensor on it is rebuilt on the same storage (``storages``: shared with the pickles of
        # other names, see ``_graph_pickle``)
        self._storages: dict[tuple[int, int], _Storage] = {} if storages is None else storages

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
        return _rebuild_storage, (pickle.PickleBuffer(as_bytes.numpy()),)


def _rebuild_storage(data: bytearray) -> Any:
    import torch

    if len(data) == 0:  # frombuffer refuses an empty buffer
        return torch.empty(0, dtype=torch.uint8)
    # Copied into memory torch allocates: a storage on the bytearray itself could not be resized
    # (``resize_``, ``out=``) and is less aligned than torch's kernels expect.
    return torch.frombuffer(data, dtype=torch.uint8).clone()


def _rebuild_tensor(storage_bytes: Any, dtype: Any, size: tuple, stride: tuple, offset: int,
                    requires_grad: bool, parameter: bool) -> Any:
    import torch

    tensor = torch.empty(0, dtype=dtype).set_(storage_bytes.untyped_storage(), offset, size, stride)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_() if requires_grad else tensor
