"""Cluster layer: ipyparallel processes, dense ranks and GPU pinning."""

from ._gpus import GpuSpecError, assign_devices, parse_gpu_spec, visible_gpus
from ._launchers import LAUNCHERS, ClusterError
from ._manager import ClusterManager, EngineSlot
from ._procs import memory_mb, on_this_host

__all__ = ["ClusterManager", "EngineSlot", "ClusterError", "GpuSpecError", "LAUNCHERS",
           "assign_devices", "memory_mb", "on_this_host", "parse_gpu_spec", "visible_gpus"]
