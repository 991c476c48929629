"""``%%distributed_fit`` options, checked before anything is sent (pure).

Example::

    >>> opts = FitOptions.build(sync="localsgd", every=4, shard="X,y")
    >>> opts.train.shard, opts.train.sync_params["every"]
    (('X', 'y'), 4)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...wire._options import (BACKENDS, DEFAULT_ALPHA, DEFAULT_BUCKET_MB, DEFAULT_CHECK_EVERY,
                                DEFAULT_EVERY, DEFAULT_OVERLAP, DEFAULT_SYNC, DEFAULT_UNEVEN,
                                OVERLAP, STRATEGIES, UNEVEN, TrainOptions)
from ..analysis._suggest import did_you_mean

__all__ = ["FitOptions", "FitUsageError", "TrainOptions", "STRATEGIES", "BACKENDS", "UNEVEN",
           "OVERLAP"]

_KEEP = "where each run's metric history is written (it is created if missing)"
_BOARD = "for TensorBoard to read, where each run writes its own folder (created if missing)"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


class FitUsageError(ValueError):
    """A request that cannot work as asked (a flag's value, a cell that is not Python); nothing
    was sent."""


def _names(text: str | None, flag: str) -> tuple[str, ...]:
    if not text:
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if not _IDENT.match(n)]
    if bad:
        raise FitUsageError(f"{flag} takes comma-separated variable names, got {', '.join(bad)}")
    return names


@dataclass(frozen=True)
class FitOptions:
    """Validated options of one run: what every rank acts on (:attr:`train`, sent to the
    engines as it is) and what only the kernel acts on."""

    train: TrainOptions = field(default_factory=TrainOptions)
    n: int | None = None
    backend: str = "auto"
    steps: int | None = None
    timeout: float | None = None
    collective_timeout: float = 60.0
    name: str | None = None
    widget: bool = True
    checkpoint_every: int | None = None
    checkpoint_dir: str | None = None
    resume: bool = False
    max_restarts: int = 0
    keep_history: str | None = None
    tensorboard: str | None = None     # write the run as TensorBoard event files there
    mlflow: str | None = None          # an MLflow tracking URI (a path: its file store)
    extra: dict = field(default_factory=dict)

    @classmethod
    def build(cls, *, n: int | None = None, sync: str = DEFAULT_SYNC, every: int = DEFAULT_EVERY,
              alpha: float = DEFAULT_ALPHA, backend: str = "auto", shard: str | None = None,
              returns: str | None = None, keep: str | None = None, seed: int | None = None,
              steps: int | None = None,
              timeout: float | None = None, collective_timeout: float = 60.0,
              name: str | None = None, widget: bool = True, checkpoint_every: int | None = None,
              checkpoint_dir: str | None = None,
              resume: bool = False, max_restarts: int = 0, uneven: str = DEFAULT_UNEVEN,
              keep_history: str | None = None, tensorboard: str | None = None,
              mlflow: str | None = None, profile: int | None = None,
              bucket_mb: float = DEFAULT_BUCKET_MB, overlap: str = DEFAULT_OVERLAP,
              check_every: int = DEFAULT_CHECK_EVERY) -> "FitOptions":
        """Check every flag and return the options, or raise :class:`FitUsageError`."""
        # A plain name may be a notebook class: the runner checks it against the notebook.
        if sync not in STRATEGIES and not (_IDENT.match(sync or "") or _DOTTED.match(sync or "")):
            raise FitUsageError(f"unknown --sync {sync!r}{_hint(sync, STRATEGIES)}: use one of "
                                f"{', '.join(STRATEGIES)}, the name of a SyncStrategy subclass "
                                "defined in the notebook, or the dotted name of an installed one "
                                "(pkg.mod.Class)")
        if backend not in BACKENDS:
            raise FitUsageError(f"unknown --backend {backend!r}{_hint(backend, BACKENDS)}: use one "
                                f"of {', '.join(BACKENDS)}")
        if uneven not in UNEVEN:
            raise FitUsageError(f"unknown --uneven {uneven!r}{_hint(uneven, UNEVEN)}: use join "
                                "(finished ranks answer the others with zero gradients) or error "
                                "(fail naming each rank's steps)")
        _positive_int(every, "--every")
        if not 0 < float(alpha) <= 1:
            raise FitUsageError(f"--alpha must be in (0, 1], got {alpha}")
        for value, flag in ((n, "-n"), (steps, "--steps")):
            if value is not None:
                _positive_int(value, flag)
        for seconds, flag in ((timeout, "--timeout"), (collective_timeout, "--collective-timeout")):
            if seconds is not None and float(seconds) <= 0:
                raise FitUsageError(f"{flag} must be a positive number of seconds, got {seconds}")
        _check_recovery(checkpoint_every, checkpoint_dir, resume, max_restarts)
        if profile is not None:
            _positive_int(profile, "--profile")
        if overlap not in OVERLAP:
            raise FitUsageError(f"unknown --overlap {overlap!r}{_hint(overlap, OVERLAP)}: use auto "
                                "(overlap where the ranks span several hosts), on or off")
        if not float(bucket_mb) > 0:
            raise FitUsageError(f"--bucket-mb must be a positive size in megabytes, got {bucket_mb} "
                                f"({DEFAULT_BUCKET_MB:g}, as in DDP, suits most models)")
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 0:
            raise FitUsageError(f"--check-every takes a whole number of steps >= 0 (0: check "
                                f"that the ranks agree only at the end), got {check_every!r}")
        train = TrainOptions(sync=sync, sync_params={"every": int(every), "alpha": float(alpha)},
                             seed=None if seed is None else int(seed),
                             shard=_names(shard, "--shard"), returns=_names(returns, "--return"),
                             keep=_names(keep, "--keep"),
                             uneven=uneven, profile=None if profile is None else int(profile),
                             bucket_mb=float(bucket_mb), overlap=overlap, check_every=check_every)
        return cls(train=train, n=None if n is None else int(n), backend=backend,
                   steps=None if steps is None else int(steps),
                   timeout=None if timeout is None else float(timeout),
                   collective_timeout=float(collective_timeout), name=name, widget=widget,
                   checkpoint_every=None if checkpoint_every is None else int(checkpoint_every),
                   checkpoint_dir=checkpoint_dir or None, resume=bool(resume),
                   max_restarts=int(max_restarts),
                   keep_history=_directory(keep_history, "--keep-history", _KEEP),
                   tensorboard=_directory(tensorboard, "--tensorboard", _BOARD),
                   mlflow=mlflow or None)

    @property
    def checkpointed(self) -> bool:
        """Whether the run commits its state (and so can resume and resize)."""
        return bool(self.checkpoint_every or self.resume)


def _check_recovery(every: int | None, directory: str | None, resume: bool,
                    max_restarts: object) -> None:
    if every is not None:
        _positive_int(every, "--checkpoint-every")
    if directory and every is None and not resume:
        raise FitUsageError("--checkpoint-dir needs --checkpoint-every K (how often to commit) "
                            "or --resume (to continue from the directory)")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise FitUsageError(f"--max-restarts must be a whole number of at least 0, got {max_restarts!r}")


def _directory(directory: str | None, flag: str, purpose: str) -> str | None:
    """A directory flag's value: an existing directory, or one that can be made, never a file."""
    import os

    if not directory:
        return None
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise FitUsageError(f"{flag} {directory!r} is a file: give a directory {purpose}")
    return os.path.abspath(directory)


def _hint(value: str, choices: tuple[str, ...]) -> str:
    """``" (did you mean 'gloo'?)"``, said before the list of choices; nothing when none is close."""
    hint = did_you_mean(str(value), choices)
    return f" ({hint})" if hint else ""


def _positive_int(value: object, flag: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FitUsageError(f"{flag} must be a whole number of at least 1, got {value!r}")
