"""Functions shipped to engines to identify and pin them (must import nothing heavy).

They run inside ipyparallel engines through ``apply``; they only touch ``os``, ``socket`` and
:mod:`._locality` so that probing never imports torch (and never initialises CUDA) in an engine.
"""

from __future__ import annotations


def identify_engine(controller_ip: str | None = None) -> dict:
    """Who am I: slot, host, machine identity, address, pid, MPI rank and device pinning.

    The address is this engine's source address on the route to ``controller_ip`` (the
    kernel's host), which is where peers on that network reach it.  ``PHALANX_HOST`` /
    ``PHALANX_ADDRESS`` in the engine's environment override the host name and the address
    (for engines started by hand in a container or namespace).
    """
    import os
    import socket

    from phalanx.cluster._gpus import visible_gpus
    from phalanx.cluster._locality import machine_identity, route_address

    env = os.environ
    mpi_rank = env.get("PMI_RANK") or env.get("OMPI_COMM_WORLD_RANK") or env.get("PMIX_RANK")
    local_rank = (env.get("MPI_LOCALRANKID") or env.get("OMPI_COMM_WORLD_LOCAL_RANK")
                  or env.get("SLURM_LOCALID"))
    host = env.get("PHALANX_HOST") or socket.gethostname()
    address = env.get("PHALANX_ADDRESS")
    if not address:
        try:
            address = route_address(controller_ip or "127.0.0.1")
        except OSError:
            address = "127.0.0.1"
    return {
        "slot": env.get("PHALANX_SLOT", ""),
        "set": env.get("PHALANX_SET", ""),
        "host": host,
        "machine": machine_identity(),
        "address": address,
        "pid": os.getpid(),
        "mpi_rank": int(mpi_rank) if mpi_rank is not None else None,
        "local_rank": int(local_rank) if local_rank is not None else None,
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "gpus": visible_gpus(),  # this host's devices, for host-local pinning
    }


def pin_engine(slot: str, device: str | None, visible: str = "") -> str:
    """Pin this engine to ``device`` among ``visible`` (its host's GPUs, comma-separated; just
    ``device`` if empty) before anything in it initialises CUDA.

    Used for launchers whose engines share one environment (MPI, batch systems); local engines
    get their ``CUDA_VISIBLE_DEVICES`` at launch instead.
    """
    import os
    import sys

    from phalanx.runtime import pinning_env

    if "torch" in sys.modules and getattr(sys.modules["torch"], "cuda", None) is not None:
        if sys.modules["torch"].cuda.is_initialized():
            raise RuntimeError("CUDA was initialised in this engine before phalanx could pin it")
    os.environ["PHALANX_SLOT"] = slot
    os.environ.update(pinning_env(device, [d for d in visible.split(",") if d]))
    return os.environ["CUDA_VISIBLE_DEVICES"]


def warm_up() -> bool:
    """Import what the first training cell needs, while the user is still typing.

    Sent without waiting right after engines register, so the first ``%%distributed_fit``
    does not pay for importing torch.  Importing torch does not initialise CUDA.  Tasks run in
    order on an engine, so the run's first call there (the version check) waits for this: a
    restarted rank is not caught importing while its peers wait for it in a collective (an
    interrupt there would leave a half-imported module behind).
    """
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (an optimizer's first param group imports it: seconds)
    import torch.distributed  # noqa: F401

    import phalanx.runtime

    phalanx.runtime.run_cell  # loads the run's modules  # noqa: B018
    return True
