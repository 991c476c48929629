"""A run's telemetry on the kernel's side: the metric stream's receiving end, every row kept
(history, column chunks on disk), curves at bounded size (digest, M4 downsampling), per-rank
progress, step parts, timing and memory, profiles, the run's record and the run log on disk.

The views read telemetry through the names below, never this package's modules: a new figure
is added here (and measured in :mod:`phalanx.runtime.telemetry`).  The names load on first use:
most of them import numpy, and the views' modules are imported before any run.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._digest import window_points as window_points
    from ._downsample import M4Stream as M4Stream
    from ._downsample import downsample as downsample
    from ._durations import fmt_duration as fmt_duration
    from ._durations import fmt_wall as fmt_wall
    from ._step_parts import PART_NAMES as PART_NAMES
    from ._step_parts import breakdown_text as breakdown_text
    from ._step_parts import part_label as part_label

_PUBLIC = {"window_points": "._digest", "M4Stream": "._downsample", "downsample": "._downsample",
           "fmt_duration": "._durations", "fmt_wall": "._durations",
           "PART_NAMES": "._step_parts", "breakdown_text": "._step_parts",
           "part_label": "._step_parts"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)
