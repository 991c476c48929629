"""Content fingerprints of data and hyperparameters, and row selection.

Smart retraining compares *values*, not identities: an array mutated in place, a nested
estimator tuned through ``set_params`` or a hyperparameter set and set back must all be seen
for what they are.  :func:`fingerprint` hashes the content of an object (deeply for
containers and estimators) into a short hex string.

Example::

    >>> import numpy as np
    >>> a = np.arange(4.0)
    >>> before = fingerprint(a)
    >>> a[0] = 9.0
    >>> fingerprint(a) == before
    False
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeGuard

import numpy as np

if TYPE_CHECKING:
    import scipy.sparse
    import torch

# A row selection: None (all rows), a slice, positions, or a boolean mask.
Rows: TypeAlias = "slice | Sequence[int] | Sequence[bool] | np.ndarray | None"


class _Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


_SCALARS = (type(None), bool, int, float, complex, str, bytes)

# Sources are hashed at every fit, so speed matters.  sha1 is about twice as fast as blake2b
# and only has to notice accidental change; xxhash (xxh3), when installed, is many times
# faster and digests every buffer above _FAST bytes.  Buffers above _PARALLEL bytes are
# digested in fixed _CHUNK-sized pieces on threads (both release the GIL): the chunking, not
# the thread count, defines the digest, and below that size threads cost more than they save.
_FAST = 1 << 16
_CHUNK = 1 << 23
_PARALLEL = 1 << 26


def _new_hasher() -> _Hasher:
    return hashlib.sha1(usedforsecurity=False)


@functools.lru_cache(maxsize=1)
def _fast_digest() -> Callable[[memoryview], bytes] | None:
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash.xxh3_128_digest


def _sha1_digest(chunk: memoryview) -> bytes:
    return hashlib.sha1(chunk, usedforsecurity=False).digest()


def fingerprint(obj: object) -> str:
    """A hex digest of ``obj``'s content; equal values give equal digests.

    Example::

        >>> fingerprint({"a": [1, 2]}) == fingerprint({"a": [1, 2]})
        True
    """
    h = _new_hasher()
    _feed(h, obj, depth=0)
    return h.hexdigest()


def param_fingerprints(model: object) -> dict[str, str]:
    """Per-hyperparameter fingerprints of an estimator (``get_params(deep=False)``).

    Nested estimators are hashed by type and their own parameters, so tuning one through
    ``outer.set_params(inner__depth=3)`` changes the fingerprint of ``inner``.

    Example::

        >>> from sklearn.linear_model import Ridge
        >>> param_fingerprints(Ridge(alpha=1.0)) == param_fingerprints(Ridge(alpha=1.0))
        True
    """
    if not hasattr(model, "get_params"):
        # Not scikit-learn style: the whole object is its own single "parameter".
        return {"<model>": fingerprint(model)}
    return {k: fingerprint(v) for k, v in model.get_params(deep=False).items()}


def scalar_params(model: object) -> dict[str, object]:
    """The scalar hyperparameters of ``model`` (kept to judge warm updates)."""
    if not hasattr(model, "get_params"):
        return {}
    return {k: v for k, v in model.get_params(deep=False).items() if isinstance(v, _SCALARS)}


def rows_fingerprint(rows: Rows) -> str:
    """Fingerprint of a row selection, the same whatever container holds the indices.

    Example::

        >>> rows_fingerprint([0, 2]) == rows_fingerprint(np.array([True, False, True]))
        True
        >>> rows_fingerprint(None)
        'all'
    """
    if rows is None:
        return "all"
    if isinstance(rows, slice):
        return fingerprint(("slice", rows.start, rows.stop, rows.step))
    idx = np.asarray(rows)
    idx = np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64, copy=False)
    return fingerprint(np.ascontiguousarray(idx))


def select_rows(data: Any, rows: Rows) -> object:
    """``data`` restricted to ``rows`` (``None`` means all rows).

    Works for numpy arrays, pandas objects (positional), sparse matrices, tensors and lists.

    Example::

        >>> select_rows([10, 20, 30], [0, 2])
        [10, 30]
    """
    if rows is None:
        return data
    if hasattr(data, "iloc"):
        return data.iloc[rows]
    if isinstance(data, (list, tuple)):
        idx = range(len(data))[rows] if isinstance(rows, slice) else rows
        return type(data)(data[int(i)] for i in idx)
    if isinstance(rows, slice) or hasattr(data, "__getitem__"):
        return data[rows if isinstance(rows, slice) else np.asarray(rows)]
    raise TypeError(f"cannot select rows of {type(data).__name__}")


def n_rows(data: Any) -> int | None:
    """Number of rows (first dimension) of ``data``, or ``None`` when it has none."""
    shape = getattr(data, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    try:
        return len(data)
    except TypeError:
        return None


# --- hashing ----------------------------------------------------------------------------------

def _feed(h: _Hasher, obj: object, depth: int) -> None:
    if depth > 50:
        # A self-referencing structure: identity is the best we can do.
        h.update(f"<deep:{id(obj)}>".encode())
        return
    h.update(type(obj).__qualname__.encode() + b":")
    if isinstance(obj, (*_SCALARS, np.generic)):
        h.update(repr(obj).encode())
    elif isinstance(obj, np.ndarray):
        _feed_array(h, obj, depth)
    elif isinstance(obj, (list, tuple)):
        h.update(str(len(obj)).encode())
        for item in obj:
            _feed(h, item, depth + 1)
    elif isinstance(obj, Mapping):
        _feed_mapping(h, obj, depth)
    elif isinstance(obj, (set, frozenset)):
        h.update("".join(sorted(fingerprint(x) for x in obj)).encode())
    elif hasattr(obj, "get_params") and not isinstance(obj, type):
        h.update(type(obj).__module__.encode())
        _feed_mapping(h, obj.get_params(deep=False), depth)
    elif _is_sparse(obj):
        _feed(h, (obj.shape, obj.tocsr().data, obj.tocsr().indices, obj.tocsr().indptr), depth + 1)
    elif _is_tensor(obj):
        _feed_array(h, obj.detach().cpu().numpy(), depth)
    else:
        h.update(_opaque_bytes(obj))


def _feed_array(h: _Hasher, a: np.ndarray, depth: int) -> None:
    h.update(f"{a.dtype.str}{a.shape}".encode())
    if a.dtype.hasobject:
        for item in a.ravel():
            _feed(h, item, depth + 1)
    else:
        _feed_buffer(h, np.ascontiguousarray(a).data.cast("B"))


def _feed_buffer(h: _Hasher, buf: memoryview) -> None:
    fast = _fast_digest()
    if buf.nbytes > _PARALLEL:
        chunks = [buf[i:i + _CHUNK] for i in range(0, buf.nbytes, _CHUNK)]
        with ThreadPoolExecutor(max_workers=min(len(chunks), os.cpu_count() or 1)) as pool:
            for d in pool.map(fast or _sha1_digest, chunks):
                h.update(d)
    elif fast is not None and buf.nbytes > _FAST:
        h.update(fast(buf))
    else:
        h.update(buf)


def _feed_mapping(h: _Hasher, m: Mapping, depth: int) -> None:
    for key in sorted(m, key=repr):
        h.update(repr(key).encode() + b"=")
        _feed(h, m[key], depth + 1)


def _opaque_bytes(obj: object) -> bytes:
    # pandas objects, functions, random states...: their pickle is their content.  cloudpickle
    # handles lambdas and closures; an object nothing can pickle is compared by identity.
    for dumps in (pickle.dumps, _cloudpickle_dumps):
        try:
            return dumps(obj)
        except Exception:  # noqa: BLE001 - any pickling failure means "try the next way"
            continue
    return f"<id:{id(obj)}>".encode()


def _cloudpickle_dumps(obj: object) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(obj)


def _is_sparse(obj: object) -> TypeGuard[scipy.sparse.spmatrix]:
    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and sparse.issparse(obj)


def _is_tensor(obj: object) -> TypeGuard[torch.Tensor]:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)
