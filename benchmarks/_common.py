"""Shared helpers for the benchmarks: timing, machine description, results files.

Every figure is a ratio against a baseline measured in the same run on the same machine; the
absolute numbers are kept beside it for context.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ROOT = HERE.parent

# Benchmarks run where the package may not be installed (a plain checkout): find it there.
if str(ROOT / "kernel_ext") not in sys.path:
    sys.path.insert(0, str(ROOT / "kernel_ext"))


def engine_env() -> None:
    """Engines inherit the environment: let them import phalanx and these benchmark modules."""
    paths = [str(ROOT / "kernel_ext"), str(HERE), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)


def stats(samples: list[float]) -> dict[str, Any]:
    """Median, min, max and the raw samples."""
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "runs": len(samples), "samples": samples}


def engine_steps_per_s(record: Any) -> float:
    """A run's loop rate on the engines: optimizer steps per second between each rank's first
    and last logged step (engine timestamps), averaged over ranks."""
    rows = record.history.rows()
    rates = []
    for rank in range(record.world_size):
        times = sorted(r["t"] for r in rows if r["rank"] == rank)
        rates.append((len(times) - 1) / (times[-1] - times[0]))
    return statistics.mean(rates)


def timed(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> dict[str, Any]:
    """Wall time of ``fn`` over ``repeats`` runs after ``warmup`` unmeasured ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return stats(samples)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {"kind": machine_kind(), "python": platform.python_version(),
                            "platform": platform.platform(), "cores": os.cpu_count()}
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["cpu"] = names[0] if names else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def machine_kind() -> str:
    """Name of the results file: PHALANX_MACHINE_KIND, else cores and accelerator."""
    kind = os.environ.get("PHALANX_MACHINE_KIND")
    if kind:
        return kind
    gpu = ""
    if os.path.exists("/proc/driver/nvidia/version"):
        gpu = "-gpu"
    return f"cpu{os.cpu_count()}{gpu}"


def save(section: str, data: dict[str, Any], path: str | None = None) -> Path:
    """Merge ``data`` as ``section`` into the machine's results file (or ``path``)."""
    target = Path(path) if path else RESULTS / f"{machine_kind()}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    merged = json.loads(target.read_text()) if target.exists() else {}
    merged["machine"] = machine()
    merged.setdefault("sections", {})[section] = {**data, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    target.write_text(json.dumps(merged, indent=2, sort_keys=True, default=float) + "\n")
    return target


def ratio_row(name: str, value: float, target: str, met: bool, detail: str) -> dict[str, Any]:
    """One line of the summary table."""
    return {"name": name, "ratio": value, "target": target, "met": met, "detail": detail}


def parse_args(doc: str | None, argv: list[str] | None, more: Callable[[Any], None] | None = None):
    """The options every benchmark takes (``--json OUT``, ``--quick``) and those ``more`` adds to
    the parser; also prepares engines."""
    import argparse

    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--json", default=None, help="results file (default: results/<machine>.json)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    if more is not None:
        more(parser)
    args = parser.parse_args(argv)
    engine_env()
    return args


def paired(candidate: list[float], baseline: list[float]) -> dict[str, Any]:
    """The median of the pairs' own ratios, their spread, a 95% interval of that median and
    every pair (pairs alternate which side runs first, so a slow moment of a shared machine hits
    both)."""
    ratios = [c / b for c, b in zip(candidate, baseline)]
    return {"ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "ci95": median_interval(ratios), "pairs": ratios}


def median_interval(values: list[float], resamples: int = 4000, seed: int = 0) -> list[float]:
    """A 95% bootstrap interval of the median of ``values`` (fixed seed: the same figures give
    the same interval).  A target inside it is not decided by the measurement: on a shared
    2-core machine the same code's rate moves by 10% from one run to the next.

    >>> median_interval([1.0, 1.0, 1.0])
    [1.0, 1.0]
    >>> lo, hi = median_interval([0.9, 0.95, 1.0, 1.05, 1.1, 0.97, 1.02])
    >>> 0.9 <= lo <= 1.0 <= hi <= 1.1
    True
    """
    import random

    draw = random.Random(seed)
    medians = sorted(statistics.median(draw.choices(values, k=len(values)))
                     for _ in range(resamples))
    return [medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]]


def verdict(interval: list[float], bound: float) -> bool | None:
    """A lower bound's verdict from a ratio's 95% interval: met (the whole interval is at or
    above it), not met (all of it below), or None where the interval holds the bound.

    >>> verdict([0.98, 1.05], 0.97), verdict([0.85, 0.95], 0.97), verdict([0.9, 1.02], 0.97)
    (True, False, None)
    """
    if interval[0] >= bound:
        return True
    if interval[1] < bound:
        return False
    return None
