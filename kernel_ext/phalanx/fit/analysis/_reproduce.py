"""Re-running a saved notebook: warn when a cell now runs on another world size than the one
recorded in its saved output's manifest.

Jupyter tells the kernel which notebook it serves (``__session__`` in the user namespace); the
manifest saved with each ``%%distributed_fit`` output carries a hash of the cell's source, which is
how a re-run finds the record of its own previous run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from ._cell_warning import warn_at_cell


class ReproducibilityWarning(UserWarning):
    """This run will likely not reproduce the saved results."""


def cell_hash(body: str) -> str:
    """A short hash of a cell's source, stored in its manifest."""
    return hashlib.sha256(body.strip().encode()).hexdigest()[:16]


def saved_manifest(notebook: str | Path | None, digest: str) -> dict | None:
    """The manifest last saved in ``notebook`` for the cell with source hash ``digest``."""
    if not notebook or not str(notebook).endswith(".ipynb"):
        return None
    try:
        nb = json.loads(Path(notebook).read_text())
    except (OSError, ValueError):
        return None
    found = None
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []):
            manifest = output.get("metadata", {}).get("phalanx", {}).get("manifest")
            if isinstance(manifest, dict) and manifest.get("cell") == digest:
                found = manifest
    return found


def warn_if_world_differs(body: str, user_ns: Mapping[str, Any], world_size: int) -> None:
    """Warn (before the run) when the saved run of this cell used another number of ranks."""
    saved = saved_manifest(user_ns.get("__session__"), cell_hash(body))
    if saved is None or saved.get("world_size") == world_size:
        return
    warn_at_cell(
        f"this cell's saved results come from {saved.get('world_size')} rank(s); it now runs on "
        f"{world_size}, so results may differ: each rank gets other rows of the sharded data, "
        "the effective batch changes and floating-point sums are taken in another order. Scale "
        f"the cluster to {saved.get('world_size')} (%cluster scale {saved.get('world_size')}) to "
        "reproduce them.", ReproducibilityWarning)
