"""What a cell needs from the notebook, checked and packed before anything is sent.

* :func:`resolve_names` finds the notebook names the cell body reads (functions, classes,
  models, tensors, arrays, scalars), by Python's scoping rules (:mod:`phalanx.fit.analysis._names_read`), and raises
  :class:`UndefinedNameError` (a ``NameError``) for one that exists nowhere, naming the close
  ones that do;
* :func:`pack` pickles each with cloudpickle (notebook-defined code by value) and, when that
  fails, names the attribute path of the part that cannot be pickled;
* :func:`split_rows` cuts ``--shard`` objects by rows so each rank receives only its own part.

Example::

    >>> sorted(resolve_names("y = f(x) + rank", {"f": len, "x": [1], "g": 2}, injected={"rank"}))
    ['f', 'x']
"""

from __future__ import annotations

import builtins
from typing import Any, Callable, Iterable, Mapping

from ._cell_warning import warn_at_cell
from ._names_read import split_reads
from ._suggest import did_you_mean, joined

LARGE_OBJECT_BYTES = 100 * 2**20

# Names IPython puts in every namespace; never shipped.
_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "_", "__", "___", "_ih", "_oh", "_dh"}


class ShippingError(ValueError):
    """An object the cell needs cannot be sent to the engines."""


class ShippingWarning(UserWarning):
    """An object is large enough to make every run slow to start."""


class UndefinedNameError(NameError):
    """A name the cell or a flag needs is defined nowhere; nothing was sent.  The message names
    it and the close names that exist (the magic shows it as one line)."""


def notebook_names(user_ns: Mapping[str, Any]) -> list[str]:
    """The names a person defined in the notebook: what a typo is compared with (IPython's own
    and private names left out, they are never what was meant)."""
    return [n for n in user_ns if not n.startswith("_") and n not in _IPYTHON_NAMES]


def check_defined(flag: str, names: Iterable[str], user_ns: Mapping[str, Any]) -> None:
    """Every name a flag lists is a notebook name, else :class:`UndefinedNameError`.

    >>> try:
    ...     check_defined("--shard", ["Xtr", "ytrr"], {"Xtr": 1, "ytr": 2})
    ... except NameError as exc:
    ...     print(exc)
    --shard names 'ytrr', not defined in the notebook; did you mean 'ytr'?
    """
    missing = [n for n in names if n not in user_ns]
    if missing:
        hint = did_you_mean(missing[0], notebook_names(user_ns)) if len(missing) == 1 else ""
        raise UndefinedNameError(joined(f"{flag} names {', '.join(map(repr, missing))}, not "
                                        "defined in the notebook", hint))


def resolve_names(body: str, user_ns: Mapping[str, Any], injected: Iterable[str] = ()) -> dict[str, Any]:
    """The notebook objects the body reads, by name; :class:`UndefinedNameError` (a ``NameError``)
    for a name defined nowhere.

    A name counts as read only where the cell has not bound it yet (:mod:`phalanx.fit.analysis._names_read`): a cell that
    re-opens ``f`` or re-imports ``cudnn`` before using it does not ship the notebook's.  A name
    the cell binds somewhere (later, or in one branch only) is not missing.
    """
    reads, deferred, binds = split_reads(body)
    injected = set(injected)
    shipped: dict[str, Any] = {}
    missing = []
    for name in sorted((reads | deferred) - injected):
        if name in user_ns and name not in _IPYTHON_NAMES and not name.startswith("_i"):
            shipped[name] = user_ns[name]
        elif name in reads and name not in binds and not hasattr(builtins, name) \
                and name not in _IPYTHON_NAMES:
            missing.append(name)
    if missing:
        known = [*notebook_names(user_ns), *binds, *injected]
        # Builtins only where nothing of the notebook is close: `ytr` is meant, not `bytearray`.
        hints = {m: did_you_mean(m, known) or did_you_mean(m, _public_builtins()) for m in missing}
        said = " ".join(h if len(missing) == 1 else f"{m!r}: {h}" for m, h in hints.items() if h)
        it = "it" if len(missing) == 1 else "them"
        raise UndefinedNameError(
            f"the cell uses {', '.join(repr(m) for m in missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not defined in the notebook; "
            + (f"{said} Otherwise define {it}" if said else f"define {it}")
            + " in an earlier cell or inside this one")
    return shipped


def _public_builtins() -> list[str]:
    return [n for n in dir(builtins) if not n.startswith("_")]


def content_hash(*blobs: bytes) -> str:
    """The hash of the blobs' concatenation, without building it (a shard's parts can be large).

    Every warm re-run hashes everything it ships, changed or not, to find what an engine
    already holds: XXH3-128 reads 100 MB in 3.5 ms where BLAKE2b took 138 ms (a hash for
    telling contents apart, not for resisting an attacker: the bytes come from this kernel)."""
    import xxhash

    digest = xxhash.xxh3_128()
    for blob in blobs:
        digest.update(blob)
    return digest.hexdigest()


def pack(name: str, value: Any, dumps: Callable[[Any], bytes] | None = None) -> bytes:
    """cloudpickle ``value`` (tensors the fast way: ``runtime/_tensor_pickle``; ``dumps``: the
    pickler to use instead); a :class:`ShippingError` names the part that cannot be pickled."""
    if dumps is None:
        from ...wire._tensor_pickle import dumps as tensor_dumps

        dumps = tensor_dumps
    try:
        blob = dumps(value)
    except Exception as exc:
        path, culprit = find_unpicklable(value, name)
        raise ShippingError(
            f"cannot send {path} to the engines: {type(culprit).__name__} objects cannot be "
            f"pickled ({exc}). Create it inside the cell instead, or leave it out.") from None
    if len(blob) > LARGE_OBJECT_BYTES:
        warn_at_cell(f"sending {name} ({len(blob) / 2**20:.0f} MB) to the engines: consider "
                      f"--shard {name} or loading it inside the cell", ShippingWarning)
    return blob


def _children(value: Any) -> Iterable[tuple[str, Any]]:
    if isinstance(value, Mapping):
        return ((f"[{k!r}]", v) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return ((f"[{i}]", v) for i, v in enumerate(value))
    state = getattr(value, "__dict__", None)
    if isinstance(state, dict):
        return ((f".{k}", v) for k, v in state.items())
    return ()


def find_unpicklable(value: Any, path: str, depth: int = 0, seen: set | None = None) -> tuple[str, Any]:
    """The deepest attribute path under ``value`` that cannot be pickled, and that object."""
    import cloudpickle

    seen = set() if seen is None else seen
    if depth > 12 or id(value) in seen:
        return path, value
    seen.add(id(value))
    for suffix, child in _children(value):
        try:
            cloudpickle.dumps(child)
        except Exception:
            return find_unpicklable(child, path + suffix, depth + 1, seen)
    return path, value


def row_count(name: str, value: Any) -> int:
    """Rows of a shardable object, or a :class:`ShippingError` saying why it has none."""
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple):
        if len(shape) == 0:
            raise ShippingError(f"--shard {name}: a 0-d {type(value).__name__} has no rows to split")
        return int(shape[0])
    if isinstance(value, (list, tuple)):
        return len(value)
    raise ShippingError(f"--shard {name}: a {type(value).__name__} has no rows to split; shard "
                        "arrays, tensors, DataFrames or lists")


def split_rows(name: str, value: Any, world_size: int) -> list[Any]:
    """Contiguous, near-equal row blocks, one per rank (rank r gets rows r*n//w .. (r+1)*n//w)."""
    rows = row_count(name, value)
    if rows < world_size:
        raise ShippingError(f"--shard {name}: {rows} rows cannot be split over {world_size} ranks")
    bounds = [r * rows // world_size for r in range(world_size + 1)]
    parts = []
    for lo, hi in zip(bounds, bounds[1:]):
        if hasattr(value, "iloc"):
            part = value.iloc[lo:hi].copy()
        elif hasattr(value, "clone"):
            part = value[lo:hi].clone()  # a view would pickle the whole storage
        elif hasattr(value, "copy") and hasattr(value, "shape"):
            part = value[lo:hi].copy()
        else:
            part = value[lo:hi]
        parts.append(part)
    return parts


def check_same_rows(shards: Mapping[str, Any]) -> None:
    """Every ``--shard`` object must have the same number of rows (X and y line up)."""
    counts = {name: row_count(name, value) for name, value in shards.items()}
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{n} has {c}" for n, c in counts.items())
        raise ShippingError(f"--shard objects must have the same number of rows: {shown}")
