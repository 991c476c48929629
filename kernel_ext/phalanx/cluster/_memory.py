"""Engine memory for the cluster table between runs, asked of the engines that need asking.

The kernel reads the RSS of engines on its own host itself (psutil).  Engines on other hosts, and
CUDA allocator figures (which only the engine's own process can read), need a round trip: only
those engines are asked, with a short deadline, and an engine that does not answer in time keeps
the figures the kernel had.  The engine never initialises CUDA to answer (see
``runtime/telemetry/_memory.py``).
"""

from __future__ import annotations

import time
from typing import Any

from ._engine_views import engine_view

ASK_TIMEOUT_S = 2.0
_CUDA_KEYS = ("cuda_allocated_mb", "cuda_reserved_mb", "cuda_peak_mb")


def needs_asking(row: dict) -> bool:
    """A row whose figures the kernel cannot read itself: a GPU engine or a remote one."""
    return row.get("state") == "idle" and row.get("engine_id", -1) >= 0 and (
        (row.get("device") or "cpu") != "cpu" or row.get("memory_mb") is None)


def fill_engine_memory(client: Any, rows: list[dict], timeout: float = ASK_TIMEOUT_S) -> list[dict]:
    """Add the engines' own memory figures to ``rows`` (cluster status rows), in place."""
    from ..runtime import memory_sample

    asked = [row for row in rows if needs_asking(row)]
    if client is None or not asked:
        return rows
    pending = {}
    for row in asked:
        try:
            pending[id(row)] = (row, engine_view(client, row["engine_id"]).apply_async(memory_sample))
        except Exception:
            continue
    deadline = time.monotonic() + timeout
    for row, result in pending.values():
        try:
            sample = result.get(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:
            continue  # busy, gone or slow: keep what the kernel had
        if sample.get("rss_mb") is not None:
            row["memory_mb"] = sample["rss_mb"]
        row.update({k: sample[k] for k in _CUDA_KEYS if k in sample})
    return rows


def add_engine_figures(rows: list[dict], samples: dict[int, dict]) -> list[dict]:
    """What only an engine knows (its GPU memory) from its last sample into ``rows``; the RSS
    read here stays where there is one (it is newer)."""
    for row in rows:
        sample = samples.get(row.get("rank", -1))
        if sample:
            row.update({k: sample[k] for k in _CUDA_KEYS if k in sample})
            if row.get("memory_mb") is None:
                row["memory_mb"] = sample.get("rss_mb")
    return rows


def merge_samples(rows: list[dict], samples: dict[int, dict]) -> list[dict]:
    """The engines' latest samples of a run going (``RunMemory.latest()``) into ``rows``."""
    for row in rows:
        sample = samples.get(row.get("rank", -1))
        if sample:
            row["memory_mb"] = sample.get("rss_mb", row.get("memory_mb"))
    return add_engine_figures(rows, samples)
