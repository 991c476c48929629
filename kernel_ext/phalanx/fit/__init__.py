"""Kernel side of ``%%distributed_fit``, in rooms by concern: :mod:`.run` (one run from the
kernel), :mod:`.analysis` (what a cell needs, read from its code), :mod:`.telemetry` (what the
ranks report, kept and condensed), :mod:`.exports` (TensorBoard, MLflow) and :mod:`.debug`
(looking into a rank).  Views read telemetry through :mod:`.telemetry`'s public names."""

from .run._checkpoints import CheckpointWarning
from .run._errors import DistributedFitError, VersionSkewError
from .telemetry._history import MetricHistory
from .run._fit_options import FitOptions, FitUsageError
from .telemetry._record import RunRecord
from .run._run import FitRunner
from .analysis._shipping import ShippingError, ShippingWarning
from .telemetry._tracker import MetricWarning

__all__ = ["FitOptions", "FitRunner", "FitUsageError", "RunRecord", "MetricHistory",
           "DistributedFitError", "VersionSkewError", "ShippingError", "ShippingWarning",
           "MetricWarning", "CheckpointWarning"]
