"""Merge rules: the :class:`_Rule` base and the rules that average, warn, keep per rank or
have nothing to merge (the exact ones live in :mod:`._naive_bayes` and :mod:`._scalers`)."""

from __future__ import annotations

from typing import Any

from ._fitted import _BOOKKEEPING, _SGD_AVERAGE, _float_arrays, _unique


class _Rule:
    """How one estimator is merged across ranks (one object per estimator and run).

    ``before`` runs ahead of the rank's own ``partial_fit`` (exact rules set the accumulators
    aside so the call learns this batch only), ``restore`` undoes it when the call raises,
    ``merge`` pools with the other ranks (collectives), ``averaged`` lists the arrays the sync
    strategy averages.  ``rebase`` (first call of an estimator fitted before): every rank starts
    from rank 0's state, as torch parameters do.
    """

    kind = "averaged"
    check_every_call = False  # the arrays' shapes may change between calls: agree every time

    def __init__(self, estimator: Any) -> None:
        self.cls_name = type(estimator).__name__

    def before(self, est: Any, args: tuple, kwargs: dict) -> None:
        """Called before the rank's own ``partial_fit``."""

    def restore(self, est: Any) -> None:
        """The rank's ``partial_fit`` raised: put back what ``before`` set aside."""

    def merge(self, est: Any, comm: Any, rebase: bool) -> None:
        """Pool this call's learning with the other ranks (collective)."""

    def averaged(self, est: Any) -> list[Any]:
        return []

    def signature(self, est: Any) -> str:
        return ",".join(f"{a.dtype}{a.shape}" for a in self.averaged(est))

    def warnings(self) -> list[str]:
        return []


class _Averaged(_Rule):
    """Gradient-trained estimators: float fitted arrays through the sync strategy."""

    def averaged(self, est: Any) -> list[Any]:
        return _float_arrays(est)


class _SGDAveraged(_Averaged):
    """SGD estimators; with ``average`` the iterate and running average too, or each rank would
    keep training its own iterate under an averaged ``coef_``."""

    def averaged(self, est: Any) -> list[Any]:
        import numpy as np

        extra = []
        if getattr(est, "average", False):
            extra = [getattr(est, name) for name in _SGD_AVERAGE
                     if isinstance(getattr(est, name, None), np.ndarray)]
        return _unique(extra + _float_arrays(est))


class _RBMAveraged(_Averaged):
    def averaged(self, est: Any) -> list[Any]:
        return _float_arrays(est, _BOOKKEEPING | {"h_samples_"})  # the rank's own Gibbs chain


class _Warned(_Averaged):
    """No exact merge known: average float fitted arrays by name, and say so."""

    kind = "warned"
    check_every_call = True

    def __init__(self, estimator: Any, reason: str = "", attrs: str = "") -> None:
        super().__init__(estimator)
        self.reason = reason or ("phalanx knows no exact way to merge its state across ranks, "
                                 "so the average need not be the model one process would learn")
        self.attrs = attrs or "every float fitted array attribute (public, name ending in '_')"

    def warnings(self) -> list[str]:
        return [f"{self.cls_name}.partial_fit on several ranks: phalanx averages "
                f"{self.attrs} across ranks by name after every partial_fit; {self.reason}.  "
                f"For a correct model fit it on one rank (`if rank == 0: ...`, and --return it "
                f"from there) or run with --sync none and combine the per-rank models yourself."]


class _Local(_Rule):
    """State that cannot be lined up across ranks: each rank keeps its own, and says so."""

    kind = "local"

    def __init__(self, estimator: Any, why: str = "") -> None:
        super().__init__(estimator)
        self.why = why

    def warnings(self) -> list[str]:
        return [f"{self.cls_name}.partial_fit on several ranks: {self.why}, so phalanx cannot "
                f"merge it: each rank keeps its own model and rank 0's is the one --return "
                f"brings back.  Fit it on one rank (`if rank == 0: ...`) or combine the "
                f"per-rank models yourself."]


class _Stateless(_Rule):
    kind = "stateless"
