"""What is needed to reproduce a run, and the version preflight (kernel and engines must agree)."""

from __future__ import annotations

import platform
from typing import Any

from ..run._errors import VersionSkewError

# Packages whose versions must match between kernel and engines: pickled objects and collectives
# cross the boundary, and a mismatch fails in confusing ways deep inside a run.
CHECKED = ("python", "torch", "cloudpickle", "numpy")
REPORTED = CHECKED + ("phalanx", "scikit-learn", "ipyparallel")


def engine_versions() -> dict:
    """Versions of the packages that matter, as seen by the calling process (runs on engines)."""
    import importlib.metadata as md
    import platform as pf
    import socket

    out: dict[str, str | None] = {"python": pf.python_version(), "host": socket.gethostname()}
    for package in ("torch", "cloudpickle", "numpy", "phalanx", "scikit-learn", "ipyparallel"):
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            out[package] = None
    if out["phalanx"] is None:
        from ..._version import __version__

        out["phalanx"] = __version__
    return out


def check_versions(per_engine: list[dict], slots: list, mine: dict | None = None) -> None:
    """Refuse to run when an engine's python/torch/cloudpickle/numpy differs from the kernel's."""
    mine = mine or engine_versions()
    lines = []
    for rank, versions in enumerate(per_engine):
        diffs = [f"{p} {versions.get(p)} (kernel {mine.get(p)})" for p in CHECKED
                 if versions.get(p) != mine.get(p)]
        if diffs:
            lines.append(f"  rank {rank} on {slots[rank].host}: " + ", ".join(diffs))
    if lines:
        raise VersionSkewError("the engines run other versions than this kernel, so objects and "
                               "collectives would not line up:\n" + "\n".join(lines) +
                               "\nInstall the same versions on every host and restart the engines.")


def build_manifest(opts: Any, slots: list, backend: str, prepared: Any, versions: list[dict],
                   record: Any) -> dict:
    """A JSON-able description of the run, stored with the cell output."""
    return {
        "kernel": {"python": platform.python_version()},
        "world_size": len(slots),
        "devices": [s.device or "cpu" for s in slots],
        "hosts": [s.host for s in slots],
        "backend": backend,
        "strategy": {"name": opts.train.sync, **opts.train.sync_params,
                     # a notebook class: its content hash is under "data" with the other names
                     "notebook": getattr(prepared, "strategy", None)},
        "seed": opts.train.seed,
        "steps": {str(r): s for r, s in record.steps.items()},
        "data": prepared.data_manifest,
        "engines": [{k: v.get(k) for k in REPORTED} for v in versions],
        "final_metrics": {str(r): m for r, m in record.final_metrics().items()},
        "status": record.status,
        "memory_peak_mb": {str(r): m for r, m in record.memory.items()},
        "time_s": {str(r): t for r, t in record.timing.items()},
    }
