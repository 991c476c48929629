"""How the ranks train: the one option bag the kernel fills and the engines keep (pure).

``%%distributed_fit``'s flags split in two.  What only the kernel acts on (how many ranks, the
timeouts, checkpoints, the view) stays in the kernel's ``FitOptions``.  What every rank acts on
is a :class:`TrainOptions`: built and checked once in the kernel, sent inside each rank's
``RunSpec`` and kept by the rank's ``RunContext`` as it arrived, so no field is copied from bag to
bag on the way.  Each default and each list of choices is written here and nowhere else.

A sync strategy's parameters travel as one open mapping (:attr:`TrainOptions.sync_params`,
given to the strategy as keyword arguments): a strategy that takes a new parameter needs the
flag that sets it and its own ``__init__``, not a field in every layer in between.

Example::

    >>> opts = TrainOptions(sync="easgd", sync_params={"every": 4, "alpha": 0.3})
    >>> opts.bucket_bytes, opts.mode
    (26214400, 'replicated')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

STRATEGIES = ("allreduce", "localsgd", "easgd", "none")
BACKENDS = ("auto", "nccl", "gloo", "mpi")
UNEVEN = ("join", "error")      # ranks that run out of data early: answer the others, or fail
OVERLAP = ("auto", "on", "off")  # gradient buckets averaged while backward runs (auto: across hosts)
FIT_MODES = ("replicated", "sharded")  # how a model lives across the ranks (see _fit_mode)

DEFAULT_SYNC = "allreduce"
DEFAULT_EVERY = 1               # --every: steps between a strategy's synchronisations
DEFAULT_ALPHA = 0.5             # --alpha: EASGD's moving rate
DEFAULT_BUCKET_MB = 25.0        # --bucket-mb: DistributedDataParallel's bucket_cap_mb
DEFAULT_CHECK_EVERY = 100       # --check-every: steps between checks that the ranks agree
DEFAULT_UNEVEN = "join"
DEFAULT_OVERLAP = "auto"
DEFAULT_MODE = "replicated"


def default_sync_params() -> dict[str, Any]:
    """The parameters every built-in strategy takes, at their defaults."""
    return {"every": DEFAULT_EVERY, "alpha": DEFAULT_ALPHA}


@dataclass(frozen=True)
class TrainOptions:
    """What every rank of a run acts on."""

    sync: str = DEFAULT_SYNC              # a strategy's name: built in, dotted, or a notebook class
    sync_params: Mapping[str, Any] = field(default_factory=default_sync_params)
    seed: int | None = None
    shard: tuple[str, ...] = ()           # names split by rows (--shard)
    returns: tuple[str, ...] = ()         # names rank 0 sends back (--return)
    keep: tuple[str, ...] = ()            # names left live on the engines after the run (--keep)
    uneven: str = DEFAULT_UNEVEN          # what ranks that run out of rows early do
    profile: int | None = None            # record this many optimizer steps (--profile)
    bucket_mb: float = DEFAULT_BUCKET_MB  # gradient bucket size
    overlap: str = DEFAULT_OVERLAP        # average full buckets while backward runs
    check_every: int = DEFAULT_CHECK_EVERY  # steps between agreement checks (0: at the end)
    mode: str = DEFAULT_MODE              # the fit mode (see _fit_mode)

    @property
    def bucket_bytes(self) -> int:
        return max(1, int(self.bucket_mb * 2**20))
