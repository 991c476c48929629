"""The learned state of a scikit-learn estimator: its fitted attributes, as the merge rules
and :func:`fitted_state` see them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:
    import numpy as np


def is_incremental_estimator(obj: Any) -> bool:
    """Whether ``obj`` is an estimator instance with ``partial_fit``."""
    return hasattr(obj, "partial_fit") and hasattr(obj, "get_params") and not isinstance(obj, type)


def _fitted_items(estimator: Any) -> Iterator[tuple[str, Any]]:
    """Fitted attributes by scikit-learn's convention (public names ending in ``_``), sorted,
    lists and tuples expanded as ``name[i]``."""
    try:
        attrs = vars(estimator)
    except TypeError:  # __slots__: no instance dict, nothing fitted by the convention
        return
    for name in sorted(attrs):
        if not name.endswith("_") or name.startswith("_"):
            continue
        value = attrs[name]
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                yield f"{name}[{i}]", item
        else:
            yield name, value


def _numeric(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        return value if value.dtype.kind in "iufc" else None
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, float, np.number)):
        return np.asarray(value)
    return None


def fitted_state(estimator: Any) -> list[tuple[str, np.ndarray]]:
    """The learned state of ``estimator``: numeric fitted attributes as ``(name, array)``.

    Names are sorted; lists such as ``coefs_`` appear as ``coefs_[0]``, ``coefs_[1]``...
    Arrays are the estimator's own (changing one changes the estimator); scalars come as 0-d
    copies.  Estimators in the same state give the same structure on every rank.

    Example::

        >>> from sklearn.naive_bayes import MultinomialNB
        >>> nb = MultinomialNB().partial_fit([[1, 0], [0, 2]], [0, 1], classes=[0, 1])
        >>> [name for name, _ in fitted_state(nb)][:3]
        ['class_count_', 'class_log_prior_', 'classes_']
    """
    out = []
    for label, value in _fitted_items(estimator):
        array = _numeric(value)
        if array is not None:
            out.append((label, array))
    return out


# Float fitted arrays that are per-rank bookkeeping, never averaged.
_BOOKKEEPING = frozenset({
    "t_", "n_iter_", "n_features_in_", "classes_", "loss_", "loss_curve_", "best_loss_",
    "validation_scores_", "best_validation_score_", "n_layers_", "n_outputs_", "n_samples_seen_",
    "h_samples_", "n_steps_", "n_batch_iter_"})
# SGD with ``average``: the iterate and the running average live in private arrays.
_SGD_AVERAGE = ("_average_coef", "_average_intercept", "_standard_coef", "_standard_intercept")


def _unique(arrays: Sequence[Any]) -> list[Any]:
    """Drop arrays viewing memory already listed (``coef_`` is often a view of another one):
    a strategy must see each parameter once."""
    from ...transport._shm_layout import distinct

    return distinct(list(arrays))


def _float_arrays(estimator: Any, exclude: frozenset = _BOOKKEEPING) -> list[Any]:
    import numpy as np

    return _unique([value for label, value in _fitted_items(estimator)
                    if label.split("[", 1)[0] not in exclude and isinstance(value, np.ndarray)
                    and value.dtype.kind == "f" and value.size])


def _is_fitted(estimator: Any) -> bool:
    probe = getattr(estimator, "__sklearn_is_fitted__", None)
    if probe is not None:
        return bool(probe())
    return any(True for _ in _fitted_items(estimator))
