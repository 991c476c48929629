"""The divergence guard: what must be identical across ranks is checked to be, as the run goes.

Data-parallel training promises one model: after every step (``--sync allreduce``) or after the
strategy's ``finish`` (``localsgd``, ``easgd``) every rank holds the same parameters.  Code can
break that promise without an error: an update that depends on ``rank``, per-rank randomness in
an update, a parameter phalanx never saw train.  The run would end and bring back rank 0's
model as if it were the one model.  So the promise is checked where it is made:

* at the end of every run, after the strategy's ``finish``;
* every ``--check-every`` optimizer steps (default 100) where the strategy promises agreement
  after every step.

A check is a fingerprint (:func:`fingerprints`) of each trained tensor (the float64 sum of its values and of their
absolute values), compared across ranks in one allreduce of two numbers per tensor.  Where
they differ, one broadcast of the first such tensor measures by how much, and every rank raises
a :class:`DivergenceError` that names the tensor (``model.fc.weight``), the largest difference,
and the likely causes.  Strategies that keep ranks apart on purpose (``none``, or a user
strategy with ``agreement = "never"``) are not checked; see ``SyncStrategy.agreement``.

Example (threads as ranks; rank 1 edits its copy)::

    >>> import threading, numpy as np
    >>> from phalanx.runtime.transport._comm import make_thread_communicators
    >>> comms, errors = make_thread_communicators(2), []
    >>> def rank(comm):
    ...     w = np.arange(4.0) + (comm.rank == 1) * np.array([0, 0, 0.5, 0])
    ...     try:
    ...         check_agreement(comm, [w], "at the end of the run", lambda: {id(w): "w"})
    ...     except DivergenceError as exc:
    ...         errors.append(str(exc).split(": ", 1)[1][:48])
    >>> ts = [threading.Thread(target=rank, args=(c,)) for c in comms]
    >>> for t in ts: t.start()
    >>> for t in ts: t.join()
    >>> errors
    ['w (shape (4,)) differs across ranks by up to 0.5', 'w (shape (4,)) differs across ranks by up to 0.5']
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from ._join import KIND_CHECK

if TYPE_CHECKING:
    from ..run._engine_state import RunContext
    from ._strategies import Param

CHECK_EVERY = 100  # optimizer steps between checks (``--check-every``; 0: only at the end)


class DivergenceError(RuntimeError):
    """Ranks that must hold one model hold different ones."""


class Reduces(Protocol):
    """What a check needs of a communicator (a transport's, or the run's collectives)."""

    world_size: int

    def allreduce(self, arrays: list, op: str = "sum") -> None: ...

    def broadcast(self, arrays: list, src: int = 0) -> None: ...


def check_agreement(comm: Reduces, values: Sequence[Param], when: str,
                    labels: Callable[[], dict[int, str]] = dict) -> None:
    """Raise :class:`DivergenceError` on every rank if any of ``values`` (tensors or arrays)
    differs across the ranks of ``comm`` (one allreduce while they agree); ``labels()`` names
    them, ``{id(value): "model.fc.weight"}`` (asked only then)."""
    if comm.world_size == 1 or not values:
        return
    differ = differing(comm, values)
    if differ:
        names = labels()
        label_of = [names.get(id(v)) or _unnamed(v) for v in values]
        label, value = label_of[differ[0]], values[differ[0]]
        gap = _largest_difference(comm, value)
        others = [label_of[i] for i in differ[1:4]]
        more = f" (and {', '.join(others)}{' ...' if len(differ) > 4 else ''})" if others else ""
        raise DivergenceError(
            f"the ranks no longer hold one model {when}: {label}{_shape(value)} differs across "
            f"ranks by up to {gap:.3g}{more}. Everything the strategy "
            "keeps identical should be; something in the cell changed it differently on each "
            "rank: an update that depends on `rank`, randomness that differs per rank inside "
            "an update, data only one rank has, or a parameter updated outside backward() and "
            "step(). Nothing was returned. A strategy that keeps ranks apart on purpose says so "
            "with agreement = 'never' (see SyncStrategy).")


def check_run_agreement(run: RunContext, when: str) -> None:
    """The run's check: every rank calls it at the same point (see the module docstring)."""
    if run.agreement == "never" or run.world_size == 1:
        return
    assert run.collectives is not None   # set as the run starts
    check_agreement(run.collectives, trained_values(run), when,
                    lambda: labels_in(run.namespace))


def check_every_steps(run: RunContext) -> None:
    """After an optimizer step: the periodic check, where the strategy promises agreement after
    every step.  A control round first, so ranks that ran out of data (uneven inputs, which
    still answer rounds) take part; while some have, the check waits for the end of the run."""
    every = run.train.check_every
    if run.agreement != "always" or not every or run.steps % every:
        return
    if run.world_size == 1 or run.join is None:
        return
    info = run.join.round(KIND_CHECK, run.steps, run.steps)
    if not info.uneven:
        check_run_agreement(run, f"after step {run.steps}")


def trained_values(run: RunContext) -> list[Param]:
    """What the run keeps identical across ranks: the parameters whose gradients it averages
    or whose optimizer or estimator its strategy syncs, the buffers it gives every rank from
    rank 0, and every trainable tensor it gave rank 0's values (one that trained in passes the
    training watch did not look at would differ: said, not returned)."""
    values: dict[int, Param] = {}
    if run.watch is not None:
        for t in run.watch.trainable_synced():
            values.setdefault(id(t), t)
    if run.grad_sync is not None:
        for p in run.grad_sync.trained_params():
            values.setdefault(id(p), p)
        for b in run.grad_sync.synced_buffers():
            values.setdefault(id(b), b)
    for _strategy, params_fn in run.tracked:
        for p in params_fn():
            values.setdefault(id(p), p)
    return list(values.values())


def labels_in(namespace: dict) -> dict[int, str]:
    """``id(tensor or array) -> "model.fc.weight"`` for what the namespace holds: tensors,
    modules' parameters and buffers, estimators' arrays, one level into dicts and lists."""
    labels: dict[int, str] = {}
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        _label(labels, name, value)
        if isinstance(value, dict):
            for key, item in list(value.items())[:100]:
                _label(labels, f"{name}[{key!r}]", item)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value[:100]):
                _label(labels, f"{name}[{i}]", item)
    return labels


def _label(labels: dict[int, str], name: str, value: object) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        labels.setdefault(id(value), name)
    elif torch is not None and isinstance(value, torch.nn.Module):
        for pname, p in value.named_parameters():
            labels.setdefault(id(p), f"{name}.{pname}")
        for bname, b in value.named_buffers():
            labels.setdefault(id(b), f"{name}.{bname}")
    elif hasattr(value, "get_params") and not isinstance(value, type):  # an estimator
        for attr, item in list(vars(value).items()):
            if isinstance(item, np.ndarray):
                labels.setdefault(id(item), f"{name}.{attr}")


def _unnamed(value: object) -> str:
    return f"a {type(value).__name__} of shape {tuple(getattr(value, 'shape', ()))}"


def differing(comm: Reduces, values: Sequence[Param]) -> list[int]:
    """The indices of ``values`` that are not the same on every rank (one allreduce of the
    highest and lowest fingerprint over ranks)."""
    prints = fingerprints(values)
    both = np.concatenate([prints, -prints])
    comm.allreduce([both], op="max")
    high, low = both[:len(prints)].reshape(-1, 2), -both[len(prints):].reshape(-1, 2)
    return [int(i) for i in np.flatnonzero(~same_prints(high, low))]


def fingerprints(values: Sequence[Any]) -> np.ndarray:
    """Two float64 numbers per value that move when any of its elements does: the sum and the
    sum of magnitudes, ``[sum_0, abs_0, sum_1, abs_1, ...]``.  Tensors of one device are
    reduced there and read back once (one device sync, not two per tensor)."""
    torch = sys.modules.get("torch")
    out = np.zeros(2 * len(values))
    on_device: dict[Any, list[int]] = {}
    for i, value in enumerate(values):
        if torch is not None and isinstance(value, torch.Tensor):
            small = _small_cpu_array(torch, value)
            if small is not None:  # numpy's two sums: half the time of torch's two calls
                out[2 * i:2 * i + 2] = (small.sum(dtype=np.float64),
                                        np.abs(small).sum(dtype=np.float64))
            else:
                on_device.setdefault(value.device, []).append(i)
        else:
            array = np.asarray(value, dtype=np.float64)
            out[2 * i:2 * i + 2] = (array.sum(), np.abs(array).sum())
    for indices in on_device.values():
        assert torch is not None  # only tensors are grouped by device
        with torch.no_grad():
            sums = []
            for i in indices:
                flat = values[i].detach()
                if flat.is_complex() or not flat.is_floating_point():
                    flat = flat.to(torch.float64)
                sums.append(torch.sum(flat, dtype=torch.float64))
                sums.append(torch.linalg.vector_norm(flat, 1, dtype=torch.float64))
            read = torch.stack(sums).cpu().numpy()
        for k, i in enumerate(indices):
            out[2 * i:2 * i + 2] = read[2 * k:2 * k + 2]
    return out


# A CPU tensor up to this size is fingerprinted through numpy: torch's per-call overhead is most
# of a small tensor's time (6 parameters of an MLP: 82 us vs 168 us), while a large one would pay
# numpy's temporary copy for the magnitudes.  Every rank takes the same path for a tensor.
_NUMPY_MAX_ELEMENTS = 1 << 16


def _small_cpu_array(torch: Any, value: Any) -> np.ndarray | None:
    """``value`` as a numpy array (no copy) when it is a small dense CPU float tensor."""
    if (value.device.type != "cpu" or value.numel() > _NUMPY_MAX_ELEMENTS
            or value.dtype not in (torch.float32, torch.float64, torch.float16)):
        return None
    try:
        return value.detach().numpy()
    except (RuntimeError, TypeError):  # a sparse or otherwise special tensor: torch's path
        return None


def same_prints(high: np.ndarray, low: np.ndarray) -> np.ndarray:
    """Per row (one value's fingerprint), whether the highest and lowest over ranks agree (NaN
    on every rank agrees too).  All rows at once: a model's hundreds of parameters took a few
    numpy calls each, 5 ms a check for 160 tensors (measured)."""
    nan_high, nan_low = np.isnan(high), np.isnan(low)
    any_nan = nan_high.any(axis=1) | nan_low.any(axis=1)
    all_nan = nan_high.all(axis=1) & nan_low.all(axis=1)
    with np.errstate(invalid="ignore"):  # inf - inf: a NaN gap, which never agrees
        scale = np.abs(high).max(axis=1) + np.abs(low).max(axis=1)
        close = np.abs(high - low).max(axis=1) <= 1e-9 * scale + 1e-300
    return np.where(any_nan, all_nan, close)


def _largest_difference(comm: Reduces, value: Param) -> float:
    """max |x - rank 0's x| over ranks and elements (one broadcast, one allreduce)."""
    mine = np.array(_as_numpy(value), dtype=np.float64, copy=True)
    theirs = mine.copy()
    comm.broadcast([theirs], src=0)
    gap = np.array([float(np.nanmax(np.abs(mine - theirs))) if mine.size else 0.0])
    comm.allreduce([gap], op="max")
    return float(gap[0])


def _as_numpy(value: Param) -> Param:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float64).numpy()
    return value


def _shape(value: object) -> str:
    shape = tuple(getattr(value, "shape", ()))
    return f" (shape {shape})" if shape else ""
