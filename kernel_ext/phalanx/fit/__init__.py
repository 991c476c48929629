"""Kernel side of ``%%distributed_fit``: options, shipping, dispatch, tracking, records."""

from ._checkpoints import CheckpointWarning
from ._errors import DistributedFitError, VersionSkewError
from ._history import MetricHistory
from ._options import FitOptions, FitUsageError
from ._record import RunRecord
from ._run import FitRunner
from ._shipping import ShippingError, ShippingWarning
from ._tracker import MetricWarning

__all__ = ["FitOptions", "FitRunner", "FitUsageError", "RunRecord", "MetricHistory",
           "DistributedFitError", "VersionSkewError", "ShippingError", "ShippingWarning",
           "MetricWarning", "CheckpointWarning"]
