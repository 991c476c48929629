"""Cluster layer: ipyparallel processes, dense ranks and GPU pinning."""

from ._errors import ClusterError
from ._gpus import GpuSpecError, assign_devices, parse_gpu_spec, visible_gpus
from ._launchers import LAUNCHERS, Launcher, LaunchOptions
from ._manager import ClusterManager, EngineSlot
from ._locality import is_local
from ._procs import memory_mb

__all__ = ["ClusterManager", "EngineSlot", "ClusterError", "GpuSpecError", "LAUNCHERS", "Launcher",
           "LaunchOptions",
           "assign_devices", "is_local", "memory_mb", "parse_gpu_spec", "visible_gpus"]
