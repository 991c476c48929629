"""Data-parallel ``partial_fit``: every rank ends a call with the same scikit-learn model.

While a ``%%distributed_fit`` cell runs, each ``partial_fit`` of an estimator (shipped from the
notebook or built inside the cell) learns from the rank's own batch, then merges with the other
ranks.  The merge rule depends on the estimator's class and is chosen at its first ``partial_fit``
(the same choice on every rank):

* **exact** (``MultinomialNB``, ``BernoulliNB``, ``ComplementNB``, ``CategoricalNB``,
  ``GaussianNB``, ``StandardScaler``, ``MinMaxScaler``, ``MaxAbsScaler``): what the ranks learned
  since the last merge is pooled (counts summed, means and variances combined by counts, minima
  and maxima reduced) and the derived attributes are recomputed with scikit-learn's own helpers,
  so every rank holds what one process learns from the union of the batches;
* **averaged** (``SGD*``, ``Perceptron``, ``PassiveAggressive*``, ``MLP*``, ``BernoulliRBM``):
  the float fitted arrays go through the run's sync strategy like torch parameters
  (``--sync``/``--every``/``--alpha`` keep their meaning); bookkeeping such as ``t_`` or
  ``n_iter_`` stays per rank;
* **composite** (``OneVsRestClassifier``, ``MultiOutput*``, ``SelectFromModel``): the outer
  call alone synchronises, and each fitted inner estimator is merged by its own rule;
* anything else (``MiniBatchKMeans``, ``IncrementalPCA``, unknown estimators): its float fitted
  arrays are averaged by name and an :class:`EstimatorAveragingWarning` says why that may not be
  the model one process would learn, and what to do instead; where nothing can be lined up
  across ranks (``Birch``, ``OneVsOneClassifier``) each rank keeps its own model, with the same
  warning.

``--sync none`` turns all of it off (ranks train independently).  scikit-learn's own ``fit``
stays per rank, even where it calls ``partial_fit`` inside (``StandardScaler.fit``).  Exact
merges count each rank's batch as its own samples, as sharding intends: ranks fed the same rows
count them once per rank.  An estimator already fitted at its first ``partial_fit`` here starts
from rank 0's state on every rank, as torch parameters do.

How: while a run is active, every class with ``partial_fit`` (scikit-learn's, loaded or defined
during the run, and the classes of estimators handed over) carries a :class:`_Patched` descriptor
for ``partial_fit``/``fit``.  Nothing goes into the instances, so estimators pickle, deep-copy
and ``--return`` as plain scikit-learn objects.  The classes are restored when the run ends.

Layout: :mod:`._fitted` (what an estimator learned); the merge rules in :mod:`phalanx.runtime.adapters.sklearn._merge_rules`,
:mod:`._naive_bayes`, :mod:`._scalers` (helpers in :mod:`._pooling`) and :mod:`._choose` (which
rule, meta-estimators); :mod:`._estimator_sync` (one estimator in one run); :mod:`._patch`,
:mod:`._hook` and :mod:`._install` (routing the calls while runs are active).

Example (inside ``%%distributed_fit --shard X,y``)::

    nb = MultinomialNB()
    for i in range(0, len(X), 100):
        nb.partial_fit(X[i:i + 100], y[i:i + 100], classes=np.arange(10))
    # every rank's nb is the model one process learns from all of X
"""

from typing import Any

from .. import Adapter
from ._choose import merge_rule
from ._estimator_sync import EstimatorAveragingWarning, EstimatorSyncError
from ._fitted import fitted_state, is_incremental_estimator
from ._install import install_estimator_sync, patch_namespace_estimators, patch_partial_fit
from ._patch import _Patched as _Patched

__all__ = ["EstimatorAveragingWarning", "EstimatorSyncError", "fitted_state", "merge_rule",
           "is_incremental_estimator", "patch_partial_fit", "patch_namespace_estimators",
           "install_estimator_sync"]




def _install(run: Any, namespace: dict, shard: Any) -> None:
    # its undo is in run.patches already (install_estimator_sync writes it there)
    install_estimator_sync(run)
    patch_namespace_estimators(run, namespace)


def _wrap(obj: Any, run: Any) -> Any:
    """``wrap(estimator)``: its ``partial_fit`` averaged across ranks (None for other objects)."""
    return patch_partial_fit(obj, run) if is_incremental_estimator(obj) else None


ADAPTER = Adapter("scikit-learn", "scikit-learn's partial_fit", _install, wrap=_wrap)
