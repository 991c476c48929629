"""GPU discovery and the one-engine-per-GPU assignment (pure decisions, no CUDA).

The kernel must never initialise CUDA (a forked or later-started engine would then hit
"CUDA already initialized"), so devices are discovered with ``nvidia-smi`` or read from
``CUDA_VISIBLE_DEVICES``, and each engine is pinned by setting its own ``CUDA_VISIBLE_DEVICES``
(its host's GPUs, :func:`host_gpu_order`) and ``PHALANX_GPU`` (its own) before anything in it
touches CUDA (:func:`~phalanx.runtime.run._device_rule.pinning_env`).

Example::

    >>> assign_devices(parse_gpu_spec("auto"), ["a", "a", "b"], {"a": ["0", "1"], "b": ["0"]})
    ['0', '1', '0']
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..runtime import pinning_env

__all__ = ["GpuSpec", "GpuSpecError", "parse_gpu_spec", "visible_gpus", "default_engine_count",
           "assign_devices", "host_gpu_order", "pinning_env"]


class GpuSpecError(ValueError):
    """A ``--gpus`` value that cannot be satisfied."""


@dataclass(frozen=True)
class GpuSpec:
    """What the user asked for: ``auto`` (one per GPU if any), ``none`` or explicit indices."""

    mode: str  # "auto" | "none" | "list"
    indices: tuple[str, ...] = ()


def parse_gpu_spec(text: str | None) -> GpuSpec:
    """Parse ``--gpus``: ``auto``, ``none`` or a comma list of device indices like ``0,1``.

    Example::

        >>> parse_gpu_spec("0, 2").indices
        ('0', '2')
    """
    value = (text or "auto").strip().lower()
    if value in ("auto", "none"):
        return GpuSpec(value)
    parts = [p.strip() for p in value.split(",")]
    if not parts or any(not p.isdigit() for p in parts):
        raise GpuSpecError(
            f"--gpus {text!r} is not valid: use 'auto', 'none' or device indices such as '0,1'")
    if len(set(parts)) != len(parts):
        raise GpuSpecError(f"--gpus {text!r} lists a device twice: each engine needs its own GPU")
    return GpuSpec("list", tuple(parts))


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """Device ids this host lets us use, without initialising CUDA.

    ``CUDA_VISIBLE_DEVICES`` wins when set (its entries are what engines must be given);
    otherwise ``nvidia-smi`` is asked; no driver means no GPUs.
    """
    env = os.environ if environ is None else environ
    preset = env.get("CUDA_VISIBLE_DEVICES")
    if preset is not None:
        return [d.strip() for d in preset.split(",") if d.strip() and d.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def default_engine_count(spec: GpuSpec, gpus: Sequence[str]) -> int:
    """Default ``-n``: one engine per usable GPU, else 2 CPU engines."""
    if spec.mode == "list":
        return len(spec.indices)
    if spec.mode == "auto" and gpus:
        return len(gpus)
    return 2


def assign_devices(spec: GpuSpec, hosts: Sequence[str],
                   visible: Mapping[str, Sequence[str]]) -> list[str | None]:
    """Give engine ``i`` (running on ``hosts[i]``) a device id on its own host, or ``None`` (CPU).

    Engines on one host get distinct devices in order of rank (host-local index).  Raises
    :class:`GpuSpecError` when the request cannot be met, before anything is started.
    """
    if spec.mode == "none":
        return [None] * len(hosts)
    result: list[str | None] = []
    used: dict[str, int] = {}
    for host in hosts:
        local = used.get(host, 0)
        used[host] = local + 1
        devices = list(visible.get(host, ()))
        if spec.mode == "auto":
            if not devices:
                result.append(None)
                continue
            if local >= len(devices):
                raise GpuSpecError(
                    f"{used[host]} engines on host {host} but it has {len(devices)} GPU(s) "
                    f"({', '.join(devices)}): start at most {len(devices)} there, or use "
                    "--gpus none for CPU engines")
            result.append(devices[local])
            continue
        missing = [i for i in spec.indices if i not in devices]
        if missing:
            shown = ", ".join(devices) if devices else "none"
            raise GpuSpecError(
                f"--gpus asks for device(s) {', '.join(missing)} but host {host} has: {shown}")
        if local >= len(spec.indices):
            raise GpuSpecError(
                f"{used[host]} engines on host {host} but --gpus lists only "
                f"{len(spec.indices)} device(s): pass -n {len(spec.indices)} or list more devices")
        result.append(spec.indices[local])
    return result


def host_gpu_order(spec: GpuSpec, devices: Sequence[str]) -> list[str]:
    """The GPUs a host's engines see, in the order they take them (``devices``: the host's).

    Every engine of the host sees this same list, so the one with ``LOCAL_RANK`` k owns its
    k-th entry (see :mod:`phalanx.runtime.run._device_rule`).

    Example::

        >>> host_gpu_order(parse_gpu_spec("2,0"), ["0", "1", "2"])
        ['2', '0']
    """
    if spec.mode == "none":
        return []
    return list(spec.indices) if spec.mode == "list" else list(devices)
